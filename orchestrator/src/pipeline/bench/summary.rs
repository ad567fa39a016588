//! An evaluation's summary on the benchmark's own scale: per judge the score with its aggregator
//! and bootstrap 95% interval, the benchmark's other metrics, breakdowns by the tags the
//! benchmark defines, and counts of unscored items; the panel's agreement; tokens, tool calls,
//! judge calls and cost, wall time. Rendered as one JSON object, a table laid out like the
//! papers', and markdown.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;

use super::BenchRun;
use crate::domain::bench::parse::ThreeClass;
use crate::domain::bench::score::{self as formula, Aggregation};
use crate::domain::bench::stats;
use crate::domain::bench::{Benchmark, cite};
use crate::infra::db::bench::{GradeRow, ResponseRow, ScoreRow};

pub use crate::domain::bench::SCALE;

/// Per-item metrics that are counts, not fractions: not averaged onto the x 100 scale.
const COUNTS: [&str; 5] = [
    "met",
    "criteria",
    "sections",
    "citations",
    "half_credit_citations",
];

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub name: String,
    pub id: uuid::Uuid,
    pub benchmark: String,
    pub items: usize,
    /// Items with a response to grade.
    pub responded: usize,
    /// Items whose responder produced no answer (with the first reasons).
    pub no_response: usize,
    pub no_response_reasons: BTreeMap<String, usize>,
    /// The headline: the first judge's score (x 100).
    pub score: Option<f64>,
    pub judges: Vec<JudgeSummary>,
    /// Krippendorff's alpha (interval) over item scores of the panel's judges.
    pub agreement_alpha: Option<f64>,
    /// Pearson correlation of item scores per pair of judges.
    pub agreement_pearson: Vec<(String, String, Option<f64>)>,
    pub model_tokens: i64,
    pub tool_calls_per_item: f64,
    pub judge_calls: usize,
    pub judge_calls_per_item: f64,
    pub judge_cost_usd: f64,
    pub seconds: f64,
    pub aggregation: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct JudgeSummary {
    pub judge: String,
    pub model: String,
    pub scored: usize,
    /// Items that could not be scored (judge failures after retries, no response): excluded
    /// from the mean.
    pub failed: usize,
    pub score: Option<f64>,
    pub std: Option<f64>,
    pub ci95: Option<(f64, f64)>,
    /// Further metrics on the same x 100 scale (EM, F1, dimensions, SimpleQA classes, ...);
    /// FACT's per-article counts (`fact_*_per_article`, `fact_articles*`) are plain counts.
    pub metrics: BTreeMap<String, f64>,
    /// Mean score per tag (theme, axis, cell, language, ...), with the items counted.
    pub breakdown: BTreeMap<String, (f64, usize)>,
    pub first_errors: Vec<String>,
}

