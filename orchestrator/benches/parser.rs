//! Scaffold parser throughput in MB/s on realistic trajectories (plan, 10 research turns, review,
//! cited answer; ~25 KB each). Reference, side by side: quick-xml's raw event reader scanning the
//! same text wrapped in a root element (no tree, no extraction; it only works here because the
//! generated text is well-formed, which model output usually is not).
//!
//! Run: cargo bench -p orchestrator --bench parser [-- TRAJECTORIES]
#![allow(
    clippy::unwrap_used,
    clippy::print_stdout,
    reason = "benchmark code fails loudly"
)]

use std::time::Instant;

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
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(400);
    let docs: Vec<String> = (0..n).map(trajectory).collect();
    let bytes: usize = docs.iter().map(String::len).sum();
    let mb = bytes as f64 / 1e6;

    let mut best_ours = f64::MAX;
    let mut checksum = 0usize;
    for _ in 0..3 {
        let t0 = Instant::now();
        for d in &docs {
            let p = orchestrator::domain::scaffold::parse(d, &|id| id.len() < 3);
            checksum += p.tool_calls.len() + p.citations.len();
        }
        best_ours = best_ours.min(t0.elapsed().as_secs_f64());
    }
    let wrapped: Vec<String> = docs.iter().map(|d| format!("<root>{d}</root>")).collect();
    let mut best_ref = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        for d in &wrapped {
            let mut r = quick_xml::Reader::from_str(d);
            loop {
                match r.read_event() {
                    Ok(quick_xml::events::Event::Eof) | Err(_) => break,
                    Ok(_) => checksum += 1,
                }
            }
        }
        best_ref = best_ref.min(t0.elapsed().as_secs_f64());
    }
    println!("scaffold parser: {n} trajectories, {mb:.1} MB, best of 3 (checksum {checksum})");
    println!("{:>34} {:>10}", "", "MB/s");
    println!(
        "{:>34} {:>10.1}",
        "scaffold::parse (ours, full extraction)",
        mb / best_ours
    );
    println!(
        "{:>34} {:>10.1}",
        "quick-xml raw events (reference)",
        mb / best_ref
    );
    println!("ratio ours / reference: {:.2}", best_ref / best_ours);
}
