//! `orchestrator report RUN|EXPERIMENT`: a markdown report from the step metrics and
//! evaluations in Postgres, with PNG and SVG plots (plotters): reward per stage over steps,
//! recipes side by side, their scores on the fixed evaluation subsets per policy version, the
//! training-judge reward beside the gold-judge benchmark score per version with the
//! reward-hacking flag, and the time breakdown of each step. The judge kind is stated on top (an offline lexical judge
//! is labelled as such). PNG text uses a system TrueType font when one is found; without one
//! the PNGs carry no labels (the SVGs always do).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::eval::paired::{Paired, mean_sd};
use crate::infra::db::{self, DbError};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("{0} is neither a run nor an experiment")]
    NotFound(Uuid),
    #[error(
        "--select-by {subset}: no completed run was evaluated on it; evaluated subsets: {known}"
    )]
    UnknownSubset { subset: String, known: String },
    #[error("writing {path}: {message}")]
    Write { path: PathBuf, message: String },
    #[error("plotting {what}: {message}")]
    Plot { what: String, message: String },
}

const STAGES: [&str; 4] = ["plan", "research", "review", "answer"];
const TIMES: [&str; 5] = [
    "time/rollout_s",
    "time/judge_s",
    "time/train_s",
    "time/publish_s",
    "time/train_idle_s",
];

type Series = Vec<(f64, f64)>;

struct RunData {
    row: db::runs::RunRow,
    judge: String,
    steps_total: u64,
    rewards: [Series; 4],
    times: [Series; 5],
    /// Per step: trajectories, parse failures, tool calls per stage, mean answer characters.
    trajectories: Series,
    parse_failures: Series,
    /// Per step: trajectories judged, and of them those with a stage that took the answer score.
    judged: Series,
    broadcast: Series,
    tool_calls: [Series; 4],
    answer_chars: Series,
    /// Per step: reflection candidates and their valid share, bank items, and the reflection
    /// sequences the step's batch carried (Phase A); empty for a recipe without reflection.
    reflection_candidates: Series,
    reflection_valid: Series,
    bank_items: Series,
    reflection_sequences: Series,
    evals: Vec<db::evaluations::EvalRow>,
    /// Per subset, the paired change from the first to the last evaluated version.
    paired: BTreeMap<String, Paired>,
}

pub(crate) fn font_registered() -> bool {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        const CANDIDATES: [&str; 3] = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        ];
        for p in CANDIDATES {
            if let Ok(bytes) = std::fs::read(p) {
                let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, leaked).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

fn plot_err(what: &str) -> impl Fn(String) -> ReportError + '_ {
    move |message| ReportError::Plot {
        what: what.to_string(),
        message,
    }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[(String, Series)],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let xs = series.iter().flat_map(|(_, s)| s.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|(_, s)| s.iter().map(|p| p.1));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (y0, y1) = ys.fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(y), b.max(y)));
    let (x0, x1) = if x0 > x1 {
        (0.0, 1.0)
    } else {
        (x0, x1.max(x0 + 1.0))
    };
    let (y0, y1) = if y0 > y1 {
        (0.0, 1.0)
    } else {
        let pad = ((y1 - y0) * 0.05).max(1e-3);
        (y0 - pad, y1 + pad)
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, s)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// Write `name.png` and `name.svg` over steps; returns the PNG file name.
fn plot(
    dir: &Path,
    name: &str,
    title: &str,
    y_label: &str,
    series: &[(String, Series)],
) -> Result<String, ReportError> {
    plot_xy(dir, name, title, ("step", y_label), series)
}

fn plot_xy(
    dir: &Path,
    name: &str,
    title: &str,
    labels: (&str, &str),
    series: &[(String, Series)],
) -> Result<String, ReportError> {
    font_registered();
    let png = dir.join(format!("{name}.png"));
    let svg = dir.join(format!("{name}.svg"));
    draw(
        BitMapBackend::new(&png, (900, 520)).into_drawing_area(),
        title,
        labels,
        series,
    )
    .map_err(plot_err(name))?;
    draw(
        SVGBackend::new(&svg, (900, 520)).into_drawing_area(),
        title,
        labels,
        series,
    )
    .map_err(plot_err(name))?;
    Ok(format!("{name}.png"))
}

async fn series(pool: &PgPool, run: Uuid, name: &str) -> Result<Series, DbError> {
    Ok(db::metrics::fetch(pool, run, name)
        .await?
        .into_iter()
        .map(|(s, v)| (f64::from(s), v))
        .collect())
}

fn mean(s: &[(f64, f64)]) -> f64 {
    if s.is_empty() {
        return f64::NAN;
    }
    s.iter().map(|p| p.1).sum::<f64>() / s.len() as f64
}

fn head_tail(s: &Series) -> (f64, f64) {
    let k = s.len().min(3);
    (mean(&s[..k]), mean(&s[s.len() - k..]))
}

/// Per subset: `subset vA → vB: a → b` over the run's first and last evaluated versions.
fn eval_span(evals: &[db::evaluations::EvalRow]) -> String {
    let subsets: std::collections::BTreeSet<&str> =
        evals.iter().map(|e| e.subset.as_str()).collect();
    let parts: Vec<String> = subsets
        .into_iter()
        .filter_map(|s| {
            let mut es = evals.iter().filter(|e| e.subset == s);
            let first = es.next()?;
            let last = es.next_back().unwrap_or(first);
            Some(format!(
                "`{s}` v{} → v{}: {} → {}",
                first.policy_version,
                last.policy_version,
                opt(first.score),
                opt(last.score)
            ))
        })
        .collect();
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join("; ")
    }
}

fn opt(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.4}"))
}

/// Four decimals, or "–" for the mean of no steps (a run created or just started).
fn fixed4(x: f64) -> String {
    opt((!x.is_nan()).then_some(x))
}

