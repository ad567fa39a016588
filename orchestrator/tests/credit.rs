//! Credit assignment invariants (method.md Part D): Λ upper-triangular with unit diagonal; R in
//! [0, 1]; Λ = identity is per-stage GRPO; terminal mode is GRPO on the Answer score; group
//! normalisation uses the population std; zero-variance stages get zero advantage; the DR Tulu
//! composite reward and its weights.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use orchestrator::domain::credit::{
    CompositeInputs, CreditError, CreditMode, Lambda, PAPER_LAMBDA, STAGES, composite_reward,
    group_advantages, scalar_advantages,
};
use proptest::prelude::*;

fn scores() -> impl Strategy<Value = Vec<[f64; STAGES]>> {
    prop::collection::vec(prop::array::uniform4(0.0f64..=1.0), 2..10)
}

proptest! {
    #[test]
    fn identity_lambda_is_per_stage_grpo(r in scores()) {
        let ss = group_advantages(CreditMode::StageStructured { lambda: Lambda::identity() }, &r).unwrap();
        for k in 0..STAGES {
            let col: Vec<f64> = r.iter().map(|x| x[k]).collect();
            let want = scalar_advantages(&col);
            for (i, w) in want.iter().enumerate() {
                prop_assert!((ss.advantages[i][k] - w).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn terminal_mode_is_grpo_on_the_answer_score(r in scores()) {
        let t = group_advantages(CreditMode::Terminal, &r).unwrap();
        let answer: Vec<f64> = r.iter().map(|x| x[3]).collect();
        let want = scalar_advantages(&answer);
        for (i, w) in want.iter().enumerate() {
            for k in 0..STAGES {
                prop_assert!((t.advantages[i][k] - w).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn stage_advantages_are_normalised_per_stage(r in scores()) {
        let g = group_advantages(CreditMode::StageStructured { lambda: Lambda::default() }, &r).unwrap();
        for k in 0..STAGES {
            let col: Vec<f64> = g.advantages.iter().map(|a| a[k]).collect();
            let n = col.len() as f64;
            let mean = col.iter().sum::<f64>() / n;
            prop_assert!(mean.abs() < 1e-9);
            if g.std[k] > 0.0 {
                // (G - mean) / (std + ε) has variance exactly (std / (std + ε))²: 1 up to ε/std.
                let var = col.iter().map(|a| a * a).sum::<f64>() / n;
                let want = (g.std[k] / (g.std[k] + orchestrator::domain::credit::EPS)).powi(2);
                prop_assert!((var - want).abs() < 1e-9, "stage {} var {} want {}", k, var, want);
            } else if g.std[k] == 0.0 {
                prop_assert!(col.iter().all(|a| *a == 0.0));
            }
        }
    }

    #[test]
    fn lambda_rejects_anything_but_causal_unit_diagonal(row in 0usize..4, col in 0usize..4, v in -2.0f64..2.0) {
        let mut m = PAPER_LAMBDA;
        m[row][col] = v;
        let ok = if col < row { v == 0.0 } else if col == row { v == 1.0 } else { v >= 0.0 };
        prop_assert_eq!(Lambda::try_from(m).is_ok(), ok);
    }
}

#[test]
fn paper_lambda_returns() {
    let l = Lambda::default();
    let g = l.returns(&[0.5, 1.0, 0.0, 0.25]);
    assert_eq!(g, [0.5 + 0.4 + 0.0 + 0.2, 1.0 + 0.0 + 0.2, 0.0 + 0.2, 0.25]);
    // A config can carry Λ; bad values name the cell.
    let err = serde_json::from_str::<Lambda>("[[1,0,0,0],[0.3,1,0,0],[0,0,1,0],[0,0,0,1]]")
        .unwrap_err()
        .to_string();
    assert!(err.contains("Λ[1][0] = 0.3"), "{err}");
}

#[test]
fn scores_outside_unit_interval_are_refused_by_name() {
    let err = group_advantages(CreditMode::Terminal, &[[0.0, 0.5, 1.2, 0.0]]).unwrap_err();
    assert_eq!(
        err,
        CreditError::Score {
            rollout: 0,
            stage: 2,
            value: 1.2
        }
    );
    assert_eq!(
        group_advantages(CreditMode::Terminal, &[]).unwrap_err(),
        CreditError::EmptyGroup
    );
}

#[test]
fn degenerate_groups_are_flagged_and_population_std_is_used() {
    let same = group_advantages(CreditMode::Terminal, &[[0.2, 0.3, 0.4, 0.5]; 4]).unwrap();
    assert!(same.degenerate);
    // Two rollouts 0 and 1: population std 0.5, advantages ±1 (sample std would give ±0.707).
    let a = scalar_advantages(&[0.0, 1.0]);
    assert!(
        (a[0] + 1.0).abs() < 1e-7 && (a[1] - 1.0).abs() < 1e-7,
        "{a:?}"
    );
}

#[test]
fn dr_tulu_composite_reward() {
    let full = CompositeInputs {
        rubric: 0.8,
        citation: 0.5,
        has_answer: true,
        has_cite: true,
        has_tool_query: true,
        search_queries: 5,
    };
    assert!((composite_reward(&full, true) - (0.4 + 0.1 + 0.2 + 0.1)).abs() < 1e-12);
    assert!((composite_reward(&full, false) - (0.48 + 0.2 + 0.2)).abs() < 1e-12);
    let no_answer = CompositeInputs {
        has_answer: false,
        search_queries: 1,
        ..full
    };
    // Rubric and citation count 0; format 0.3 + 0.2, search 1/3.
    let want = 0.2 * 0.5 + 0.1 / 3.0;
    assert!((composite_reward(&no_answer, true) - want).abs() < 1e-12);
}

// ---- per-token credit, stage scores, stage spans ----

use orchestrator::domain::credit::token_credit;
use orchestrator::domain::judge::score::{contribution, finalize, stage_means};
use orchestrator::domain::judge::{Origin, Rubric, RubricScore};
use orchestrator::domain::trajectory::{Segment, SegmentKind, Stage, Trajectory};

fn segment() -> impl Strategy<Value = Segment> {
    (0usize..3, 0usize..4, 0usize..6).prop_map(|(kind, stage, len)| {
        let kind = [
            SegmentKind::Model,
            SegmentKind::ToolOutput,
            SegmentKind::Injected,
        ][kind];
        let model = kind == SegmentKind::Model;
        Segment {
            kind,
            stage: model.then_some(Stage::ALL[stage]),
            token_ids: (0..len as u32).collect(),
            logprobs: model.then(|| vec![-0.5; len]),
            text: String::new(),
            policy_version: model.then_some(0),
        }
    })
}

fn trajectory(segments: Vec<Segment>, prompt: usize) -> Trajectory {
    Trajectory {
        id: uuid::Uuid::now_v7(),
        run_id: uuid::Uuid::nil(),
        step: 0,
        task_id: uuid::Uuid::nil(),
        sample_index: 0,
        policy_version: 0,
        server: String::new(),
        server_version: None,
        prompt_token_ids: vec![1; prompt],
        segments,
        finish_reason: "stop".into(),
        parsed: serde_json::json!({}),
        timings: serde_json::json!({}),
    }
}

proptest! {
    #[test]
    fn tool_tokens_never_get_advantage_and_model_tokens_get_their_stage(
        segs in prop::collection::vec(segment(), 0..12),
        prompt in 0usize..5,
        adv in prop::array::uniform4(-3.0f64..3.0),
    ) {
        let t = trajectory(segs, prompt);
        let c = token_credit(&t, &adv);
        let n = prompt + t.segments.iter().map(|s| s.token_ids.len()).sum::<usize>();
        prop_assert_eq!(c.stage.len(), n);
        prop_assert_eq!(c.advantage.len(), n);
        prop_assert_eq!(c.loss_mask.iter().filter(|m| **m).count(), t.num_model_tokens());
        let mut at = prompt;
        prop_assert!(c.loss_mask[..prompt].iter().all(|m| !m));
        for s in &t.segments {
            for i in at..at + s.token_ids.len() {
                match s.kind {
                    SegmentKind::Model => {
                        let k = s.stage.unwrap().index();
                        prop_assert_eq!(c.stage[i], k as i8);
                        prop_assert_eq!(c.advantage[i], adv[k] as f32);
                        prop_assert!(c.loss_mask[i]);
                    }
                    _ => {
                        prop_assert_eq!(c.stage[i], -1);
                        prop_assert_eq!(c.advantage[i], 0.0);
                        prop_assert!(!c.loss_mask[i]);
                    }
                }
            }
            at += s.token_ids.len();
        }
    }

    #[test]
    fn stage_scores_stay_in_unit_interval(
        items in prop::collection::vec((0usize..4, 1u8..=3, any::<bool>(), 0u8..=2), 0..20),
    ) {
        let rubrics: Vec<Rubric> = items.iter().map(|(k, w, neg, _)| Rubric {
            id: uuid::Uuid::now_v7(),
            stage: Stage::ALL[*k],
            title: String::new(),
            description: "d".into(),
            weight: f32::from(*w),
            negative: *neg,
            key_terms: vec![],
            origin: Origin::Generated,
        }).collect();
        let scores: Vec<RubricScore> = rubrics.iter().zip(&items).map(|(r, it)| RubricScore {
            rubric_id: r.id, score: it.3, justification: String::new(),
        }).collect();
        let (r, _) = finalize(stage_means(&rubrics, &scores));
        for v in r {
            prop_assert!((0.0..=1.0).contains(&v));
        }
        // Inversion: a negative rubric's contribution is the positive one mirrored.
        for s in 0u8..=2 {
            prop_assert_eq!(contribution(s, true), 1.0 - contribution(s, false));
        }
    }

    #[test]
    fn stage_spans_partition_the_text(
        parts in prop::collection::vec(prop::sample::select(vec![
            "<think>a</think>", "<structured_plan><rubric>r</rubric></structured_plan>",
            "<call_tool name=\"google_search\">q</call_tool>", "<review>x</review>",
            "<answer>y <cite id=\"s1\">c</cite></answer>", "text ", "<structured_plan>",
            "</answer>", "<review>",
        ]), 0..10),
    ) {
        let text: String = parts.concat();
        let p = orchestrator::domain::scaffold::parse::parse(&text, &|_| true);
        let mut at = 0;
        for r in &p.stage_spans {
            prop_assert_eq!(r.start, at);
            prop_assert!(r.end >= r.start);
            at = r.end;
        }
        prop_assert_eq!(at, text.len());
    }
}
