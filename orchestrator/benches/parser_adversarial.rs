//! Scaffold parser on hostile model output: time per parse, peak heap during the parse (a
//! counting global allocator) and the bytes of text the result holds, for nested unclosed
//! `<call_tool>` (4,000 in 128 KB; 5,000 in 200 KB; 50,000 in 2 MB to show the scaling, where the
//! previous parser would hold ~50 GB of queries), 100k stray closing tags (alone and under a deep
//! stack of unclosed tags), nested closed and unclosed `<cite>` in an answer, unterminated quoted
//! attributes, and realistic trajectories for regression (one, and 400 for throughput).
//!
//! Run: cargo bench -p orchestrator --bench parser_adversarial [-- MAX_SECONDS_PER_INPUT]
#![allow(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "benchmark code fails loudly"
)]
#![allow(
    unsafe_code,
    reason = "a counting global allocator (bench only) measures the parser's peak heap"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use orchestrator::domain::scaffold::parse;

/// Counts live heap bytes and their high-water mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the caller's layout; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                    + (new_size - layout.size());
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `count` copies of `unit(k)`, each padded with query words to `total / count` bytes.
fn repeated(count: usize, total: usize, unit: impl Fn(usize) -> String) -> String {
    let each = total / count;
    let mut s = String::with_capacity(total);
    for k in 0..count {
        let start = s.len();
        let tag = unit(k);
        s.push_str(&tag);
        let target = start + each.max(tag.len());
        let words = ["tn5 ", "transposase ", "mechanism ", "atac "];
        let mut w = 0;
        while s.len() < target {
            s.push_str(words[(k + w) % words.len()]);
            w += 1;
        }
        s.truncate(target);
    }
    s
}

fn nested_call_tool(count: usize, total: usize) -> String {
    repeated(count, total, |_| {
        "<call_tool name=\"google_search\">".to_string()
    })
}

fn stray_closers(count: usize) -> String {
    const CLOSERS: &[&str] = &[
        "</call_tool>",
        "</think>",
        "</answer>",
        "</cite>",
        "</review>",
    ];
    (0..count).map(|k| CLOSERS[k % CLOSERS.len()]).collect()
}

/// 50k unclosed `<think>` then 100k `</answer>` that match none of them.
fn stray_closers_under_open_tags() -> String {
    let mut s = "<think>".repeat(50_000);
    s.push_str(&"</answer>".repeat(100_000));
    s
}

/// An answer holding `n` nested `<cite>`, closed (`n` closers at the end) or not.
fn nested_cites(n: usize, closed: bool) -> String {
    let mut s = String::from("<answer>");
    for k in 0..n {
        s.push_str(&format!("<cite id=\"S{k}\">claim {k} "));
    }
    if closed {
        s.push_str(&"</cite>".repeat(n));
    }
    s
}

/// Every kind that is extracted for each element, nested unclosed, in 200 KB.
fn nested_mixed(total: usize) -> String {
    let mut s = String::from("<structured_plan><rubric>- a\n</rubric></structured_plan>");
    while s.len() < total / 2 {
        s.push_str("<call_tool name=\"google_search\">q <state_evaluation>e ");
    }
    s.push_str("<answer>");
    while s.len() < total {
        s.push_str("<cite id=\"S1\">c ");
    }
    s
}

/// Recognised tags whose quoted attribute never ends: each scan runs to the tag length limit.
fn unterminated_quotes(total: usize) -> String {
    let mut s = String::new();
    while s.len() < total {
        s.push_str("<cite id=\"");
        s.push_str(&"<cite x ".repeat(600));
    }
    s
}