/// Scores on the fixed evaluation subsets: per subset, a table of runs by policy version and a
/// plot of the score over versions, recipes side by side.
fn evaluation_section(md: &mut String, dir: &Path, data: &[RunData]) -> Result<(), ReportError> {
    let subsets: std::collections::BTreeSet<&str> = data
        .iter()
        .flat_map(|d| d.evals.iter().map(|e| e.subset.as_str()))
        .collect();
    let _ = writeln!(md, "## Evaluation on fixed subsets\n");
    if subsets.is_empty() {
        let _ = writeln!(
            md,
            "No evaluation recorded (set `eval.held_out` or `eval.sets` to evaluate each policy).\n"
        );
        return Ok(());
    }
    let _ = writeln!(
        md,
        "Each policy version (= steps trained) rolled out once per task and sample without bank \
         injection; score = mean persistent-rubric Answer score (judge named per row), exact = \
         share of answers containing the known short answer (– where no task has one); change = \
         the run's last version's score minus its first's, paired over the tasks scored at both, \
         ± its standard error over tasks (tasks).\n"
    );
    for subset in subsets {
        let rows: Vec<(&RunData, Vec<&db::evaluations::EvalRow>)> = data
            .iter()
            .map(|d| (d, d.evals.iter().filter(|e| e.subset == subset).collect()))
            .collect();
        let versions: std::collections::BTreeSet<i32> = rows
            .iter()
            .flat_map(|(_, es)| es.iter().map(|e| e.policy_version))
            .collect();
        let tasks = rows
            .iter()
            .flat_map(|(_, es)| es.iter().map(|e| e.tasks))
            .max()
            .unwrap_or(0);
        let head: Vec<String> = versions.iter().map(|v| format!("v{v}")).collect();
        let _ = writeln!(
            md,
            "### `{subset}` ({tasks} tasks): score (exact) by policy version\n\n| run | recipe | judge | {} | change | judged / failed (last) |\n|---|---|---|{}---|---|",
            head.join(" | "),
            "---|".repeat(versions.len())
        );
        for (d, es) in &rows {
            if es.is_empty() {
                continue;
            }
            let cells: Vec<String> = versions
                .iter()
                .map(|v| {
                    es.iter()
                        .find(|e| e.policy_version == *v)
                        .map_or(String::new(), |e| {
                            format!("{} ({})", opt(e.score), opt(e.exact))
                        })
                })
                .collect();
            let (judge, last) = match es.last() {
                Some(e) => (
                    e.judge_model.as_str(),
                    format!("{} / {}", e.judged, e.failed),
                ),
                None => ("", String::new()),
            };
            let change = d.paired.get(subset).map_or("–".into(), Paired::change);
            let _ = writeln!(
                md,
                "| {} | {} | `{judge}` | {} | {change} | {last} |",
                d.row.name,
                d.row.recipe,
                cells.join(" | ")
            );
        }
        let series: Vec<(String, Series)> = rows
            .iter()
            .filter(|(_, es)| !es.is_empty())
            .map(|(d, es)| {
                (
                    d.row.name.clone(),
                    es.iter()
                        .filter_map(|e| e.score.map(|s| (f64::from(e.policy_version), s)))
                        .collect(),
                )
            })
            .collect();
        let name = format!(
            "eval_{}",
            subset.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        let f = plot_xy(
            dir,
            &name,
            &format!("Evaluation on `{subset}` by recipe"),
            ("policy version (steps trained)", "score"),
            &series,
        )?;
        let _ = writeln!(md, "\n![eval {subset}]({f}) ([svg]({name}.svg))\n");
    }
    Ok(())
}

/// Benchmark sets graded by a gold panel (`[[eval.sets]]` with `benchmark`): per run and set,
/// the training-judge reward of the step that produced each version beside the gold score of
/// that version, a plot of both over versions, and the monitor's verdict (training reward
/// rising while the gold score falls over the last evaluations: possible reward hacking).
async fn gold_section(
    pool: &PgPool,
    md: &mut String,
    dir: &Path,
    data: &[RunData],
) -> Result<(), ReportError> {
    use crate::pipeline::bench::periodic::{self, MONITOR_TOLERANCE, MONITOR_WINDOW};
    let mut wrote_header = false;
    for d in data {
        let prefix = format!("{}/", d.row.id);
        let sets: std::collections::BTreeSet<String> = db::bench::for_source(pool, d.row.id)
            .await?
            .into_iter()
            .filter_map(|r| {
                let rest = r.name.strip_prefix(&prefix)?;
                Some(rest.rsplit_once("/v")?.0.to_string())
            })
            .collect();
        for set in sets {
            let pts = periodic::points(pool, d.row.id, &set).await?;
            if pts.is_empty() {
                continue;
            }
            if !wrote_header {
                let _ = writeln!(
                    md,
                    "## Training judge vs gold judge

Training reward = mean reward of the step that produced the version (the training judge); gold = the benchmark score of that version by the set's gold panel (x 1/100). The monitor flags a set when, over the last {MONITOR_WINDOW} evaluations, the training reward rises while the gold score falls (by more than {MONITOR_TOLERANCE}).
"
                );
                wrote_header = true;
            }
            let flag =
                crate::domain::bench::monitor::diverging(&pts, MONITOR_WINDOW, MONITOR_TOLERANCE);
            let _ = writeln!(
                md,
                "### `{}` / `{set}`{}

| version | training reward | gold score |
|---|---|---|",
                d.row.name,
                if flag {
                    " — **diverging: possible reward hacking**"
                } else {
                    ""
                }
            );
            for p in &pts {
                let _ = writeln!(md, "| v{} | {:.4} | {:.4} |", p.version, p.reward, p.gold);
            }
            let series = vec![
                (
                    "training reward".to_string(),
                    pts.iter()
                        .map(|p| (f64::from(p.version), p.reward))
                        .collect(),
                ),
                (
                    format!("gold score ({set})"),
                    pts.iter().map(|p| (f64::from(p.version), p.gold)).collect(),
                ),
            ];
            let name = format!(
                "gold_{}_{}",
                &d.row.id.to_string()[..8],
                set.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
            );
            let f = plot_xy(
                dir,
                &name,
                &format!("Training reward vs gold score on `{set}`"),
                ("policy version (steps trained)", "score"),
                &series,
            )?;
            let _ = writeln!(
                md,
                "
![gold {set}]({f}) ([svg]({name}.svg))
"
            );
        }
    }
    Ok(())
}

/// An evaluation of one version on one subset: (policy version, score, exact-match rate).
pub type EvalPoint = (i32, Option<f64>, Option<f64>);

/// One run reduced to what the by-recipe table compares across seeds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeedRun {
    pub recipe: String,
    pub seed: i64,
    /// Evaluations by subset (the held-out file and every `[[eval.sets]]`), sorted by version.
    pub evals: BTreeMap<String, Vec<EvalPoint>>,
    /// Per subset, the run's score change from its first to its last evaluated version, paired
    /// over the tasks scored at both (its standard error is the task-sampling noise of that
    /// one run; the spread over seeds is the RL's own).
    pub paired: BTreeMap<String, Paired>,
    /// Reward per stage (plan, research, review, answer), mean over the last three steps.
    pub stage_reward: [f64; 4],
    /// Parse failures per trajectory, over all steps.
    pub parse_rate: f64,
    /// Tool calls per trajectory by stage (plan, research, review, answer), over all steps.
    pub tool_calls: [f64; 4],
    /// Mean characters of an answer, over the steps' means.
    pub answer_chars: f64,
    /// The meta-policy's memory, for a recipe that reflects (`None` otherwise): valid share of
    /// its reflection candidates, bank items at the last step, and the reflection sequences
    /// trained (Phase A) over all steps. With no valid candidate every group is degenerate, no
    /// Phase A update happens and the bank stays empty: the recipe is then its base recipe.
    pub reflection: Option<[f64; 3]>,
    /// Share of judged trajectories with at least one stage that had no rubric of its own and
    /// took the answer score (method.md A.4.4's fallback), over all steps: 1.0 means every
    /// trajectory had such a stage, whose SS-GRPO credit is then the terminal reward's.
    pub stage_fallback: f64,
}

