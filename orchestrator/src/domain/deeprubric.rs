//! DeepRubric (method.md Part C): evidence trees grown from seed topics, query-rubric pairs
//! composed bottom-up from selected leaves, and their verification (KEEP / REVISE / DROP). This
//! module holds the values, the parsers of the LLM's replies, the validation of the paper's
//! constraints (each failure named), the statistics the paper reports, and the DeepRubric
//! reward. Pure: the stages that call the LLM and store live in `pipeline::deeprubric`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Tree limits (C.2): depth cap, node cap, sub-queries per node by depth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TreeLimits {
    pub max_depth: u8,
    pub max_nodes: usize,
    /// Passages retrieved per node.
    pub passages: usize,
    /// Characters kept of each passage.
    pub passage_chars: usize,
}

impl Default for TreeLimits {
    fn default() -> Self {
        TreeLimits {
            max_depth: 3,
            max_nodes: 50,
            passages: 5,
            passage_chars: 5000,
        }
    }
}

/// Sub-queries a node of `depth` may propose: root 6, depth 1 four, deeper three.
pub fn children_limit(depth: u8) -> usize {
    match depth {
        0 => 6,
        1 => 4,
        _ => 3,
    }
}

/// Whitespace tokens a sub-query may have (the paper: under 12 tokens).
pub const MAX_SUBQUERY_WORDS: usize = 11;

/// One node of an evidence tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// `N1`, `N2`, ... in creation order (`N1` is the root).
    pub id: String,
    pub parent: Option<String>,
    pub depth: u8,
    pub query: String,
    pub statements: Vec<String>,
    /// The passages the statements were extracted from: `{id, title, url}`.
    pub passages: Vec<Value>,
    /// `pending` (not processed), `expanded` (has children), `leaf`, `failed`.
    pub status: String,
    pub stop_reason: Option<String>,
}

/// Why a node is a leaf.
pub fn stop_reason(depth: u8, nodes: usize, limits: &TreeLimits) -> Option<String> {
    if depth >= limits.max_depth {
        Some(format!(
            "depth {depth} reached the cap {}",
            limits.max_depth
        ))
    } else if nodes >= limits.max_nodes {
        Some(format!(
            "the tree has {nodes} nodes, the cap is {}",
            limits.max_nodes
        ))
    } else {
        None
    }
}

/// A reply or a candidate that breaks a rule, named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("no JSON object in the reply: {0:?}")]
    NoJson(String),
    #[error("field `{field}`: {message}")]
    Field { field: String, message: String },
}

fn field(f: &str, m: impl Into<String>) -> Invalid {
    Invalid::Field {
        field: f.to_string(),
        message: m.into(),
    }
}

/// The first JSON object of a reply (fences and prose skipped).
pub fn object(text: &str) -> Result<Value, Invalid> {
    crate::domain::bench::parse::first_object(text)
        .ok_or_else(|| Invalid::NoJson(text.chars().take(120).collect()))
}

fn strings(v: &Value, f: &str) -> Result<Vec<String>, Invalid> {
    v.get(f)
        .and_then(Value::as_array)
        .ok_or_else(|| field(f, "missing or not a list"))?
        .iter()
        .map(|x| {
            x.as_str()
                .map(|s| s.trim().to_string())
                .ok_or_else(|| field(f, "an entry is not a string"))
        })
        .collect()
}

fn norm(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Statement extraction `{"statements": [...]}`: non-empty strings, deduplicated in order.
pub fn parse_statements(text: &str) -> Result<Vec<String>, Invalid> {
    let v = object(text)?;
    let mut seen = BTreeSet::new();
    Ok(strings(&v, "statements")?
        .into_iter()
        .filter(|s| !s.is_empty() && seen.insert(norm(s)))
        .collect())
}

/// The root page's `{"summary": str, "information_points": [...]}`: the summary first, then the
/// points, deduplicated; at least one statement.
pub fn parse_root(text: &str) -> Result<Vec<String>, Invalid> {
    let v = object(text)?;
    let summary = v["summary"]
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| field("summary", "missing or empty"))?;
    let mut seen = BTreeSet::from([norm(summary)]);
    let mut out = vec![summary.to_string()];
    out.extend(
        strings(&v, "information_points")?
            .into_iter()
            .filter(|s| !s.is_empty() && seen.insert(norm(s))),
    );
    Ok(out)
}

