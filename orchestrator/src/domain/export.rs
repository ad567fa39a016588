//! The orchestrator's part of a model card for an exported policy version: what the run was
//! (experiment, recipe, seed, steps), how each evaluation subset and gold-judged benchmark
//! scored it up to that version, and the resolved configuration. `trainer export --card-extra`
//! appends this markdown to the card it writes beside the weights.

use std::fmt::Write as _;

/// One evaluation row of the card (an `evaluations` row).
#[derive(Debug, Clone, PartialEq)]
pub struct CardEval {
    pub subset: String,
    pub policy_version: i32,
    pub judge_model: String,
    pub tasks: i32,
    pub samples: i32,
    pub score: Option<f64>,
    pub exact: Option<f64>,
    pub failed: i32,
}

/// One gold-judged benchmark run at a policy version.
#[derive(Debug, Clone, PartialEq)]
pub struct CardBench {
    pub name: String,
    pub benchmark: String,
    pub policy_version: Option<i32>,
    pub score: Option<f64>,
}

/// What the card says about the run.
#[derive(Debug, Clone, PartialEq)]
pub struct CardRun {
    pub experiment: String,
    pub preset: String,
    pub run: String,
    pub run_id: String,
    pub recipe: String,
    pub seed: i64,
    pub status: String,
    pub completed_steps: i64,
    pub policy_version: i32,
    pub checkpoint: String,
}

/// A stored configuration snapshot as TOML: unset options (JSON nulls, which TOML cannot
/// express) are left out, as they are in a preset file.
pub fn config_toml(config: &serde_json::Value) -> String {
    fn strip(v: &serde_json::Value) -> Option<serde_json::Value> {
        use serde_json::Value;
        match v {
            Value::Null => None,
            Value::Object(m) => Some(Value::Object(
                m.iter()
                    .filter_map(|(k, v)| strip(v).map(|v| (k.clone(), v)))
                    .collect(),
            )),
            Value::Array(a) => Some(Value::Array(a.iter().filter_map(strip).collect())),
            other => Some(other.clone()),
        }
    }
    let clean = strip(config).unwrap_or_default();
    toml::to_string_pretty(&clean).unwrap_or_else(|e| format!("# not expressible as TOML ({e})\n"))
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{x:.4}"))
}

/// The markdown section: the run, evaluations at versions up to the exported one (the exported
/// version's rows in bold), benchmarks, and the configuration as TOML.
pub fn model_card(
    run: &CardRun,
    evals: &[CardEval],
    benches: &[CardBench],
    config_toml: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Training run\n");
    let _ = writeln!(s, "| | |\n|---|---|");
    for (k, v) in [
        (
            "experiment",
            format!("{} (preset `{}`)", run.experiment, run.preset),
        ),
        ("run", format!("{} (`{}`)", run.run, run.run_id)),
        ("recipe", run.recipe.clone()),
        ("seed", run.seed.to_string()),
        (
            "status",
            format!("{}, {} steps completed", run.status, run.completed_steps),
        ),
        ("policy version", run.policy_version.to_string()),
        ("checkpoint", format!("`{}`", run.checkpoint)),
    ] {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = writeln!(s, "\n## Evaluation\n");
    let shown: Vec<&CardEval> = evals
        .iter()
        .filter(|e| e.policy_version <= run.policy_version)
        .collect();
    if shown.is_empty() {
        let _ = writeln!(
            s,
            "No evaluation of this run up to version {} is stored.",
            run.policy_version
        );
    } else {
        let _ = writeln!(
            s,
            "Held-out and fixed subsets, scored by the run's evaluation judge (rows of version {} in bold).\n",
            run.policy_version
        );
        let _ = writeln!(
            s,
            "| subset | version | score | exact | tasks | samples | unscored | judge |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---|");
        for e in shown {
            let b = if e.policy_version == run.policy_version {
                "**"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "| {b}{}{b} | {b}{}{b} | {b}{}{b} | {} | {} | {} | {} | {} |",
                e.subset,
                e.policy_version,
                num(e.score),
                num(e.exact),
                e.tasks,
                e.samples,
                e.failed,
                e.judge_model
            );
        }
    }
    let benches: Vec<&CardBench> = benches
        .iter()
        .filter(|b| b.policy_version.is_none_or(|v| v <= run.policy_version))
        .collect();
    if !benches.is_empty() {
        let _ = writeln!(s, "\n## Benchmarks (gold judges)\n");
        let _ = writeln!(
            s,
            "| benchmark | version | score | run |\n|---|---:|---:|---|"
        );
        for b in benches {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                b.benchmark,
                b.policy_version
                    .map_or_else(|| "-".into(), |v| v.to_string()),
                num(b.score),
                b.name
            );
        }
    }
    let _ = writeln!(
        s,
        "\n## Resolved configuration\n\n```toml\n{}```",
        config_toml.trim_end().to_string() + "\n"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(v: i32) -> CardRun {
        CardRun {
            experiment: "e".into(),
            preset: "smoke".into(),
            run: "full".into(),
            run_id: "id".into(),
            recipe: "full".into(),
            seed: 3,
            status: "completed".into(),
            completed_steps: 4,
            policy_version: v,
            checkpoint: "/ck/step-2".into(),
        }
    }

    fn eval(v: i32, score: f64) -> CardEval {
        CardEval {
            subset: "held-out".into(),
            policy_version: v,
            judge_model: "lexical-v1".into(),
            tasks: 3,
            samples: 3,
            score: Some(score),
            exact: None,
            failed: 0,
        }
    }

    #[test]
    fn the_card_shows_evaluations_up_to_the_exported_version() {
        let card = model_card(
            &run(2),
            &[eval(0, 0.1), eval(2, 0.25), eval(4, 0.5)],
            &[CardBench {
                name: "r/hb/v2".into(),
                benchmark: "healthbench".into(),
                policy_version: Some(2),
                score: Some(0.3),
            }],
            "[experiment]\nsteps = 4\n",
        );
        assert!(card.contains("| held-out | 0 | 0.1000 |"), "{card}");
        assert!(
            card.contains("| **held-out** | **2** | **0.2500** |"),
            "{card}"
        );
        assert!(
            !card.contains("0.5000"),
            "a later version is not this model's: {card}"
        );
        assert!(card.contains("| healthbench | 2 | 0.3000 | r/hb/v2 |"));
        assert!(card.contains("```toml\n[experiment]\nsteps = 4\n```"));
        let none = model_card(&run(1), &[eval(2, 0.2)], &[], "");
        let toml = config_toml(&serde_json::json!({"a": {"x": 1, "unset": null}, "b": [1, null]}));
        assert_eq!(toml, "b = [1]\n\n[a]\nx = 1\n");
        assert!(none.contains("No evaluation of this run up to version 1"));
    }
}