pub(super) fn summarise(
    spec: &BenchRun,
    id: uuid::Uuid,
    responses: &HashMap<String, ResponseRow>,
    scores: &[ScoreRow],
    grades: &[GradeRow],
    seconds: f64,
) -> Summary {
    let n = spec.items.len();
    let mut no_response_reasons = BTreeMap::new();
    let mut responded = 0;
    for item in &spec.items {
        match responses.get(&item.id) {
            Some(r) if r.answer.is_some() => responded += 1,
            Some(r) => {
                let reason = r.error.clone().unwrap_or_else(|| r.finish_reason.clone());
                let key: String = reason.chars().take(80).collect();
                *no_response_reasons.entry(key).or_insert(0) += 1;
            }
            None => {
                *no_response_reasons
                    .entry("not generated".into())
                    .or_insert(0) += 1
            }
        }
    }
    let mut labels: Vec<(String, String)> = spec
        .judges
        .iter()
        .map(|j| (j.label.clone(), j.model().to_string()))
        .collect();
    if labels.is_empty() {
        labels.push((super::STRING_MATCH.into(), "none".into()));
    }
    let judges: Vec<JudgeSummary> = labels
        .iter()
        .map(|(label, model)| judge_summary(spec, label, model, scores))
        .collect();
    // Agreement over items every judge scored.
    let per_judge: Vec<HashMap<&str, f64>> = labels
        .iter()
        .map(|(l, _)| {
            scores
                .iter()
                .filter(|s| &s.judge == l)
                .filter_map(|s| s.score.map(|x| (s.item_id.as_str(), x)))
                .collect()
        })
        .collect();
    let (alpha, pearson) = if labels.len() > 1 {
        let units: Vec<Vec<Option<f64>>> = spec
            .items
            .iter()
            .map(|i| {
                per_judge
                    .iter()
                    .map(|m| m.get(i.id.as_str()).copied())
                    .collect()
            })
            .collect();
        let mut pairs = Vec::new();
        for a in 0..labels.len() {
            for b in a + 1..labels.len() {
                let (xs, ys): (Vec<f64>, Vec<f64>) = spec
                    .items
                    .iter()
                    .filter_map(|i| {
                        Some((
                            *per_judge[a].get(i.id.as_str())?,
                            *per_judge[b].get(i.id.as_str())?,
                        ))
                    })
                    .unzip();
                pairs.push((
                    labels[a].0.clone(),
                    labels[b].0.clone(),
                    stats::pearson(&xs, &ys),
                ));
            }
        }
        (stats::krippendorff_alpha_interval(&units), pairs)
    } else {
        (None, vec![])
    };
    let model_tokens = responses.values().map(|r| i64::from(r.model_tokens)).sum();
    let tool_calls: i64 = responses.values().map(|r| i64::from(r.tool_calls)).sum();
    let calls: usize = grades.iter().map(|g| g.attempts.max(0) as usize).sum();
    Summary {
        name: spec.name.clone(),
        id,
        benchmark: spec.bench.to_string(),
        items: n,
        responded,
        no_response: n - responded,
        no_response_reasons,
        score: judges.first().and_then(|j| j.score),
        judges,
        agreement_alpha: alpha,
        agreement_pearson: pearson,
        model_tokens,
        tool_calls_per_item: tool_calls as f64 / n.max(1) as f64,
        judge_calls: calls,
        judge_calls_per_item: calls as f64 / n.max(1) as f64,
        judge_cost_usd: grades.iter().map(|g| g.cost_usd).sum(),
        seconds,
        aggregation: aggregation_name(spec.bench, spec.opts.aggregation).into(),
    }
}

/// How the benchmark's number is aggregated over items.
pub fn aggregation_name(b: Benchmark, agg: Aggregation) -> &'static str {
    match b {
        _ if b.is_healthbench() => match agg {
            Aggregation::ClippedMean => {
                "clipped mean of unclipped per-example scores (simple-evals)"
            }
            Aggregation::PlainMean => "plain mean of unclipped per-example scores (DR Tulu)",
        },
        Benchmark::Simpleqa => "share CORRECT (three-class grader); F-score alongside",
        Benchmark::Drb => "mean RACE overall T/(T+R) over scored tasks",
        Benchmark::Researchqa => "mean coverage over scored queries",
        Benchmark::SqaCsV2 => {
            "mean global_avg = 1/4 (ingredient recall + answer precision + citation precision + citation recall)"
        }
        _ => "mean over scored items",
    }
}