impl SeedRun {
    fn of(d: &RunData) -> Self {
        // `+ 0.0`: a float sum of nothing is -0.0.
        let total = |s: &Series| s.iter().map(|p| p.1).sum::<f64>() + 0.0;
        let trajectories = total(&d.trajectories).max(1.0);
        let mut evals: BTreeMap<String, Vec<EvalPoint>> = BTreeMap::new();
        for e in &d.evals {
            evals
                .entry(e.subset.clone())
                .or_default()
                .push((e.policy_version, e.score, e.exact));
        }
        for points in evals.values_mut() {
            points.sort_by_key(|p| p.0);
        }
        Self {
            recipe: d.row.recipe.clone(),
            seed: d.row.seed,
            evals,
            paired: d.paired.clone(),
            stage_reward: std::array::from_fn(|k| head_tail(&d.rewards[k]).1),
            parse_rate: total(&d.parse_failures) / trajectories,
            tool_calls: std::array::from_fn(|k| total(&d.tool_calls[k]) / trajectories),
            answer_chars: mean(&d.answer_chars),
            reflection: (!d.reflection_candidates.is_empty()).then(|| {
                let candidates = total(&d.reflection_candidates);
                let valid: f64 = d
                    .reflection_candidates
                    .iter()
                    .filter_map(|(step, n)| {
                        let f = d.reflection_valid.iter().find(|p| p.0 == *step)?.1;
                        Some(n * f)
                    })
                    .sum::<f64>()
                    + 0.0;
                [
                    valid / candidates.max(1.0),
                    d.bank_items.last().map_or(0.0, |p| p.1),
                    total(&d.reflection_sequences),
                ]
            }),
            stage_fallback: total(&d.broadcast) / total(&d.judged).max(1.0),
        }
    }
}

fn pm(xs: &[f64], digits: usize) -> String {
    match mean_sd(xs) {
        None => "—".to_string(),
        Some((m, _)) if m.is_nan() => "—".to_string(),
        Some((m, Some(sd))) => format!("{m:.digits$} ± {sd:.digits$}"),
        Some((m, None)) => format!("{m:.digits$}"),
    }
}

/// The relation of two recipes' mean changes over seeds (`a` ranked above or equal to `b`):
/// `>` when the gap is at least twice the standard error of the difference of the two means
/// (sqrt(sd_a²/n_a + sd_b²/n_b)), `≳` when it is smaller (the seeds do not separate them),
/// `=` when the means are equal, and `>` by the means alone when a recipe has one seed (no
/// spread to weigh the gap against; the ordering line says so).
fn relation(a: &(&str, Vec<f64>), b: &(&str, Vec<f64>)) -> &'static str {
    let (Some((ma, sa)), Some((mb, sb))) = (mean_sd(&a.1), mean_sd(&b.1)) else {
        return "?";
    };
    if ma <= mb {
        return "=";
    }
    match (sa, sb) {
        (Some(sa), Some(sb)) => {
            let se = (sa * sa / a.1.len() as f64 + sb * sb / b.1.len() as f64).sqrt();
            if ma - mb >= 2.0 * se { ">" } else { "≳" }
        }
        _ => ">",
    }
}

/// `r`'s evaluations on `subset` (none when it was not evaluated there).
fn points_of<'a>(r: &'a SeedRun, subset: &str) -> &'a [EvalPoint] {
    r.evals.get(subset).map_or(&[], Vec::as_slice)
}

/// The figure `pick` takes from `r`'s evaluation of version `v` on `subset`, if there is one.
fn value_at(r: &SeedRun, subset: &str, v: i32, pick: fn(&EvalPoint) -> Option<f64>) -> Option<f64> {
    points_of(r, subset)
        .iter()
        .find(|p| p.0 == v)
        .and_then(pick)
}