/// Characters of a seed page the root prompt shows (the paper: at most 15,000).
pub const ROOT_PAGE_CHARS: usize = 15_000;

/// The stop gate `{"branch": bool, "reason": str}`.
pub fn parse_gate(text: &str) -> Result<(bool, String), Invalid> {
    let v = object(text)?;
    let branch = v["branch"]
        .as_bool()
        .ok_or_else(|| field("branch", "missing or not a bool"))?;
    Ok((branch, v["reason"].as_str().unwrap_or("").to_string()))
}

/// Sub-query proposal `{"sub_queries": [...]}` for a node of `depth` asking `parent`: at most
/// the depth's limit, each short, distinct from the others and from the parent.
pub fn parse_subqueries(text: &str, depth: u8, parent: &str) -> Result<Vec<String>, Invalid> {
    let v = object(text)?;
    let qs = strings(&v, "sub_queries")?;
    let limit = children_limit(depth);
    if qs.len() > limit {
        return Err(field(
            "sub_queries",
            format!("{} proposed, at most {limit} at depth {depth}", qs.len()),
        ));
    }
    let mut seen = BTreeSet::from([norm(parent)]);
    for q in &qs {
        let words = q.split_whitespace().count();
        if words == 0 {
            return Err(field("sub_queries", "an empty sub-query"));
        }
        if words > MAX_SUBQUERY_WORDS {
            return Err(field(
                "sub_queries",
                format!("{q:?} has {words} words, at most {MAX_SUBQUERY_WORDS}"),
            ));
        }
        if !seen.insert(norm(q)) {
            return Err(field(
                "sub_queries",
                format!("{q:?} repeats the parent or another sub-query"),
            ));
        }
    }
    Ok(qs)
}

/// Rubric kinds of C.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RubricKind {
    Factual,
    Logical,
}

/// One rubric of a query-rubric pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrRubric {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: RubricKind,
    pub description: String,
    pub weight: f64,
    pub source_leaf_ids: Vec<String>,
    #[serde(default)]
    pub evidence: Vec<String>,
    /// Why a negative weight is kept (else the verifier's rule removes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negative_justification: Option<String>,
}

/// A composed query-rubric pair with its selection and merge traces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub question: String,
    pub selected_leaf_ids: Vec<String>,
    #[serde(default)]
    pub selection_trace: Vec<Value>,
    #[serde(default)]
    pub merge_trace: Vec<Value>,
    pub rubrics: Vec<DrRubric>,
}

/// The leaves of a tree by id, with their statements.
pub type Leaves = BTreeMap<String, Vec<String>>;

/// The share of an evidence string's content words found in `statements` (evidence must be
/// copied or tightly paraphrased from leaf statements).
pub fn evidence_support(evidence: &str, statements: &[&String]) -> f64 {
    let words: Vec<String> = crate::domain::judge::lexical::terms(evidence);
    if words.is_empty() {
        return 0.0;
    }
    let hay = statements
        .iter()
        .map(|s| s.to_lowercase())
        .collect::<Vec<_>>()
        .join(" ");
    words.iter().filter(|w| hay.contains(w.as_str())).count() as f64 / words.len() as f64
}

/// Least share of an evidence string's terms its source leaves must contain.
pub const EVIDENCE_SUPPORT: f64 = 0.6;

