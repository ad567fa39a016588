//! Experiment trackers (TensorBoard, MLflow): the one table from our `step_metrics` names to the
//! names a tracker shows, and the pure bookkeeping of following a run's metrics (what is new or
//! changed, grouped per step, chunked for MLflow, the configuration flattened into parameters).
//!
//! Names follow verl where verl has one (`critic/score/mean`, `actor/pg_clipfrac`,
//! `timing_s/gen`, ...), so dashboards built for verl runs read ours; what verl has no name for
//! lives under `stage/` (per trajectory stage: plan, research, review, answer) and `rubric/`
//! (the rubric machinery: judge, buffers, reflection, bank, curriculum, and our own pipeline
//! figures). A name the table does not know passes through unchanged, only [`sanitize`]d.
//! README.md ("Trackers") carries the same table; a test keeps the two equal.

use std::collections::{BTreeMap, HashMap};

/// Our `step_metrics` name (pattern) -> tracker name, first match wins. A pattern ending in `*`
/// matches any non-empty rest, which replaces the `*` of the target.
pub const MAPPING: &[(&str, &str)] = &[
    // verl's names (the semantics are ours; README.md notes where they differ from verl's)
    ("reward/mean", "critic/score/mean"),
    ("train/loss", "actor/pg_loss"),
    ("train/kl", "actor/kl_loss"),
    ("train/clip_fraction", "actor/pg_clipfrac"),
    ("train/entropy", "actor/entropy"),
    ("train/grad_norm", "actor/grad_norm"),
    ("train/lr", "actor/lr"),
    ("batch/tokens", "perf/total_num_tokens"),
    ("time/rollout_s", "timing_s/gen"),
    ("time/judge_s", "timing_s/reward"),
    ("time/train_s", "timing_s/update_actor"),
    ("time/eval_s", "timing_s/testing"),
    // per trajectory stage
    ("reward/*", "stage/reward/*"),
    ("advantage/mean_abs/*", "stage/advantage_mean_abs/*"),
    ("advantage/std/*", "stage/advantage_std/*"),
    ("rubrics/active_*", "stage/rubrics_active/*"),
    ("rollout/tool_calls/*", "stage/tool_calls/*"),
    // the rubric machinery and our pipeline
    ("rubrics/*", "rubric/buffer/*"),
    ("judge/*", "rubric/judge/*"),
    ("reflection/*", "rubric/reflection/*"),
    ("train/reflection/*", "rubric/reflection/train/*"),
    ("bank/*", "rubric/bank/*"),
    ("curriculum/*", "rubric/curriculum/*"),
    ("gold/*", "rubric/gold/*"),
    ("monitor/*", "rubric/monitor/*"),
    ("train/*", "rubric/train/*"),
    ("rollout/*", "rubric/rollout/*"),
    ("batch/*", "rubric/batch/*"),
    ("pipeline/*", "rubric/pipeline/*"),
    ("time/*", "rubric/time/*"),
];

/// Tracker metrics computed from two of ours recorded for the same step:
/// (tracker name, numerator, denominator); written when both are present and the denominator
/// is positive.
pub const DERIVED: &[(&str, &str, &str)] = &[(
    "response_length/mean",
    "rollout/model_tokens",
    "rollout/trajectories",
)];

/// Longest key MLflow accepts.
pub const MAX_NAME_LEN: usize = 250;
/// Metrics per MLflow `runs/log-batch` request (its limit).
pub const MLFLOW_MAX_METRICS: usize = 1000;
/// Parameters per MLflow `runs/log-batch` request (its limit).
pub const MLFLOW_MAX_PARAMS: usize = 100;
/// Longest parameter value MLflow accepts.
pub const MLFLOW_MAX_PARAM_VALUE: usize = 6000;

