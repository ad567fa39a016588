//! browse_webpage's excerpt selection on a 2 MB page with a long query (issue 24's probe: 12-24 s
//! and up to 2.7 GB before). Reference, side by side: the previous algorithm (per-term scan of
//! a `Vec<char>` copy of the lower-cased page), kept here only as the yardstick.
//!
//! Run: cargo bench -p orchestrator --bench browse_window [-- QUERY_WORDS]
#![allow(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "benchmark code fails loudly"
)]

use std::time::Instant;

use orchestrator::infra::tools::browse::focus_window;

/// The previous `focus_window` (this project's own earlier code).
fn reference(text: &str, query: &str, width: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= width {
        return text.to_string();
    }
    let terms: Vec<String> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .map(str::to_lowercase)
        .collect();
    let lower: String = text.to_lowercase();
    let lchars: Vec<char> = lower.chars().collect();
    let mut hits: Vec<usize> = Vec::new();
    if lchars.len() == chars.len() {
        for t in &terms {
            let tc: Vec<char> = t.chars().collect();
            for i in 0..lchars.len().saturating_sub(tc.len()) {
                if lchars[i..i + tc.len()] == tc[..] {
                    hits.push(i);
                }
            }
        }
    }
    hits.sort_unstable();
    let mut best = (0usize, 0usize);
    let mut lo = 0;
    for hi in 0..hits.len() {
        while hits[hi] - hits[lo] > width {
            lo += 1;
        }
        if hi + 1 - lo > best.1 {
            best = (hits[lo], hi + 1 - lo);
        }
    }
    let start = best.0.saturating_sub(width / 10);
    chars[start..(start + width).min(chars.len())]
        .iter()
        .collect()
}

fn main() {
    let words: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(400);
    let line =
        "the study reports evidence that transposase activity depends on buffer conditions\n";
    let mut page = line.repeat(2_000_000 / line.len());
    page.push_str("Tn5 tagmentation inserts adapters.\n");
    let vocab = [
        "the",
        "study",
        "evidence",
        "transposase",
        "buffer",
        "activity",
        "reports",
    ];
    let query: String = (0..words)
        .map(|i| format!("{}{} ", vocab[i % vocab.len()], i / vocab.len()))
        .chain(["tn5 tagmentation adapters".to_string()])
        .collect();
    let time = |f: &dyn Fn() -> String| {
        let t0 = Instant::now();
        let out = f();
        (t0.elapsed().as_secs_f64(), out)
    };
    let (new_s, a) = time(&|| focus_window(&page, &query, 6000));
    let (ref_s, b) = time(&|| reference(&page, &query, 6000));
    println!(
        "page {} bytes, query {} words: focus_window {:.3} s, reference {:.3} s, ratio {:.1}x \
         (excerpts {} / {} chars)",
        page.len(),
        words,
        new_s,
        ref_s,
        ref_s / new_s.max(1e-9),
        a.chars().count(),
        b.chars().count()
    );
}
