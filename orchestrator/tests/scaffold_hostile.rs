//! The scaffold parser on hostile model output: nested unclosed `<call_tool>` at 200 KB parses
//! within a memory bound (peak heap of the parsing thread, counted by the test's allocator), 100k
//! stray closing tags parse in linear time, the cut rules (an unclosed element's text ends at the
//! next opening tag of its kind, or after `MAX_UNCLOSED_TEXT` bytes) leave ordinary malformed
//! output as it was, and a bounded property test: arbitrary and adversarial inputs never panic,
//! element ranges are in bounds and ordered, and the extracted text is bounded by a constant
//! factor of the input.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
#![allow(
    unsafe_code,
    reason = "a counting global allocator measures the parser's peak heap"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use orchestrator::domain::scaffold::{
    MAX_UNCLOSED_TEXT, ParseIssue, Scaffold, elements, parse, parse_as,
};
use proptest::prelude::*;

// ---- Peak heap of one thread ----------------------------------------------------------------

/// Counts the heap bytes each thread allocates and frees, and their high-water mark, so tests
/// running side by side do not see each other's allocations.
struct PerThread;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    let _ = LIVE.try_with(|l| {
        let now = l.get() + delta;
        l.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

// SAFETY: every call forwards to `System` with the caller's layout; the counters only observe
// (const-initialised thread-locals without destructors: no allocation, no reentry).
unsafe impl GlobalAlloc for PerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: PerThread = PerThread;

/// Run `f` and return its result with the most heap this thread held above where it started.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    let peak = PEAK.with(Cell::get) - base;
    (out, peak.max(0) as usize)
}

/// `count` unclosed `<call_tool>`, each followed by query words, in `total` bytes.
fn nested_call_tools(count: usize, total: usize) -> String {
    let each = total / count;
    let mut s = String::with_capacity(total);
    for _ in 0..count {
        let start = s.len();
        s.push_str("<call_tool name=\"google_search\">");
        while s.len() < start + each {
            s.push_str("tn5 transposase ");
        }
        s.truncate(start + each.max(32));
    }
    s
}

// ---- The issue's inputs ---------------------------------------------------------------------

/// 5,000 nested unclosed `<call_tool>` in 200 KB: each took the rest of the text as its query,
/// ~490 MB of queries. Now each query ends where the next call opens.
#[test]
fn nested_unclosed_call_tools_at_200_kb_parse_within_a_memory_bound() {
    let text = nested_call_tools(5_000, 200_000);
    assert!(text.len() >= 200_000);
    let (p, peak) = peak_heap(|| parse(&text, &|_| true));
    // The tree, the lexemes, the issues and the result: tens of bytes per input byte at worst
    // (measured ~5 MB here; 508 MB before), never a copy of the text per call.
    assert!(
        peak < 32 << 20,
        "peak heap {peak} B for {} B of input",
        text.len()
    );
    let held = p.held_text();
    assert!(
        held <= text.len(),
        "held {held} B of text for {} B",
        text.len()
    );
    assert_eq!(p.tool_calls.len(), 5_000);
    assert!(p.tool_calls.iter().all(|t| !t.closed));
    assert_eq!(p.tool_calls[0].query, p.tool_calls[1].query);
    assert!(
        p.tool_calls[0].query.len() < 40,
        "{}",
        p.tool_calls[0].query
    );
    // The same input as the DR Tulu scaffold reads it.
    let (p, peak) = peak_heap(|| parse_as(Scaffold::Drtulu, &text, &|_| true));
    assert_eq!(p.tool_calls.len(), 5_000);
    assert!(peak < 32 << 20, "peak heap {peak} B");
}

/// 100k stray closing tags, alone and under 50k unclosed elements of another kind (each closer
/// scanned every open element: seconds in a release build).
#[test]
fn one_hundred_thousand_stray_closing_tags_parse_in_linear_time() {
    let closers = [
        "</call_tool>",
        "</think>",
        "</answer>",
        "</cite>",
        "</review>",
    ];
    let stray: String = (0..100_000).map(|k| closers[k % closers.len()]).collect();
    let t0 = Instant::now();
    let p = parse(&stray, &|_| true);
    let alone = t0.elapsed();
    assert_eq!(p.issues.len(), 100_000);
    assert!(
        p.issues
            .iter()
            .all(|i| matches!(i, ParseIssue::StrayClose { .. }))
    );

    let mut deep = "<think>".repeat(50_000);
    deep.push_str(&"</answer>".repeat(100_000));
    let t0 = Instant::now();
    let p = parse(&deep, &|_| true);
    let under = t0.elapsed();
    assert_eq!(p.issues.len(), 150_000);
    let strays = p
        .issues
        .iter()
        .filter(|i| matches!(i, ParseIssue::StrayClose { .. }))
        .count();
    assert_eq!(strays, 100_000);
    // Milliseconds in a release build; generous for an unoptimised build on a shared machine.
    let bound = Duration::from_secs(5);
    assert!(alone < bound && under < bound, "{alone:?}, {under:?}");
}

/// Every occurrence-read kind nested without closing tags, and nested with them: the extracted
/// text stays within the input's size.
#[test]
fn nested_cites_and_state_evaluations_extract_linear_text() {
    let n = 4_000;
    let mut closed = String::from("<answer>");
    for k in 0..n {
        closed.push_str(&format!("<cite id=\"S{k}\">claim {k} "));
    }
    closed.push_str(&"</cite>".repeat(n));
    closed.push_str("</answer>");
    let p = parse(&closed, &|_| true);
    let held = p.held_text();
    assert!(
        held <= 2 * closed.len(),
        "held {held} B for {} B",
        closed.len()
    );
    assert_eq!(p.citations.len(), n);
    let claim = &p.citations[7].claim;
    assert!(claim == "claim 7", "claim of {} B", claim.len());

    let evals = "<state_evaluation>covered ".repeat(n);
    let p = parse(&evals, &|_| true);
    assert_eq!(p.state_evaluations.len(), n);
    assert!(p.state_evaluations.iter().all(|e| e == "covered"));
}

// ---- Ordinary output keeps its parse --------------------------------------------------------

#[test]
fn the_cut_rules_keep_ordinary_malformed_output_as_it_was() {
    // An unclosed call before a closed one: each query is its own (the engine runs the last).
    let t = "<call_tool name=\"google_search\">first <call_tool name=\"browse\">second</call_tool>";
    let p = parse(t, &|_| true);
    assert_eq!(p.tool_calls.len(), 2);
    assert_eq!(p.tool_calls[0].query, "first");
    assert!(!p.tool_calls[0].closed);
    assert_eq!(p.tool_calls[1].query, "second");
    assert_eq!(p.tool_calls[1].name, "browse_webpage");
    assert!(p.tool_calls[1].closed);
    // The tree is unchanged: the unclosed call still spans to the end of the text.
    assert_eq!(p.tool_calls[0].span, 0..t.len());

    // A forced `<answer>` followed by the model's own answer: the answer is read as before
    // (everything after the first `<answer>`), not cut at the second.
    let t = "<think>x</think>\n<answer>\n<answer>It is 42.</answer>";
    let p = parse_as(Scaffold::Drtulu, t, &|_| true);
    assert_eq!(p.answer.as_deref(), Some("<answer>It is 42.</answer>"));
    assert!(!p.answer_closed);

    // An unclosed state evaluation runs to the end of the text as before.
    let t = "<state_evaluation>mechanism covered <think>next</think>";
    let p = parse(t, &|_| true);
    assert_eq!(
        p.state_evaluations,
        ["mechanism covered <think>next</think>"]
    );
}

#[test]
fn an_unclosed_element_reads_at_most_the_bound() {
    // The bound falls inside a two-byte char: the text is cut at the char boundary before it.
    let mut t = String::from("<answer>");
    t.push('x');
    while t.len() < "<answer>".len() + MAX_UNCLOSED_TEXT + 1024 {
        t.push('é');
    }
    let p = parse(&t, &|_| true);
    let answer = p.answer.unwrap();
    assert!(!p.answer_closed);
    assert_eq!(answer.len(), MAX_UNCLOSED_TEXT - 1);
    let mut t = String::from("<call_tool name=\"google_search\">");
    t.push_str(&"q".repeat(MAX_UNCLOSED_TEXT + 10));
    let p = parse(&t, &|_| true);
    assert_eq!(p.tool_calls[0].query.len(), MAX_UNCLOSED_TEXT);
    // A closed element is read whole.
    t.push_str("</call_tool>");
    let p = parse(&t, &|_| true);
    assert_eq!(p.tool_calls[0].query.len(), MAX_UNCLOSED_TEXT + 10);
}

// ---- Properties -----------------------------------------------------------------------------

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("<structured_plan>".to_string()),
        Just("</structured_plan>".to_string()),
        Just("<deep_analysis>".to_string()),
        Just("<rubric>- a\n".to_string()),
        Just("</rubric>".to_string()),
        Just("<call_tool name=\"google_search\" limit=\"5\">".to_string()),
        Just("<call_tool name='fetch'>".to_string()),
        Just("</call_tool>".to_string()),
        Just("</call>".to_string()),
        Just("<review>".to_string()),
        Just("<rubric_review>".to_string()),
        Just("</review>".to_string()),
        Just("<answer>".to_string()),
        Just("</answer>".to_string()),
        Just("<cite id=\"a,b,c\">".to_string()),
        Just("<cite id=\"a\"/>".to_string()),
        Just("</cite>".to_string()),
        Just("<state_evaluation>".to_string()),
        Just("</state_evaluation>".to_string()),
        Just("\\boxed{".to_string()),
        Just("&amp;&#x10FFFF;&bogus;".to_string()),
        Just("<cite id=\"".to_string()),
        Just("<".to_string()),
        Just("\"".to_string()),
        Just("é日\u{0}".to_string()),
        "[a-z <>/&\"'=]{0,12}",
        any::<String>(),
    ]
}