/// The tracker's name for one of ours: the first [`MAPPING`] row that matches, else the name
/// itself, [`sanitize`]d either way.
pub fn tracker_name(ours: &str) -> String {
    for (pattern, target) in MAPPING {
        if let Some(prefix) = pattern.strip_suffix('*') {
            if let Some(rest) = ours.strip_prefix(prefix).filter(|r| !r.is_empty()) {
                return sanitize(&target.replacen('*', rest, 1));
            }
        } else if ours == *pattern {
            return sanitize(target);
        }
    }
    sanitize(ours)
}

/// A name both trackers accept: MLflow allows ASCII letters, digits, `_ - . space /`, refuses
/// empty, `.` and `..` path segments and leading or trailing `/`, and keys over 250 characters;
/// anything else becomes `_`, empty segments are dropped. TensorBoard takes any such tag.
pub fn sanitize(name: &str) -> String {
    let mut cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-. /".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    // All ASCII now: any byte index is a character boundary. Cut first: the segment rules below
    // never lengthen a name.
    cleaned.truncate(MAX_NAME_LEN);
    let mut out = cleaned
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| match s.trim() {
            "" | "." | ".." => "_",
            _ => s,
        })
        .collect::<Vec<_>>()
        .join("/");
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// One stored metric value as read from `step_metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub step: i32,
    pub name: String,
    pub value: f64,
    /// When it was recorded, milliseconds since the Unix epoch.
    pub recorded_ms: i64,
}

/// One value for the trackers: tracker name, step, value, wall time.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub step: i64,
    pub tag: String,
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    pub wall_ms: i64,
}

/// What a follower has already handed to the trackers: each (step, our name) with the value
/// sent, so a re-read row (the follower reads a few seconds back, to catch rows of slow
/// transactions) is sent again only when its value changed.
#[derive(Debug, Default)]
pub struct Seen {
    sent: HashMap<(i32, String), f64>,
}

impl Seen {
    /// The tracker points for `rows` that are new or changed since the last call, mapped,
    /// sorted by step then tag, with [`DERIVED`] figures for steps whose inputs changed.
    pub fn take(&mut self, rows: &[Row]) -> Vec<Point> {
        let mut fresh: Vec<&Row> = Vec::new();
        for r in rows {
            if !r.value.is_finite() {
                continue;
            }
            let key = (r.step, r.name.clone());
            if self
                .sent
                .get(&key)
                .is_some_and(|v| v.to_bits() == r.value.to_bits())
            {
                continue;
            }
            self.sent.insert(key, r.value);
            fresh.push(r);
        }
        let mut points: Vec<Point> = fresh
            .iter()
            .map(|r| Point {
                step: i64::from(r.step),
                tag: tracker_name(&r.name),
                value: r.value,
                wall_ms: r.recorded_ms,
            })
            .collect();
        let mut touched: BTreeMap<i32, i64> = BTreeMap::new();
        for r in &fresh {
            if DERIVED.iter().any(|(_, n, d)| r.name == *n || r.name == *d) {
                let t = touched.entry(r.step).or_insert(r.recorded_ms);
                *t = (*t).max(r.recorded_ms);
            }
        }
        for (step, wall_ms) in touched {
            for (tag, num, den) in DERIVED {
                let get = |n: &str| self.sent.get(&(step, n.to_string())).copied();
                if let (Some(a), Some(b)) = (get(num), get(den))
                    && b > 0.0
                {
                    points.push(Point {
                        step: i64::from(step),
                        tag: (*tag).to_string(),
                        value: a / b,
                        wall_ms,
                    });
                }
            }
        }
        points.sort_by(|a, b| a.step.cmp(&b.step).then_with(|| a.tag.cmp(&b.tag)));
        points
    }

    /// Pairs (step, name) sent so far.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }
}

/// `points` grouped by step (one TensorBoard event per step), in step order; each group's wall
/// time is its latest point's.
pub fn by_step(points: &[Point]) -> Vec<(i64, i64, Vec<&Point>)> {
    let mut groups: BTreeMap<i64, (i64, Vec<&Point>)> = BTreeMap::new();
    for p in points {
        let g = groups.entry(p.step).or_insert((p.wall_ms, Vec::new()));
        g.0 = g.0.max(p.wall_ms);
        g.1.push(p);
    }
    groups
        .into_iter()
        .map(|(step, (wall, ps))| (step, wall, ps))
        .collect()
}

