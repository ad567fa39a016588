//! Benchmark rubric data from ../shared/data scored with the project's rules: HealthBench-style
//! points rubrics (penalties, clipping to [0, 1]) through the lexical judge, and DeepResearch
//! Bench criteria weighting (dimension and criterion weights, RACE's relative score).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code fails loudly"
)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use orchestrator::domain::eval::{drbench, healthbench};
use orchestrator::domain::judge::lexical::LexicalJudge;
use orchestrator::domain::judge::{Judge, ScoreMode, TraceView};

fn shared(rel: &str) -> PathBuf {
    std::env::var("SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"))
        .join(rel)
}

#[tokio::test]
async fn healthbench_rows_parse_and_score_through_the_lexical_judge() {
    let rows =
        healthbench::load(&shared("healthbench_rubrics/sft_train_rubric_writer.jsonl")).unwrap();
    assert_eq!(rows.len(), 1329);
    assert!(
        rows.iter()
            .all(|r| !r.items.is_empty() && !r.question.is_empty())
    );
    let with_penalty = rows
        .iter()
        .filter(|r| r.items.iter().any(|i| i.points < 0.0))
        .count();
    assert!(
        with_penalty > 100,
        "{with_penalty} rows have negative criteria"
    );

    let judge = LexicalJudge::new("lexical-v1");
    let (mut full_sum, mut n) = (0.0, 0);
    for row in rows.iter().take(200) {
        let rubrics = healthbench::to_rubrics(&row.items);
        // A response that says exactly what the positive items ask for, and one that says nothing.
        let good = TraceView {
            answer: Some(
                row.items
                    .iter()
                    .filter(|i| i.points > 0.0)
                    .map(|i| i.item.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            ..TraceView::default()
        };
        let empty = TraceView {
            answer: Some(String::new()),
            ..TraceView::default()
        };
        let met = |s: &orchestrator::domain::judge::Scoring| -> Vec<f64> {
            s.scores.iter().map(|x| f64::from(x.score) / 2.0).collect()
        };
        let g = judge
            .score(&row.question, &good, &rubrics, ScoreMode::AnswerOnly)
            .await
            .unwrap();
        let e = judge
            .score(&row.question, &empty, &rubrics, ScoreMode::AnswerOnly)
            .await
            .unwrap();
        let sg = healthbench::score(&row.items, &met(&g));
        let se = healthbench::score(&row.items, &met(&e));
        assert!((0.0..=1.0).contains(&sg), "{}: {sg}", row.id);
        assert_eq!(se, 0.0, "{}: an empty answer meets nothing", row.id);
        // Every positive item is met in full; only penalties shared in wording can cost points.
        for (it, s) in row.items.iter().zip(&g.scores) {
            if it.points > 0.0 {
                assert_eq!(s.score, 2, "{}: {:?}", row.id, it.item);
            }
        }
        full_sum += sg;
        n += 1;
    }
    let mean = full_sum / f64::from(n);
    assert!(mean > 0.5, "mean score of on-rubric answers {mean}");
}

#[test]
fn deep_research_bench_criteria_load_validate_and_weight() {
    let tasks = drbench::load(&shared("deep_research_bench/criteria.jsonl")).unwrap();
    assert_eq!(tasks.len(), 100);
    let dims = [
        "comprehensiveness",
        "insight",
        "instruction_following",
        "readability",
    ];
    for t in &tasks {
        assert_eq!(
            t.dimension_weight
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            dims
        );
        let all = |v: f64| -> BTreeMap<String, Vec<f64>> {
            t.criterions
                .iter()
                .map(|(d, cs)| (d.clone(), vec![v; cs.len()]))
                .collect()
        };
        assert!((t.score(&all(10.0)).unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(t.score(&all(0.0)).unwrap(), 0.0);
        // Rubric weights W_d · w_i sum to 1 over all criteria.
        let w: f32 = t.to_rubrics().iter().map(|r| r.weight).sum();
        assert!((w - 1.0).abs() < 1e-3, "task {}: {w}", t.id);
    }

    // Task 1 by hand: 10 on insight only gives 10 · W_insight.
    let t = &tasks[0];
    let mut s: BTreeMap<String, Vec<f64>> = t
        .criterions
        .iter()
        .map(|(d, cs)| (d.clone(), vec![0.0; cs.len()]))
        .collect();
    s.get_mut("insight")
        .unwrap()
        .iter_mut()
        .for_each(|x| *x = 10.0);
    assert!((t.score(&s).unwrap() - 10.0 * t.dimension_weight["insight"]).abs() < 1e-9);
    assert!((t.dimension_weight["insight"] - 0.36).abs() < 1e-12);
    // A score list of the wrong length or range is refused by name.
    s.get_mut("insight").unwrap().push(1.0);
    let e = t.score(&s).unwrap_err().to_string();
    assert!(
        e.contains("insight") && e.contains("scores were given"),
        "{e}"
    );
    s.get_mut("insight").unwrap().pop();
    s.get_mut("readability").unwrap()[0] = 11.0;
    assert!(t.score(&s).unwrap_err().to_string().contains("0..=10"));

    assert_eq!(drbench::race(6.0, 6.0), 0.5);
    assert!((drbench::race(6.0, 4.0) - 0.6).abs() < 1e-12);
    assert_eq!(drbench::race(0.0, 0.0), 0.0);
}

#[test]
fn bad_criteria_weights_are_named() {
    let bad = r#"{"id": 7, "prompt": "p", "dimension_weight": {"insight": 0.5, "readability": 0.4}, "criterions": {"insight": [{"criterion": "c", "weight": 1.0}], "readability": [{"criterion": "r", "weight": 1.0}]}}"#;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.jsonl");
    std::fs::write(&p, bad).unwrap();
    let e = drbench::load(&p).unwrap_err().to_string();
    assert!(e.contains("task 7") && e.contains("0.9"), "{e}");
}