/// A fragment, or one repeated many times (nesting hundreds deep), with text between.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => fragment(),
        1 => (fragment(), 1usize..200, "[a-z ]{0,8}")
            .prop_map(|(f, n, filler)| format!("{f}{filler}").repeat(n)),
    ]
}

fn check_tree(text: &str) -> Result<(), TestCaseError> {
    let (elems, issues) = elements(text);
    let len = text.len();
    let mut last_open = None;
    for (i, e) in elems.iter().enumerate() {
        let b = |x: usize| x <= len && text.is_char_boundary(x);
        prop_assert!(b(e.open.start) && b(e.open.end) && e.open.start < e.open.end);
        prop_assert!(b(e.content.start) && b(e.content.end));
        prop_assert_eq!(e.content.start, e.open.end);
        prop_assert!(e.content.start <= e.content.end);
        if let Some(c) = &e.close {
            prop_assert!(b(c.start) && b(c.end));
            prop_assert!(e.content.end == c.start && c.start <= c.end);
        }
        // Document order, no two elements open at the same byte.
        prop_assert!(last_open.is_none_or(|l| l < e.open.start));
        last_open = Some(e.open.start);
        match e.parent {
            Some(p) => {
                prop_assert!(p < i);
                let parent = &elems[p];
                prop_assert_eq!(e.depth, parent.depth + 1);
                prop_assert!(e.open.start >= parent.content.start);
                prop_assert!(e.outer().end <= parent.content.end);
            }
            None => prop_assert_eq!(e.depth, 0),
        }
    }
    for i in &issues {
        let at = match i {
            ParseIssue::Unclosed { at, .. } | ParseIssue::StrayClose { at, .. } => *at,
        };
        prop_assert!(at < len);
    }
    Ok(())
}