/// A configuration (JSON) flattened into MLflow parameters: dotted keys (`rollout.n`, arrays
/// by index: `eval.sets.0.name`), scalar values as text (strings unquoted), keys sanitized,
/// values cut to [`MLFLOW_MAX_PARAM_VALUE`] characters; sorted by key.
pub fn flatten_params(config: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        let key = |k: &str| {
            if prefix.is_empty() {
                k.to_string()
            } else {
                format!("{prefix}.{k}")
            }
        };
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    walk(&key(k), x, out);
                }
            }
            serde_json::Value::Array(xs) if !xs.is_empty() && xs.iter().any(is_nested) => {
                for (i, x) in xs.iter().enumerate() {
                    walk(&key(&i.to_string()), x, out);
                }
            }
            other => {
                let text = match other {
                    serde_json::Value::String(s) => s.clone(),
                    x => x.to_string(),
                };
                if !prefix.is_empty() {
                    out.insert(sanitize(prefix), cut(&text, MLFLOW_MAX_PARAM_VALUE));
                }
            }
        }
    }
    fn is_nested(v: &serde_json::Value) -> bool {
        v.is_object() || v.is_array()
    }
    let mut out = BTreeMap::new();
    walk("", config, &mut out);
    out.into_iter().collect()
}

/// `s` cut to at most `max` characters.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

/// How a run ended, in the trackers' terms (MLflow's run statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndStatus {
    /// All steps trained.
    Finished,
    /// The run failed.
    Failed,
    /// Interrupted or paused; `--resume` continues it (and its tracker run).
    Killed,
}