/// Check the rubrics of a pair against the selected leaves: `min..=max` rubrics, atomic
/// non-empty descriptions, distinct ids and descriptions, weights in [-1, 1], source leaves
/// non-empty and among the selected ones, factual rubrics with evidence found in their leaves.
pub fn check_rubrics(
    rubrics: &[DrRubric],
    selected: &BTreeSet<String>,
    leaves: &Leaves,
    count: std::ops::RangeInclusive<usize>,
) -> Result<(), Invalid> {
    if !count.contains(&rubrics.len()) {
        return Err(field(
            "rubrics",
            format!(
                "{} rubrics; {}..={} required",
                rubrics.len(),
                count.start(),
                count.end()
            ),
        ));
    }
    let mut ids = BTreeSet::new();
    let mut texts = BTreeSet::new();
    for r in rubrics {
        let name = format!("rubrics[{}]", r.id);
        if r.description.trim().is_empty() {
            return Err(field(&name, "empty description"));
        }
        if !ids.insert(r.id.clone()) || !texts.insert(norm(&r.description)) {
            return Err(field(&name, "repeats another rubric's id or description"));
        }
        if !(-1.0..=1.0).contains(&r.weight) || r.weight == 0.0 {
            return Err(field(
                &name,
                format!("weight {} is outside [-1, 1] or zero", r.weight),
            ));
        }
        if r.source_leaf_ids.is_empty() {
            return Err(field(&name, "no source_leaf_ids"));
        }
        if let Some(bad) = r.source_leaf_ids.iter().find(|l| !selected.contains(*l)) {
            return Err(field(
                &name,
                format!("source leaf {bad} is not among the selected leaves"),
            ));
        }
        if r.kind == RubricKind::Factual {
            if r.evidence.is_empty() {
                return Err(field(&name, "a factual rubric without evidence"));
            }
            let stmts: Vec<&String> = r
                .source_leaf_ids
                .iter()
                .filter_map(|l| leaves.get(l))
                .flatten()
                .collect();
            for e in &r.evidence {
                let s = evidence_support(e, &stmts);
                if s < EVIDENCE_SUPPORT {
                    return Err(field(
                        &name,
                        format!(
                            "evidence {e:?} is not in its source leaves' statements ({:.0}% of its terms found, {:.0}% required)",
                            s * 100.0,
                            EVIDENCE_SUPPORT * 100.0
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Parse and validate a co-generation reply against the tree's leaves: a self-contained
/// question that does not list its rubrics, selected leaves that exist, at least 5 rubrics.
pub fn parse_candidate(text: &str, leaves: &Leaves) -> Result<Candidate, Invalid> {
    let v = object(text)?;
    let c: Candidate = serde_json::from_value(v).map_err(|e| field("candidate", e.to_string()))?;
    if c.question.split_whitespace().count() < 5 {
        return Err(field("question", "shorter than 5 words"));
    }
    if c.rubrics
        .iter()
        .any(|r| c.question.contains(&r.description))
    {
        return Err(field("question", "lists a rubric"));
    }
    if c.selected_leaf_ids.is_empty() {
        return Err(field("selected_leaf_ids", "no leaf selected"));
    }
    if let Some(bad) = c
        .selected_leaf_ids
        .iter()
        .find(|l| !leaves.contains_key(*l))
    {
        return Err(field(
            "selected_leaf_ids",
            format!("{bad} is not a leaf of the tree"),
        ));
    }
    let selected: BTreeSet<String> = c.selected_leaf_ids.iter().cloned().collect();
    check_rubrics(&c.rubrics, &selected, leaves, 5..=12)?;
    Ok(c)
}

/// The verifier's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Decision {
    Keep,
    Revise,
    Drop,
}

/// A verification (C.4), validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub decision: Decision,
    #[serde(default)]
    pub error_tags: Vec<String>,
    #[serde(default)]
    pub major_issues: Vec<Value>,
    #[serde(default)]
    pub justification: String,
    #[serde(default)]
    pub revised_question: Option<String>,
    #[serde(default)]
    pub revised_rubrics: Option<Vec<DrRubric>>,
}

/// Parse a verification of `cand`: a REVISE must carry a repaired question and 5-8 valid
/// rubrics whose sources are among the selected leaves.
pub fn parse_verdict(text: &str, cand: &Candidate, leaves: &Leaves) -> Result<Verdict, Invalid> {
    let mut v = object(text)?;
    if let Some(d) = v.get_mut("decision")
        && let Some(s) = d.as_str()
    {
        *d = Value::String(s.trim().to_uppercase());
    }
    let verdict: Verdict =
        serde_json::from_value(v).map_err(|e| field("verdict", e.to_string()))?;
    if verdict.decision == Decision::Revise {
        let q = verdict
            .revised_question
            .as_deref()
            .filter(|q| q.split_whitespace().count() >= 5)
            .ok_or_else(|| field("revised_question", "missing or shorter than 5 words"))?;
        let rubrics = verdict
            .revised_rubrics
            .as_ref()
            .ok_or_else(|| field("revised_rubrics", "missing"))?;
        if rubrics.iter().any(|r| q.contains(&r.description)) {
            return Err(field("revised_question", "lists a rubric"));
        }
        let selected: BTreeSet<String> = cand.selected_leaf_ids.iter().cloned().collect();
        check_rubrics(rubrics, &selected, leaves, 5..=8)?;
    }
    Ok(verdict)
}

/// The pair a verdict leaves (none for DROP), with negative weights removed unless justified;
/// the removals are returned as revision reasons.
pub fn finalize(
    cand: &Candidate,
    verdict: &Verdict,
) -> Option<(String, Vec<DrRubric>, Vec<String>)> {
    let (q, rubrics) = match verdict.decision {
        Decision::Drop => return None,
        Decision::Keep => (cand.question.clone(), cand.rubrics.clone()),
        Decision::Revise => (
            verdict.revised_question.clone().unwrap_or_default(),
            verdict.revised_rubrics.clone().unwrap_or_default(),
        ),
    };
    let mut removed = Vec::new();
    let kept = rubrics
        .into_iter()
        .filter(|r| {
            let keep = r.weight > 0.0
                || r.negative_justification
                    .as_deref()
                    .is_some_and(|j| !j.trim().is_empty());
            if !keep {
                removed.push(format!("negative-weight removal: {}", r.id));
            }
            keep
        })
        .collect();
    Some((q, kept, removed))
}

/// A finished pair as a task row of the project's task format (usable by `run` and `eval`).
pub fn task_row(id: &str, question: &str, rubrics: &[DrRubric], meta: Value) -> Value {
    serde_json::json!({
        "id": id,
        "query": question,
        "answer_format": "long",
        "source": "deeprubric",
        "rubrics": rubrics.iter().map(|r| serde_json::json!({
            "title": format!("{} ({})", r.id, match r.kind { RubricKind::Factual => "factual", RubricKind::Logical => "logical" }),
            "description": r.description,
            "weight": r.weight,
            "evidence": r.evidence,
        })).collect::<Vec<_>>(),
        "deeprubric": meta,
    })
}

/// DeepRubric's rubric reward (C.5): per-criterion judge scores 0-4 normalised by 4,
/// `Σ w·s / Σ |w|`; `None` without weight.
pub fn rubric_reward(items: &[(f64, u8)]) -> Option<f64> {
    let denom: f64 = items.iter().map(|(w, _)| w.abs()).sum();
    (denom > 0.0).then(|| {
        items
            .iter()
            .map(|(w, s)| w * f64::from((*s).min(4)) / 4.0)
            .sum::<f64>()
            / denom
    })
}

/// The paper's composite: 0.5 rubric + 0.2 format + 0.2 citation + 0.1 search.
pub fn composite_reward(rubric: f64, format: f64, cite: f64, search: f64) -> f64 {
    0.5 * rubric + 0.2 * format + 0.2 * cite + 0.1 * search
}

/// The statistics the paper reports, over a build.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    pub trees: usize,
    pub trees_failed: usize,
    pub nodes_per_tree: f64,
    /// Mean seconds per tree spent retrieving and asking the LLM.
    pub tree_seconds: f64,
    /// Mean seconds per tree spent writing its nodes to Postgres.
    pub db_seconds_per_tree: f64,
    pub leaves_per_tree: f64,
    /// Leaves by depth.
    pub leaf_depths: BTreeMap<u8, usize>,
    pub items_composed: usize,
    pub items_failed: usize,
    pub leaves_per_item: f64,
    pub rubrics_per_item: f64,
    pub factual_share: f64,
    pub keep: usize,
    pub revise: usize,
    pub drop: usize,
    pub verify_failed: usize,
    /// Error tags of REVISE / DROP verdicts with their counts.
    pub reasons: BTreeMap<String, usize>,
    pub llm_calls: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
    /// Per stage (tree, compose, verify): LLM calls, prompt and completion tokens, cost.
    pub per_stage: BTreeMap<String, StageCost>,
}

/// What one stage spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StageCost {
    pub calls: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_usd: f64,
}

/// USD per million prompt and completion tokens (0 for a self-hosted LLM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    pub prompt: f64,
    pub completion: f64,
}

impl Stats {
    /// Count LLM use of `stage` (and in the totals) at `prices`.
    pub fn spend(&mut self, stage: &str, calls: i64, prompt: i64, completion: i64, prices: Prices) {
        let (c, p, k) = (
            calls.max(0) as u64,
            prompt.max(0) as u64,
            completion.max(0) as u64,
        );
        let usd = (p as f64 * prices.prompt + k as f64 * prices.completion) / 1e6;
        let e = self.per_stage.entry(stage.to_string()).or_default();
        e.calls += c;
        e.prompt_tokens += p;
        e.completion_tokens += k;
        e.cost_usd += usd;
        self.llm_calls += c;
        self.prompt_tokens += p;
        self.completion_tokens += k;
        self.cost_usd += usd;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves() -> Leaves {
        BTreeMap::from([
            (
                "N3".to_string(),
                vec!["Aspirin lowers platelet aggregation by inhibiting COX-1.".to_string()],
            ),
            (
                "N4".to_string(),
                vec![
                    "Low-dose aspirin raises gastrointestinal bleeding risk in older adults."
                        .to_string(),
                ],
            ),
        ])
    }

    fn rubric(id: &str, kind: RubricKind, leaf: &str, evidence: &[&str], weight: f64) -> DrRubric {
        DrRubric {
            id: id.into(),
            kind,
            description: format!("Criterion {id} about the mechanism and risk"),
            weight,
            source_leaf_ids: vec![leaf.into()],
            evidence: evidence.iter().map(|s| s.to_string()).collect(),
            negative_justification: None,
        }
    }

    #[test]
    fn subqueries_obey_limits_length_and_distinctness() {
        let ok =
            r#"{"sub_queries": ["aspirin bleeding risk", "aspirin mechanism", "cost of aspirin"]}"#;
        assert_eq!(parse_subqueries(ok, 2, "aspirin").unwrap().len(), 3);
        let many = r#"{"sub_queries": ["a b", "c d", "e f", "g h"]}"#;
        assert!(
            parse_subqueries(many, 2, "x")
                .unwrap_err()
                .to_string()
                .contains("at most 3 at depth 2")
        );
        assert!(parse_subqueries(many, 1, "x").is_ok());
        let long = r#"{"sub_queries": ["one two three four five six seven eight nine ten eleven twelve"]}"#;
        assert!(
            parse_subqueries(long, 0, "x")
                .unwrap_err()
                .to_string()
                .contains("12 words")
        );
        let dup = r#"{"sub_queries": ["Aspirin  risk", "aspirin risk"]}"#;
        assert!(
            parse_subqueries(dup, 0, "x")
                .unwrap_err()
                .to_string()
                .contains("repeats")
        );
        assert!(parse_subqueries(r#"{"sub_queries": ["Aspirin"]}"#, 0, "aspirin").is_err());
        assert!(parse_subqueries("no json", 0, "x").is_err());
    }

    #[test]
    fn rubric_constraints_are_named() {
        let l = leaves();
        let sel: BTreeSet<String> = ["N3".to_string(), "N4".to_string()].into();
        let good: Vec<DrRubric> = (1..=5)
            .map(|i| DrRubric {
                description: format!("Explains point {i}"),
                ..rubric(
                    &format!("R{i}"),
                    RubricKind::Factual,
                    "N3",
                    &["aspirin inhibits COX-1 and lowers platelet aggregation"],
                    0.5,
                )
            })
            .collect();
        check_rubrics(&good, &sel, &l, 5..=8).unwrap();
        let mut few = good.clone();
        few.pop();
        assert!(
            check_rubrics(&few, &sel, &l, 5..=8)
                .unwrap_err()
                .to_string()
                .contains("4 rubrics")
        );
        let mut outside = good.clone();
        outside[0].source_leaf_ids = vec!["N9".into()];
        assert!(
            check_rubrics(&outside, &sel, &l, 5..=8)
                .unwrap_err()
                .to_string()
                .contains("N9 is not among")
        );
        let mut invented = good.clone();
        invented[1].evidence = vec!["Aspirin cures migraines in children within an hour".into()];
        assert!(
            check_rubrics(&invented, &sel, &l, 5..=8)
                .unwrap_err()
                .to_string()
                .contains("not in its source leaves")
        );
        let mut no_ev = good.clone();
        no_ev[2].evidence.clear();
        assert!(
            check_rubrics(&no_ev, &sel, &l, 5..=8)
                .unwrap_err()
                .to_string()
                .contains("without evidence")
        );
        let mut logical = good.clone();
        logical[2].evidence.clear();
        logical[2].kind = RubricKind::Logical;
        check_rubrics(&logical, &sel, &l, 5..=8).unwrap();
        let mut heavy = good.clone();
        heavy[3].weight = 2.0;
        assert!(
            check_rubrics(&heavy, &sel, &l, 5..=8)
                .unwrap_err()
                .to_string()
                .contains("outside [-1, 1]")
        );
        let mut twice = good;
        twice[4].description = twice[0].description.to_uppercase();
        assert!(
            check_rubrics(&twice, &sel, &l, 5..=8)
                .unwrap_err()
                .to_string()
                .contains("repeats")
        );
    }

    #[test]
    fn verdicts_and_finalisation() {
        let l = leaves();
        let rubrics: Vec<DrRubric> = (1..=5)
            .map(|i| DrRubric {
                description: format!("Explains point {i}"),
                ..rubric(
                    &format!("R{i}"),
                    RubricKind::Logical,
                    "N4",
                    &[],
                    if i == 5 { -0.5 } else { 0.4 },
                )
            })
            .collect();
        let cand = Candidate {
            question: "How should older adults weigh aspirin's benefits against bleeding risks?"
                .into(),
            selected_leaf_ids: vec!["N3".into(), "N4".into()],
            selection_trace: vec![],
            merge_trace: vec![],
            rubrics: rubrics.clone(),
        };
        let keep = parse_verdict(
            r#"{"decision": "keep", "justification": "fine"}"#,
            &cand,
            &l,
        )
        .unwrap();
        let (q, kept, removed) = finalize(&cand, &keep).unwrap();
        assert_eq!(q, cand.question);
        assert_eq!(kept.len(), 4);
        assert_eq!(removed, vec!["negative-weight removal: R5"]);
        let bad_revise = r#"{"decision": "REVISE", "revised_question": "Short one"}"#;
        assert!(parse_verdict(bad_revise, &cand, &l).is_err());
        let revise = serde_json::json!({"decision": "REVISE", "error_tags": ["question-rubric mismatch"],
            "revised_question": "What do trials show about aspirin for primary prevention in older adults?",
            "revised_rubrics": rubrics}).to_string();
        let v = parse_verdict(&revise, &cand, &l).unwrap();
        assert_eq!(v.decision, Decision::Revise);
        let drop = parse_verdict(
            r#"{"decision": "DROP", "error_tags": ["noise"]}"#,
            &cand,
            &l,
        )
        .unwrap();
        assert!(finalize(&cand, &drop).is_none());
    }

    #[test]
    fn deeprubric_reward_uses_absolute_weights() {
        // (0.5·4/4 + 1.0·2/4 − 0.5·4/4) / 2.0
        let r = rubric_reward(&[(0.5, 4), (1.0, 2), (-0.5, 4)]).unwrap();
        assert!((r - 0.25).abs() < 1e-12);
        assert!(rubric_reward(&[]).is_none());
        assert!((composite_reward(1.0, 1.0, 0.0, 0.5) - 0.75).abs() < 1e-12);
    }
}