/// The subsets the runs were evaluated on: the held-out file first, then the others by name.
fn subsets(runs: &[SeedRun]) -> Vec<&str> {
    let mut names: Vec<&str> = runs
        .iter()
        .flat_map(|r| r.evals.keys().map(String::as_str))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    names.sort_by_key(|n| *n != super::evaluate::HELD_OUT);
    names
}

/// The recipes of `runs`, each once, in the order they first appear.
fn recipe_order<'a>(runs: impl IntoIterator<Item = &'a SeedRun>) -> Vec<&'a str> {
    let mut recipes: Vec<&str> = Vec::new();
    for r in runs {
        if !recipes.contains(&r.recipe.as_str()) {
            recipes.push(&r.recipe);
        }
    }
    recipes
}

/// The recipes compared over their seeds (markdown; empty for a single run; a recipe run on one
/// seed shows its values without a spread). Per evaluation subset: score and exact-match rate
/// per policy version as mean ± sample standard deviation over seeds (versions every seed of
/// the recipe reached), the change from the first to the last version over seeds, each seed's
/// change paired over tasks with its standard error (the noise of the task sample), and the
/// ordering by the change with [`relation`]'s test of each gap. Then what explains it: reward per
/// stage (last three steps), parse failures and tool calls per stage per trajectory, answer
/// length, and the share of trajectories whose stage credit fell back to the answer score.
pub fn by_recipe(runs: &[SeedRun]) -> String {
    let recipes = recipe_order(runs);
    let group =
        |name: &str| -> Vec<&SeedRun> { runs.iter().filter(|r| r.recipe == name).collect() };
    if runs.len() < 2 {
        return String::new();
    }
    let mut md = String::from(
        "\n## Recipes over seeds (completed runs; mean ± sample sd over seeds; one seed: its value)\n",
    );
    for subset in subsets(runs) {
        let _ = writeln!(
            md,
            "\n### `{subset}`: score (exact-match rate) by policy version\n\n\
             Over the versions every seed of the recipe reached; change = last version − first, \
             per seed; per seed = that seed's change paired over the tasks scored at both \
             versions, ± its standard error over tasks (tasks).\n\n\
             | recipe | seeds | score by version | exact by version | change | per seed |\n\
             |---|---|---|---|---|---|"
        );
        let mut order: Vec<(&str, Vec<f64>)> = Vec::new();
        for name in &recipes {
            let g: Vec<&SeedRun> = group(name)
                .into_iter()
                .filter(|r| r.evals.contains_key(subset))
                .collect();
            if g.is_empty() {
                continue;
            }
            let mut versions: Vec<i32> = points_of(g[0], subset).iter().map(|p| p.0).collect();
            versions.retain(|v| {
                g.iter()
                    .all(|r| points_of(r, subset).iter().any(|p| p.0 == *v))
            });
            let at = |v: i32, pick: fn(&EvalPoint) -> Option<f64>| -> Vec<f64> {
                g.iter()
                    .filter_map(|r| value_at(r, subset, v, pick))
                    .collect()
            };
            let scores: Vec<String> = versions
                .iter()
                .map(|&v| format!("v{v} {}", pm(&at(v, |p| p.1), 4)))
                .collect();
            let exact: Vec<String> = versions
                .iter()
                .map(|&v| format!("v{v} {}", pm(&at(v, |p| p.2), 3)))
                .collect();
            let change: Vec<f64> = match (versions.first(), versions.last()) {
                (Some(&a), Some(&b)) if a != b => g
                    .iter()
                    .filter_map(|r| {
                        let score = |v: i32| value_at(r, subset, v, |p| p.1);
                        Some(score(b)? - score(a)?)
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let seeds: Vec<String> = g.iter().map(|r| r.seed.to_string()).collect();
            let per_seed: Vec<String> = g
                .iter()
                .filter_map(|r| {
                    let p = r.paired.get(subset)?;
                    Some(format!("{}: {}", r.seed, p.change()))
                })
                .collect();
            let _ = writeln!(
                md,
                "| {name} | {} | {} | {} | {} | {} |",
                seeds.join(", "),
                scores.join("; "),
                exact.join("; "),
                pm(&change, 4),
                if per_seed.is_empty() {
                    "—".to_string()
                } else {
                    per_seed.join("; ")
                }
            );
            if !change.is_empty() {
                order.push((name, change));
            }
        }
        let mean_of = |c: &[f64]| mean_sd(c).map_or(f64::NAN, |m| m.0);
        order.sort_by(|a, b| mean_of(&b.1).total_cmp(&mean_of(&a.1)));
        if order.is_empty() {
            continue;
        }
        let shown = |(n, c): &(&str, Vec<f64>)| match mean_sd(c) {
            Some((m, Some(sd))) => format!("{n} ({m:+.4} ± {sd:.4})"),
            Some((m, None)) => format!("{n} ({m:+.4})"),
            None => format!("{n} (—)"),
        };
        let mut joined = shown(&order[0]);
        for k in 1..order.len() {
            let _ = write!(
                joined,
                " {} {}",
                relation(&order[k - 1], &order[k]),
                shown(&order[k])
            );
        }
        let one_seed = order.iter().any(|(_, c)| c.len() < 2);
        let _ = writeln!(
            md,
            "\nOrdering by `{subset}` change: {joined}. (`>`: the gap is at least twice the \
             standard error of the difference of the two means over seeds; `≳`: it is not, so \
             the seeds do not order them{}. The paper's ordering: full above meta-policy and \
             ss-grpo, both above baseline-rl.)",
            if one_seed {
                "; a recipe with one seed is ordered by its value alone"
            } else {
                ""
            }
        );
    }
    md.push_str(
        "\n### What explains it\n\n| recipe | reward plan | research | review | answer (last 3 steps) | parse failures / trajectory | tool calls / trajectory: plan | research | review | answer | answer chars | stage scores from R4 (share of trajectories) | valid reflections (share) | bank items (last step) | reflection sequences trained |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for name in &recipes {
        let g = group(name);
        let col = |f: &dyn Fn(&SeedRun) -> f64, digits: usize| {
            pm(&g.iter().map(|r| f(r)).collect::<Vec<_>>(), digits)
        };
        let rewards: Vec<String> = (0..4).map(|k| col(&|r| r.stage_reward[k], 4)).collect();
        let tools: Vec<String> = (0..4).map(|k| col(&|r| r.tool_calls[k], 2)).collect();
        let memory: Vec<String> = if g.iter().all(|r| r.reflection.is_some()) {
            [(0, 3), (1, 0), (2, 0)]
                .iter()
                .map(|&(k, digits)| col(&|r| r.reflection.map_or(f64::NAN, |m| m[k]), digits))
                .collect()
        } else {
            vec!["—".to_string(); 3]
        };
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            rewards.join(" | "),
            col(&|r| r.parse_rate, 3),
            tools.join(" | "),
            col(&|r| r.answer_chars, 0),
            col(&|r| r.stage_fallback, 3),
            memory.join(" | ")
        );
    }
    md
}

/// The version a validation subset picks for one run: of the versions `r` evaluated on `by`
/// after its first, the one with the highest score there; a tie goes to the later version, so
/// a flat validation curve keeps the last. None when `by` has no score after the first version.
/// Checkpoint selection on a validation set (issue 25, session 70): the test subsets are never
/// looked at.
pub fn picked_version(r: &SeedRun, by: &str) -> Option<i32> {
    points_of(r, by)
        .iter()
        .skip(1)
        .filter_map(|p| Some((p.0, p.1?)))
        .max_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(v, _)| v)
}

/// Per recipe, each seed's version picked by the subset `by` ([`picked_version`]) and, on every
/// other subset, the score change from the seed's first evaluated version to the picked one,
/// with its mean ± sample sd over seeds (markdown; empty when no run has a pick). `by`'s own
/// change is left out: the pick maximises it, so it is biased upward. The evaluations of a
/// subset reuse its tasks and sampling seeds at every version, so the change of the means is
/// the mean of the paired changes.
pub fn picked_by(runs: &[SeedRun], by: &str) -> String {
    let picks: Vec<(&SeedRun, i32)> = runs
        .iter()
        .filter_map(|r| Some((r, picked_version(r, by)?)))
        .collect();
    if picks.is_empty() {
        return String::new();
    }
    let others: Vec<&str> = subsets(runs).into_iter().filter(|s| *s != by).collect();
    let mut md = format!(
        "\n## Versions picked by `{by}` (completed runs)\n\n\
         Each seed's picked version is the one after its first with the highest `{by}` score \
         (a tie goes to the later version); each other subset's change is its score at the \
         picked version minus its score at the first, per seed, then mean ± sample sd over \
         seeds. `{by}`'s own change is not shown: the pick maximises it.\n\n| recipe | seed: picked version |"
    );
    for s in &others {
        let _ = write!(md, " `{s}` change at the pick |");
    }
    md.push_str("\n|---|---|");
    md.push_str(&"---|".repeat(others.len()));
    md.push('\n');
    let recipes = recipe_order(picks.iter().map(|(r, _)| *r));
    for name in recipes {
        let g: Vec<&(&SeedRun, i32)> = picks.iter().filter(|(r, _)| r.recipe == name).collect();
        let chosen: Vec<String> = g.iter().map(|(r, v)| format!("{}: v{v}", r.seed)).collect();
        let _ = write!(md, "| {name} | {} |", chosen.join(", "));
        for s in &others {
            let changes: Vec<(i64, f64)> = g
                .iter()
                .filter_map(|(r, v)| {
                    let first = points_of(r, s).first()?;
                    let at = value_at(r, s, *v, |p| p.1)?;
                    Some((r.seed, at - first.1?))
                })
                .collect();
            let values: Vec<f64> = changes.iter().map(|c| c.1).collect();
            let per_seed: Vec<String> = changes
                .iter()
                .map(|(seed, c)| format!("{seed}: {c:+.4}"))
                .collect();
            if values.is_empty() {
                md.push_str(" — |");
            } else {
                let _ = write!(md, " {} ({}) |", pm(&values, 4), per_seed.join("; "));
            }
        }
        md.push('\n');
    }
    md
}

/// What `orchestrator report` adds beyond the default sections.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReportOptions {
    /// A subset to pick each run's version by ([`picked_by`]): a validation set, not a test.
    pub select_by: Option<String>,
}