fn trajectory(seed: usize) -> String {
    let filler = |n: usize| -> String {
        (0..n)
            .map(|i| {
                [
                    "evidence ",
                    "suggests ",
                    "that ",
                    "Tn5 ",
                    "transposase ",
                    "inserts ",
                    "adapters; ",
                ][(i + seed) % 7]
            })
            .collect()
    };
    let mut s = format!(
        "<think>{}</think>\n<structured_plan>\n<deep_analysis>{}</deep_analysis>\n<rubric>\nKnowledge checklist:\n- {}\n- {}\nNegative constraints:\n- {}\n</rubric>\n<research_plan>{}</research_plan>\n</structured_plan>\n",
        filler(120),
        filler(80),
        filler(10),
        filler(10),
        filler(10),
        filler(60)
    );
    for k in 0..10 {
        s.push_str(&format!(
            "<call_tool name=\"google_search\" gl=\"us\">query {k} {}</call_tool>\n<think>{}</think>\n<state_evaluation>{}</state_evaluation>\n",
            filler(6), filler(90), filler(40)
        ));
    }
    s.push_str(&format!(
        "<think>{}</think><review><rubric_review>{}</rubric_review><writing_plan>{}</writing_plan></review>\n<answer>",
        filler(60), filler(80), filler(60)
    ));
    for k in 0..30 {
        s.push_str(&format!(
            "{} <cite id=\"S{k}, S{}\">{}</cite>. ",
            filler(30),
            k + 1,
            filler(12)
        ));
    }
    s.push_str("</answer>");
    s
}

fn main() {
    let max_s: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2.0);
    let inputs: Vec<(&str, String)> = vec![
        (
            "nested unclosed <call_tool> x4,000, 128 KB",
            nested_call_tool(4_000, 128 * 1024),
        ),
        (
            "nested unclosed <call_tool> x5,000, 200 KB",
            nested_call_tool(5_000, 200 * 1024),
        ),
        (
            "nested unclosed <call_tool> x50,000, 2 MB",
            nested_call_tool(50_000, 2_000_000),
        ),
        ("100k stray closing tags", stray_closers(100_000)),
        (
            "100k stray closers under 50k open <think>",
            stray_closers_under_open_tags(),
        ),
        ("nested closed <cite> x8,000", nested_cites(8_000, true)),
        ("nested unclosed <cite> x8,000", nested_cites(8_000, false)),
        ("nested mixed kinds, 200 KB", nested_mixed(200 * 1024)),
        (
            "unterminated quotes, 200 KB",
            unterminated_quotes(200 * 1024),
        ),
        ("realistic trajectory", trajectory(3)),
    ];
    // Regression on ordinary text: throughput over 400 realistic trajectories (~11 MB).
    let docs: Vec<String> = (0..400).map(trajectory).collect();
    let mb = docs.iter().map(String::len).sum::<usize>() as f64 / 1e6;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        for d in &docs {
            std::hint::black_box(parse(d, &|id| id.len() < 3));
        }
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!(
        "400 realistic trajectories, {mb:.1} MB: {:.1} MB/s (best of 3)",
        mb / best
    );
    println!(
        "{:<44} {:>9} {:>8} {:>11} {:>13} {:>13} {:>7} {:>7}",
        "input", "bytes", "reps", "ms/parse", "peak heap KB", "held text KB", "calls", "issues"
    );
    for (name, text) in &inputs {
        // Peak heap of one parse above what was live before it.
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let t0 = Instant::now();
        let p = parse(text, &|id| id.len() < 3);
        let first = t0.elapsed().as_secs_f64();
        let peak = PEAK.load(Ordering::Relaxed) - base;
        let held = p.held_text();
        let (calls, issues) = (p.tool_calls.len(), p.issues.len());
        drop(p);
        // Time: best of up to 5 more runs within the time allowance.
        let mut best = first;
        let mut reps = 1;
        let t_all = Instant::now();
        while reps < 6 && t_all.elapsed().as_secs_f64() + best < max_s {
            let t0 = Instant::now();
            let p = parse(text, &|id| id.len() < 3);
            best = best.min(t0.elapsed().as_secs_f64());
            std::hint::black_box(&p);
            reps += 1;
        }
        println!(
            "{:<44} {:>9} {:>8} {:>11.3} {:>13} {:>13} {:>7} {:>7}",
            name,
            text.len(),
            reps,
            best * 1e3,
            peak / 1024,
            held / 1024,
            calls,
            issues
        );
    }
}