fn judge_summary(spec: &BenchRun, label: &str, model: &str, scores: &[ScoreRow]) -> JudgeSummary {
    let mine: Vec<&ScoreRow> = scores.iter().filter(|s| s.judge == label).collect();
    let by_item: HashMap<&str, &ScoreRow> = mine.iter().map(|s| (s.item_id.as_str(), *s)).collect();
    let values: Vec<f64> = spec
        .items
        .iter()
        .filter_map(|i| by_item.get(i.id.as_str()).and_then(|s| s.score))
        .collect();
    let hb = spec.bench.is_healthbench();
    let agg = if hb {
        spec.opts.aggregation
    } else {
        Aggregation::PlainMean
    };
    let clip = (hb && agg == Aggregation::ClippedMean).then_some((0.0, 1.0));
    let score = formula::aggregate(&values, agg);
    let boot = stats::bootstrap(&values, spec.bootstrap, spec.seed, clip);
    let mut metrics = BTreeMap::new();
    let mut breakdown: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    // Per example-level tag: the item scores (aggregated like the headline).
    let mut tag_values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for item in &spec.items {
        let Some(s) = by_item.get(item.id.as_str()) else {
            continue;
        };
        if let Some(x) = s.score {
            for t in &item.tags {
                tag_values.entry(t.clone()).or_default().push(x);
            }
        }
        // Rubric-level tags (HealthBench axes, ResearchRubrics axes).
        if let Some(Value::Object(tags)) = s.metrics.get("tags") {
            for (t, v) in tags {
                if let Some(x) = v.as_f64() {
                    tag_values.entry(t.clone()).or_default().push(x);
                }
            }
        }
    }
    for (t, v) in tag_values {
        if let Some(m) = formula::aggregate(&v, agg) {
            breakdown.insert(t, (m * SCALE, v.len()));
        }
    }
    // Means of numeric / boolean per-item metrics (EM, F1, dimensions, ...).
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for s in &mine {
        let mut add = |k: String, x: f64| {
            let e = sums.entry(k).or_insert((0.0, 0));
            e.0 += x;
            e.1 += 1;
        };
        if let Value::Object(m) = &s.metrics {
            for (k, v) in m {
                match v {
                    Value::Bool(b) => add(k.clone(), f64::from(u8::from(*b))),
                    Value::Number(x) if !COUNTS.contains(&k.as_str()) => {
                        add(k.clone(), x.as_f64().unwrap_or(0.0))
                    }
                    Value::Object(o) if k == "dims" => {
                        for (d, x) in o {
                            if let Some(x) = x.as_f64() {
                                add(format!("dim:{d}"), x);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    for (k, (s, c)) in sums {
        if c > 0 && !matches!(k.as_str(), "target" | "reference") {
            metrics.insert(k, s / c as f64 * SCALE);
        }
    }
    if spec.bench == Benchmark::Simpleqa {
        let classes: Vec<ThreeClass> = mine
            .iter()
            .filter_map(|s| match s.metrics.get("class").and_then(Value::as_str) {
                Some("Correct") => Some(ThreeClass::Correct),
                Some("Incorrect") => Some(ThreeClass::Incorrect),
                Some("NotAttempted") => Some(ThreeClass::NotAttempted),
                _ => None,
            })
            .collect();
        let m = formula::simpleqa(&classes);
        metrics.insert("correct".into(), m.correct * SCALE);
        metrics.insert("incorrect".into(), m.incorrect * SCALE);
        metrics.insert("not_attempted".into(), m.not_attempted * SCALE);
        metrics.insert(
            "accuracy_given_attempted".into(),
            m.accuracy_given_attempted * SCALE,
        );
        metrics.insert("f_score".into(), m.f_score * SCALE);
    }
    if spec.bench == Benchmark::Drb && spec.opts.fact != super::FactPages::Off {
        // FACT pools over articles (not a mean of item scores): accuracy on the x 100 scale;
        // effective citations and citations per article are counts per article, as published.
        let tallies: Vec<cite::FactTally> = mine
            .iter()
            .filter_map(|s| serde_json::from_value(s.metrics.get("fact")?.clone()).ok())
            .collect();
        let f = cite::fact_summary(&tallies);
        metrics.insert("fact_articles".into(), tallies.len() as f64);
        metrics.insert(
            "fact_articles_with_citations".into(),
            f.articles_with_citations as f64,
        );
        if let Some(a) = f.citation_accuracy {
            metrics.insert("fact_citation_accuracy".into(), a * SCALE);
        }
        if let Some(e) = f.effective_citations {
            metrics.insert("fact_effective_citations_per_article".into(), e);
        }
        if let Some(c) = f.citations_per_article {
            metrics.insert("fact_citations_per_article".into(), c);
        }
        let failed = mine
            .iter()
            .filter(|s| s.metrics.get("fact_error").is_some())
            .count();
        metrics.insert("fact_extraction_failed".into(), failed as f64);
    }
    let first_errors: Vec<String> = mine
        .iter()
        .filter_map(|s| s.error.as_ref().map(|e| format!("{}: {e}", s.item_id)))
        .take(5)
        .collect();
    JudgeSummary {
        judge: label.to_string(),
        model: model.to_string(),
        scored: values.len(),
        failed: spec.items.len() - values.len(),
        score: score.map(|x| x * SCALE),
        std: boot.as_ref().map(|b| b.std * SCALE),
        ci95: boot.as_ref().map(|b| (b.lo * SCALE, b.hi * SCALE)),
        metrics,
        breakdown,
        first_errors,
    }
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.1}")).unwrap_or_else(|| "—".into())
}

impl Summary {
    /// The table printed after an evaluation (papers' layout: the benchmark column per judge).
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "evaluation `{}` ({}) on {}: {} items, {} with a response\n",
            self.name, self.id, self.benchmark, self.items, self.responded
        ));
        for (reason, k) in &self.no_response_reasons {
            s.push_str(&format!("  no response x{k}: {reason}\n"));
        }
        s.push_str(&format!("aggregation: {}\n\n", self.aggregation));
        s.push_str(&format!(
            "| judge | {} (x100) | 95% CI | scored | failed |\n|---|---|---|---|---|\n",
            self.benchmark
        ));
        for j in &self.judges {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                j.judge,
                fmt_opt(j.score),
                j.ci95
                    .map(|(a, b)| format!("[{a:.1}, {b:.1}]"))
                    .unwrap_or_else(|| "—".into()),
                j.scored,
                j.failed
            ));
        }
        for j in &self.judges {
            if !j.metrics.is_empty() {
                s.push_str(&format!("\nmetrics ({}):\n", j.judge));
                for (k, v) in &j.metrics {
                    s.push_str(&format!("  {k:<28} {v:>7.1}\n"));
                }
            }
            if !j.breakdown.is_empty() {
                s.push_str(&format!("breakdown ({}):\n", j.judge));
                for (k, (v, n)) in &j.breakdown {
                    s.push_str(&format!("  {k:<48} {v:>7.1}  (n={n})\n"));
                }
            }
            for e in &j.first_errors {
                s.push_str(&format!("  unscored: {e}\n"));
            }
        }
        if let Some(a) = self.agreement_alpha {
            s.push_str(&format!("\npanel agreement: Krippendorff's alpha {a:.3}\n"));
        }
        for (a, b, r) in &self.agreement_pearson {
            s.push_str(&format!(
                "  pearson({a}, {b}) = {}\n",
                r.map(|x| format!("{x:.3}")).unwrap_or_else(|| "—".into())
            ));
        }
        s.push_str(&format!(
            "\nmodel tokens {}, tool calls/item {:.2}, judge calls {} ({:.2}/item), judge cost ${:.4}, wall {:.1} s\n",
            self.model_tokens,
            self.tool_calls_per_item,
            self.judge_calls,
            self.judge_calls_per_item,
            self.judge_cost_usd,
            self.seconds
        ));
        s
    }

    /// The same as markdown (the `--out` report).
    pub fn markdown(&self) -> String {
        format!(
            "# Evaluation `{}`: {}\n\n```\n{}```\n",
            self.name,
            self.benchmark,
            self.render()
        )
    }
}

/// Bars of the score per judge, then the first judge's breakdown (x 100), as SVG and PNG.
pub fn plot(summary: &Summary, svg: &std::path::Path, png: &std::path::Path) -> Result<(), String> {
    use plotters::prelude::IntoDrawingArea;
    let mut bars: Vec<(String, f64)> = summary
        .judges
        .iter()
        .filter_map(|j| j.score.map(|s| (j.judge.clone(), s)))
        .collect();
    if let Some(j) = summary.judges.first() {
        bars.extend(j.breakdown.iter().map(|(k, (v, _))| (k.clone(), *v)));
    }
    crate::pipeline::report::font_registered();
    let title = format!("{} ({})", summary.benchmark, summary.name);
    draw_bars(
        plotters::prelude::SVGBackend::new(svg, (1000, 560)).into_drawing_area(),
        &title,
        &bars,
    )?;
    draw_bars(
        plotters::prelude::BitMapBackend::new(png, (1000, 560)).into_drawing_area(),
        &title,
        &bars,
    )
}

fn draw_bars<DB: plotters::prelude::DrawingBackend>(
    root: plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    bars: &[(String, f64)],
) -> Result<(), String> {
    use plotters::prelude::*;
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let lo = bars.iter().map(|b| b.1).fold(0.0f64, f64::min);
    let hi = bars.iter().map(|b| b.1).fold(100.0f64, f64::max);
    let n = bars.len().max(1);
    let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(150)
        .y_label_area_size(48)
        .build_cartesian_2d(0.0..n as f64, lo..hi)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            names.get(i).cloned().unwrap_or_default()
        })
        .y_desc("score x 100")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let color = Palette99::pick(i).filled();
            Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, *v)], color)
        }))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