/// Write the report for a run or an experiment into `out/<id>/report.md`.
pub async fn write(
    pool: &PgPool,
    target: Uuid,
    out: &Path,
    options: &ReportOptions,
) -> Result<PathBuf, ReportError> {
    let runs = match db::runs::get_run(pool, target).await? {
        Some(r) => vec![r],
        None => db::runs::list_for_experiment(pool, target).await?,
    };
    if runs.is_empty() {
        return Err(ReportError::NotFound(target));
    }
    let dir = out.join(target.to_string());
    std::fs::create_dir_all(&dir).map_err(|e| ReportError::Write {
        path: dir.clone(),
        message: e.to_string(),
    })?;
    let mut data = Vec::new();
    for row in runs {
        let cfg = db::runs::config_of(pool, row.id).await?.unwrap_or_default();
        let judge = format!(
            "{} judge `{}`",
            cfg["judge"]["kind"].as_str().unwrap_or("?"),
            cfg["judge"]["model"].as_str().unwrap_or("?")
        );
        let steps_total = cfg["experiment"]["steps"].as_u64().unwrap_or(0);
        let mut rewards: [Series; 4] = Default::default();
        for (k, st) in STAGES.iter().enumerate() {
            rewards[k] = series(pool, row.id, &format!("reward/{st}")).await?;
        }
        let mut times: [Series; 5] = Default::default();
        for (k, t) in TIMES.iter().enumerate() {
            times[k] = series(pool, row.id, t).await?;
        }
        let mut tool_calls: [Series; 4] = Default::default();
        for (k, st) in STAGES.iter().enumerate() {
            tool_calls[k] = series(pool, row.id, &format!("rollout/tool_calls/{st}")).await?;
        }
        let evals = db::evaluations::for_run(pool, row.id).await?;
        let mut paired = BTreeMap::new();
        let names: std::collections::BTreeSet<&str> =
            evals.iter().map(|e| e.subset.as_str()).collect();
        for subset in names {
            let change = super::evaluate::change_from(pool, row.id, &evals, subset).await?;
            if let Some(p) = change.and_then(|c| c.score) {
                paired.insert(subset.to_string(), p);
            }
        }
        data.push(RunData {
            trajectories: series(pool, row.id, "rollout/trajectories").await?,
            parse_failures: series(pool, row.id, "rollout/parse_failures").await?,
            judged: series(pool, row.id, "judge/trajectories").await?,
            broadcast: series(pool, row.id, "judge/broadcast").await?,
            answer_chars: series(pool, row.id, "rollout/answer_chars").await?,
            reflection_candidates: series(pool, row.id, "reflection/candidates").await?,
            reflection_valid: series(pool, row.id, "reflection/valid_fraction").await?,
            bank_items: series(pool, row.id, "bank/items").await?,
            reflection_sequences: series(pool, row.id, "batch/reflection_sequences").await?,
            tool_calls,
            row,
            judge,
            steps_total,
            rewards,
            times,
            evals,
            paired,
        });
    }
    let mut md = String::new();
    let _ = writeln!(md, "# Report for {target}\n");
    let judges: std::collections::BTreeSet<&str> = data.iter().map(|d| d.judge.as_str()).collect();
    let judges: Vec<&str> = judges.into_iter().collect();
    let _ = writeln!(md, "Judge: {}.", judges.join(", "));
    if judges.iter().any(|j| j.starts_with("lexical")) {
        let _ = writeln!(
            md,
            "**The lexical judge is the offline, deterministic term-matching judge, not an LLM: its rewards measure key-term coverage only.**"
        );
    }
    let _ = writeln!(
        md,
        "\n## Recipes side by side\n\n| run | recipe | status | steps | answer reward first 3 → last 3 | plan | research | review | answer (last 3) | evaluation score, first → last version |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for d in &data {
        let (a0, a1) = head_tail(&d.rewards[3]);
        let last: Vec<String> = d.rewards.iter().map(|s| fixed4(head_tail(s).1)).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {}/{} | {} → {} | {} | {} |",
            d.row.name,
            d.row.recipe,
            d.row.status,
            d.rewards[3].len(),
            d.steps_total,
            fixed4(a0),
            fixed4(a1),
            last.join(" | "),
            eval_span(&d.evals)
        );
    }
    let side: Vec<(String, Series)> = data
        .iter()
        .map(|d| (d.row.name.clone(), d.rewards[3].clone()))
        .collect();
    let f = plot(
        &dir,
        "recipes_answer_reward",
        "Answer-stage reward by recipe",
        "R answer",
        &side,
    )?;
    let _ = writeln!(md, "\n![recipes]({f}) ([svg](recipes_answer_reward.svg))\n");
    // A paused or failed run stopped at another version than its recipe's other seeds: only
    // completed runs are compared over seeds.
    let seeded: Vec<SeedRun> = data
        .iter()
        .filter(|d| d.row.status == super::run::RunStatus::Completed.as_str())
        .map(SeedRun::of)
        .collect();
    md.push_str(&by_recipe(&seeded));
    if let Some(by) = &options.select_by {
        let known = subsets(&seeded);
        if !known.contains(&by.as_str()) {
            return Err(ReportError::UnknownSubset {
                subset: by.clone(),
                known: known.join(", "),
            });
        }
        md.push_str(&picked_by(&seeded, by));
    }
    evaluation_section(&mut md, &dir, &data)?;
    gold_section(pool, &mut md, &dir, &data).await?;
    let _ = writeln!(
        md,
        "## Trainer settings (as each run's trainer echoed them)\n\n| run | settings hash | fine-tune | lr (schedule, warm-up) | AdamW betas, wd | KL beta (reference) | clip low/high | minibatches per step |\n|---|---|---|---|---|---|---|---|"
    );
    for d in &data {
        let Some((t, hash)) = db::pipeline::trainer_settings(pool, d.row.id).await? else {
            let _ = writeln!(md, "| {} | (never synced) | | | | | | |", d.row.name);
            continue;
        };
        let g = |k: &str| t.get(k).map(|v| v.to_string()).unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | `{hash}` | {} | {} ({}, {}) | ({}, {}), {} | {} ({}) | {}/{} | {} |",
            d.row.name,
            g("finetune"),
            g("lr"),
            g("schedule"),
            g("warmup_steps"),
            g("adam_beta1"),
            g("adam_beta2"),
            g("weight_decay"),
            g("kl_beta"),
            g("reference"),
            g("clip_low"),
            g("clip_high"),
            g("minibatches_per_step"),
        );
    }
    let _ = writeln!(
        md,
        "\n## Time per step (mean seconds)\n\n| run | rollout | judge | train | publish | trainer idle |\n|---|---|---|---|---|---|"
    );
    for d in &data {
        let m: Vec<String> = d.times.iter().map(|s| format!("{:.2}", mean(s))).collect();
        let _ = writeln!(md, "| {} | {} |", d.row.name, m.join(" | "));
    }
    for d in &data {
        let name = d
            .row
            .name
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        let _ = writeln!(
            md,
            "\n## Run {} ({}, {})\n",
            d.row.name, d.row.recipe, d.row.id
        );
        let rs: Vec<(String, Series)> = STAGES
            .iter()
            .zip(&d.rewards)
            .map(|(s, v)| (s.to_string(), v.clone()))
            .collect();
        let f = plot(
            &dir,
            &format!("{name}_reward_per_stage"),
            &format!("{}: reward per stage", d.row.name),
            "R stage",
            &rs,
        )?;
        let _ = writeln!(md, "![reward per stage]({f})\n");
        let ts: Vec<(String, Series)> = TIMES
            .iter()
            .zip(&d.times)
            .map(|(s, v)| (s.trim_start_matches("time/").to_string(), v.clone()))
            .collect();
        let f = plot(
            &dir,
            &format!("{name}_time_per_step"),
            &format!("{}: time per step", d.row.name),
            "seconds",
            &ts,
        )?;
        let _ = writeln!(md, "![time per step]({f})\n");
        let _ = writeln!(
            md,
            "| step | plan | research | review | answer | rollout s | judge s | train s |\n|---|---|---|---|---|---|---|---|"
        );
        for (step, _) in &d.rewards[3] {
            let at = |s: &Series| {
                s.iter()
                    .find(|p| p.0 == *step)
                    .map_or("".to_string(), |p| format!("{:.4}", p.1))
            };
            let _ = writeln!(
                md,
                "| {step} | {} | {} | {} | {} | {} | {} | {} |",
                at(&d.rewards[0]),
                at(&d.rewards[1]),
                at(&d.rewards[2]),
                at(&d.rewards[3]),
                at(&d.times[0]),
                at(&d.times[1]),
                at(&d.times[2]),
            );
        }
    }
    let path = dir.join("report.md");
    std::fs::write(&path, md).map_err(|e| ReportError::Write {
        path: path.clone(),
        message: e.to_string(),
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::{Paired, SeedRun, by_recipe, fixed4, head_tail, picked_by, picked_version};

    #[test]
    fn a_run_with_no_steps_shows_dashes_not_nan() {
        let (a, b) = head_tail(&Vec::new());
        assert_eq!((fixed4(a), fixed4(b)), ("–".to_string(), "–".to_string()));
        let (a, b) = head_tail(&vec![(0.0, 0.25), (1.0, 0.5)]);
        assert_eq!((fixed4(a), fixed4(b)), ("0.3750".into(), "0.3750".into()));
    }

    fn run(recipe: &str, seed: i64, held_out: &[(i32, f64, f64)], parse: f64) -> SeedRun {
        SeedRun {
            recipe: recipe.into(),
            seed,
            evals: [(
                "held-out".to_string(),
                held_out
                    .iter()
                    .map(|&(v, s, e)| (v, Some(s), Some(e)))
                    .collect(),
            )]
            .into(),
            paired: Default::default(),
            stage_reward: [0.0, 0.1, 0.2, seed as f64 / 100.0],
            parse_rate: parse,
            tool_calls: [0.0, 2.0, 0.5, 0.0],
            answer_chars: 100.0,
            reflection: None,
            stage_fallback: parse / 2.0,
        }
    }

    #[test]
    fn recipes_are_compared_over_their_seeds_with_spread_and_ordering() {
        let runs = [
            run("baseline-rl", 17, &[(0, 0.1, 0.0), (12, 0.1, 0.0)], 0.5),
            run("full", 17, &[(0, 0.1, 0.0), (12, 0.3, 0.25)], 0.25),
            run("baseline-rl", 18, &[(0, 0.1, 0.0), (12, 0.0, 0.0)], 0.7),
            run("full", 18, &[(0, 0.1, 0.0), (12, 0.2, 0.0)], 0.35),
        ];
        let md = by_recipe(&runs);
        assert!(
            md.contains("| full | 17, 18 | v0 0.1000 ± 0.0000; v12 0.2500 ± 0.0707 | v0 0.000 ± 0.000; v12 0.125 ± 0.177 | 0.1500 ± 0.0707 | — |"),
            "{md}"
        );
        assert!(
            md.contains("| baseline-rl | 17, 18 | v0 0.1000 ± 0.0000; v12 0.0500 ± 0.0707 |"),
            "{md}"
        );
        assert!(
            md.contains("Ordering by `held-out` change: full (+0.1500 ± 0.0707) > baseline-rl (-0.0500 ± 0.0707)."),
            "{md}"
        );
        // Per-recipe explanation: parse failures 0.5 / 0.7 -> 0.600 ± 0.141; answer reward of
        // seeds 17 / 18 -> 0.1750 ± 0.0071.
        assert!(
            md.contains("| baseline-rl | 0.0000 ± 0.0000 | 0.1000 ± 0.0000 | 0.2000 ± 0.0000 | 0.1750 ± 0.0071 | 0.600 ± 0.141 | 0.00 ± 0.00 | 2.00 ± 0.00 | 0.50 ± 0.00 | 0.00 ± 0.00 | 100 ± 0 | 0.300 ± 0.071 | — | — | — |"),
            "{md}"
        );
    }

    #[test]
    fn versions_not_reached_by_every_seed_are_left_out_and_one_run_has_no_table() {
        // Seed 18 of full stopped before v12: only v0 is compared, so full has no change.
        let runs = [
            run("full", 17, &[(0, 0.1, 0.0), (12, 0.3, 0.0)], 0.0),
            run("full", 18, &[(0, 0.1, 0.0)], 0.0),
        ];
        let md = by_recipe(&runs);
        assert!(
            md.contains("| full | 17, 18 | v0 0.1000 ± 0.0000 | v0 0.000 ± 0.000 | — | — |"),
            "{md}"
        );
        assert!(!md.contains("Ordering"), "{md}");
        assert_eq!(by_recipe(&runs[..1]), "");
        // One seed per recipe: values without a spread, still ordered.
        let one = [
            run("baseline-rl", 17, &[(0, 0.1, 0.0), (12, 0.1, 0.0)], 0.5),
            run("full", 17, &[(0, 0.1, 0.0), (12, 0.3, 0.25)], 0.25),
        ];
        let md = by_recipe(&one);
        assert!(
            md.contains("| full | 17 | v0 0.1000; v12 0.3000 | v0 0.000; v12 0.250 | 0.2000 | — |"),
            "{md}"
        );
        assert!(
            md.contains("Ordering by `held-out` change: full (+0.2000) > baseline-rl (+0.0000)."),
            "{md}"
        );
        let tied = [
            one[0].clone(),
            run("full", 17, &[(0, 0.1, 0.0), (12, 0.1, 0.0)], 0.5),
        ];
        assert!(
            by_recipe(&tied).contains("change: baseline-rl (+0.0000) = full (+0.0000)."),
            "{}",
            by_recipe(&tied)
        );
    }

    #[test]
    fn every_evaluation_set_is_compared_and_a_gap_within_the_seeds_spread_is_no_order() {
        // Two seeds a recipe on the held-out file and on a second set, `unseen`.
        let with_unseen = |recipe: &str, seed: i64, held: f64, unseen: (f64, f64), se: f64| {
            let mut r = run(recipe, seed, &[(0, 0.3, 0.5), (12, held, 0.5)], 0.0);
            r.evals.insert(
                "unseen".into(),
                vec![
                    (0, Some(unseen.0), Some(0.5)),
                    (12, Some(unseen.1), Some(0.5)),
                ],
            );
            r.paired.insert(
                "unseen".into(),
                Paired {
                    tasks: 64,
                    before: unseen.0,
                    after: unseen.1,
                    diff: unseen.1 - unseen.0,
                    se,
                },
            );
            r
        };
        let mut runs = [
            with_unseen("baseline-rl", 17, 0.2, (0.6, 0.62), 0.02),
            with_unseen("baseline-rl", 18, 0.1, (0.6, 0.58), 0.021),
            with_unseen("full", 17, 0.4, (0.6, 0.63), 0.02),
            with_unseen("full", 18, 0.3, (0.6, 0.60), 0.02),
        ];
        // Full reflects: seed 17 wrote no valid reflection (empty bank, no Phase A sequence),
        // seed 18 a quarter valid, 4 bank items, 8 sequences trained.
        runs[2].reflection = Some([0.0, 0.0, 0.0]);
        runs[3].reflection = Some([0.25, 4.0, 8.0]);
        let md = by_recipe(&runs);
        assert!(
            md.contains("| 0.000 ± 0.000 | 0.125 ± 0.177 | 2 ± 3 | 4 ± 6 |\n"),
            "{md}"
        );
        assert!(md.contains("| 0.000 ± 0.000 | — | — | — |\n"), "{md}");
        // The held-out file comes first, then the other set, each with its own ordering.
        let held = md.find("### `held-out`").expect("held-out section");
        let unseen = md.find("### `unseen`").expect("unseen section");
        assert!(held < unseen, "{md}");
        // held-out: full +0.05 ± 0.0707, baseline -0.15 ± 0.0707; gap 0.2 >= 2 x 0.0707.
        assert!(
            md.contains("Ordering by `held-out` change: full (+0.0500 ± 0.0707) > baseline-rl (-0.1500 ± 0.0707)."),
            "{md}"
        );
        // unseen: full +0.015 ± 0.0212, baseline 0.000 ± 0.0283; gap 0.015 < 2 x 0.0250.
        assert!(
            md.contains("Ordering by `unseen` change: full (+0.0150 ± 0.0212) ≳ baseline-rl (+0.0000 ± 0.0283)."),
            "{md}"
        );
        assert!(
            md.contains("| baseline-rl | 17, 18 | v0 0.6000 ± 0.0000; v12 0.6000 ± 0.0283 | v0 0.500 ± 0.000; v12 0.500 ± 0.000 | 0.0000 ± 0.0283 | 17: +0.0200 ± 0.0200 (64); 18: -0.0200 ± 0.0210 (64) |"),
            "{md}"
        );
        // The explanation table once, after every set.
        assert_eq!(md.matches("### What explains it").count(), 1, "{md}");
        assert!(md.find("### What explains it").unwrap() > unseen, "{md}");
    }

    #[test]
    fn a_validation_subset_picks_each_seeds_version_and_the_others_change_is_read_there() {
        // Seed 25's shape (session 58): the validation score peaks at v24 and falls by v48.
        let with_val = |seed: i64, held: &[(i32, f64, f64)], val: &[(i32, f64)]| {
            let mut r = run("baseline-rl", seed, held, 0.0);
            r.evals.insert(
                "unseen-t07".into(),
                val.iter().map(|&(v, s)| (v, Some(s), None)).collect(),
            );
            r
        };
        let runs = [
            with_val(
                25,
                &[(0, 0.17, 0.0), (24, 0.32, 0.0), (48, 0.19, 0.0)],
                &[(0, 0.45), (24, 0.64), (48, 0.39)],
            ),
            // A tie goes to the later version; v0's higher score is never a candidate.
            with_val(
                26,
                &[(0, 0.20, 0.0), (24, 0.30, 0.0), (48, 0.40, 0.0)],
                &[(0, 0.90), (24, 0.60), (48, 0.60)],
            ),
        ];
        assert_eq!(picked_version(&runs[0], "unseen-t07"), Some(24));
        assert_eq!(picked_version(&runs[1], "unseen-t07"), Some(48));
        // No evaluation after the first: no pick.
        assert_eq!(
            picked_version(&run("full", 1, &[(0, 0.1, 0.0)], 0.0), "held-out"),
            None
        );
        assert_eq!(picked_version(&runs[0], "no-such-subset"), None);
        let md = picked_by(&runs, "unseen-t07");
        // held-out at the pick: 0.32 - 0.17 and 0.40 - 0.20; mean 0.175, sd 0.0354.
        assert!(
            md.contains(
                "| baseline-rl | 25: v24, 26: v48 | 0.1750 ± 0.0354 (25: +0.1500; 26: +0.2000) |"
            ),
            "{md}"
        );
        // The selecting subset's own change is not a column.
        assert!(!md.contains("`unseen-t07` change"), "{md}");
        assert_eq!(picked_by(&runs, "no-such-subset"), "");
    }
}