impl EndStatus {
    /// MLflow's name.
    pub fn as_mlflow(self) -> &'static str {
        match self {
            Self::Finished => "FINISHED",
            Self::Failed => "FAILED",
            Self::Killed => "KILLED",
        }
    }

    /// From `runs.status` (`running` and `created`: none, the run goes on).
    pub fn from_run_status(status: &str) -> Option<Self> {
        match status {
            "completed" => Some(Self::Finished),
            "failed" => Some(Self::Failed),
            "paused" | "cancelled" => Some(Self::Killed),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verl_names_stage_and_rubric_prefixes_and_pass_through() {
        let cases = [
            ("reward/mean", "critic/score/mean"),
            ("reward/answer", "stage/reward/answer"),
            ("train/clip_fraction", "actor/pg_clipfrac"),
            ("train/kl", "actor/kl_loss"),
            ("time/rollout_s", "timing_s/gen"),
            ("time/prepare_s", "rubric/time/prepare_s"),
            ("advantage/std/plan", "stage/advantage_std/plan"),
            ("rubrics/active_review", "stage/rubrics_active/review"),
            ("rubrics/new", "rubric/buffer/new"),
            ("rollout/tool_calls/research", "stage/tool_calls/research"),
            ("rollout/parse_failures", "rubric/rollout/parse_failures"),
            ("train/groups_dropped", "rubric/train/groups_dropped"),
            ("train/reflection/kl", "rubric/reflection/train/kl"),
            ("pipeline/staleness", "rubric/pipeline/staleness"),
            ("judge/cost_usd", "rubric/judge/cost_usd"),
            ("gold/simpleqa", "rubric/gold/simpleqa"),
            ("brand/new:metric", "brand/new_metric"),
        ];
        for (ours, want) in cases {
            assert_eq!(tracker_name(ours), want, "{ours}");
        }
    }

    #[test]
    fn sanitized_names_are_what_mlflow_accepts() {
        assert_eq!(sanitize("a//b/"), "a/b");
        assert_eq!(sanitize("/x/./y/../z"), "x/_/y/_/z");
        assert_eq!(sanitize("é:ß"), "___");
        assert_eq!(sanitize(""), "_");
        assert_eq!(sanitize(&"a".repeat(400)).len(), MAX_NAME_LEN);
        let ok = |s: &str| {
            !s.is_empty()
                && s.len() <= MAX_NAME_LEN
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-. /".contains(c))
                && !s.starts_with('/')
                && !s.ends_with('/')
                && s.split('/').all(|seg| !matches!(seg, "" | "." | ".."))
        };
        for s in ["x/ /y", "../..", "a/b/c//", "räksmörgås/1", "\u{0}\n"] {
            assert!(ok(&sanitize(s)), "{s:?} -> {:?}", sanitize(s));
        }
    }

    #[test]
    fn the_readme_table_is_the_code_table() {
        let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
        for (ours, target) in MAPPING {
            let row = format!("| `{ours}` | `{target}` |");
            assert!(readme.contains(&row), "README.md lacks the row {row}");
        }
        for (target, num, den) in DERIVED {
            let row = format!("| `{num}` ÷ `{den}` | `{target}` |");
            assert!(readme.contains(&row), "README.md lacks the row {row}");
        }
    }

    fn row(step: i32, name: &str, value: f64) -> Row {
        Row {
            step,
            name: name.into(),
            value,
            recorded_ms: 1000 + i64::from(step),
        }
    }

    #[test]
    fn only_new_or_changed_values_are_taken_and_derived_ones_follow() {
        let mut seen = Seen::default();
        let first = seen.take(&[
            row(0, "reward/mean", 0.5),
            row(0, "rollout/model_tokens", 300.0),
            row(0, "rollout/trajectories", 4.0),
        ]);
        let tags: Vec<&str> = first.iter().map(|p| p.tag.as_str()).collect();
        assert_eq!(
            tags,
            [
                "critic/score/mean",
                "response_length/mean",
                "rubric/rollout/model_tokens",
                "rubric/rollout/trajectories"
            ]
        );
        assert_eq!(first[1].value, 75.0);
        assert!(seen.take(&[row(0, "reward/mean", 0.5)]).is_empty());
        let changed = seen.take(&[row(0, "reward/mean", 0.25), row(1, "reward/mean", 0.5)]);
        assert_eq!(changed.len(), 2);
        assert_eq!((changed[0].step, changed[0].value), (0, 0.25));
        assert!(seen.take(&[row(2, "x", f64::NAN)]).is_empty());
    }

    #[test]
    fn points_group_by_step_in_order() {
        let mut seen = Seen::default();
        let pts = seen.take(&[row(3, "a", 1.0), row(1, "b", 2.0), row(3, "c", 3.0)]);
        let g = by_step(&pts);
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].0, g[0].2.len()), (1, 1));
        assert_eq!((g[1].0, g[1].1, g[1].2.len()), (3, 1003, 2));
    }

    #[test]
    fn config_flattens_to_dotted_params() {
        let cfg = serde_json::json!({
            "rollout": {"n": 8, "temperature": 1.0},
            "experiment": {"name": "smoke", "recipes": ["full", "ss-grpo"]},
            "eval": {"sets": [{"name": "a", "size": 3}]},
            "data": {"world_seed": null}
        });
        let p: BTreeMap<String, String> = flatten_params(&cfg).into_iter().collect();
        assert_eq!(p["rollout.n"], "8");
        assert_eq!(p["experiment.name"], "smoke");
        assert_eq!(p["experiment.recipes"], "[\"full\",\"ss-grpo\"]");
        assert_eq!(p["eval.sets.0.size"], "3");
        assert_eq!(p["data.world_seed"], "null");
        let long = serde_json::json!({"k": "x".repeat(7000)});
        assert_eq!(flatten_params(&long)[0].1.len(), MLFLOW_MAX_PARAM_VALUE);
    }

    #[test]
    fn end_status_from_the_runs_table() {
        assert_eq!(
            EndStatus::from_run_status("completed"),
            Some(EndStatus::Finished)
        );
        assert_eq!(
            EndStatus::from_run_status("paused").map(EndStatus::as_mlflow),
            Some("KILLED")
        );
        assert_eq!(EndStatus::from_run_status("running"), None);
    }
}
