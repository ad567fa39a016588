//! Credit assignment invariants (method.md Part D): Λ upper-triangular with unit diagonal; R in
//! [0, 1]; Λ = identity is per-stage GRPO; terminal mode is GRPO on the Answer score; group
//! normalisation uses the population std; zero-variance stages get zero advantage; the DR Tulu
//! composite reward and its weights.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use orchestrator::credit::{
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
            if g.std[k] > 1e-6 {
                let var = col.iter().map(|a| a * a).sum::<f64>() / n;
                prop_assert!((var - 1.0).abs() < 1e-4, "stage {} var {}", k, var);
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