fn check_parse(text: &str) -> Result<(), TestCaseError> {
    let len = text.len();
    let p = parse(text, &|id| id == "a");
    let s = &p.stage_spans;
    prop_assert_eq!(s[0].start, 0);
    prop_assert_eq!(s[3].end, len);
    for k in 0..3 {
        prop_assert_eq!(s[k].end, s[k + 1].start);
    }
    let mut last = 0;
    for t in &p.tool_calls {
        prop_assert!(t.span.start >= last && t.span.start < t.span.end && t.span.end <= len);
        last = t.span.start + 1;
    }
    // Texts read at every occurrence never overlap: each kind totals at most the input.
    let queries: usize = p.tool_calls.iter().map(|t| t.query.len()).sum();
    let evals: usize = p.state_evaluations.iter().map(String::len).sum();
    let claims: usize = p.citations.iter().map(|c| c.claim.len()).sum();
    prop_assert!(queries <= len && evals <= len && claims <= len);
    // Everything extracted: a constant factor of the input.
    let held = p.held_text();
    prop_assert!(held <= 16 * len + 64, "held {} for {} bytes", held, len);
    let d = parse_as(Scaffold::Drtulu, text, &|_| false);
    prop_assert_eq!(d.stage_spans[3].end, len);
    Ok(())
}

proptest! {
    // Bounded so it runs in seconds in CI (debug build).
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn adversarial_inputs_never_panic_and_stay_bounded(
        pieces in proptest::collection::vec(piece(), 0..24)
    ) {
        let text: String = pieces.concat();
        check_tree(&text)?;
        check_parse(&text)?;
    }

    #[test]
    fn arbitrary_text_never_panics_and_stays_bounded(
        bytes in proptest::collection::vec(any::<u8>(), 0..4096)
    ) {
        let text = String::from_utf8_lossy(&bytes);
        check_tree(&text)?;
        check_parse(&text)?;
    }
}
