//! The LLM judge: prompts from `prompts/judge/`, JSON-schema structured output parsed with serde
//! and validated (every rubric scored once, scores in 0..=2, weights in 1..=3), retried with
//! backoff through the client (garbage, partial JSON, 429, 5xx and timeouts all retry), with
//! per-endpoint concurrency from the endpoint pool and tokens and cost accounted per call.
//! Scoring is one call per trajectory (`rubric_scores`: every rubric, with justifications), or
//! DR Tulu's one call per (trajectory, rubric) (`rubric_score`: question, answer text and one
//! criterion in, `{"score": 0|1|2}` out; method.md B.2, drtulu.md 2.3), or on DeepRubric's
//! 0-4 scale (`rubric_score_4`, method.md C.5).

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use futures::future::BoxFuture;
use minijinja::Environment;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::domain::judge::{
    Claim, ClaimVerdict, Finding, Generated, Judge, JudgeError, JudgeKind, NewRubric,
    ReflectionGrade, Rubric, RubricScore, ScoreMode, Scoring, TraceView, Usage,
};
use crate::domain::trajectory::Stage;
use crate::infra::llm::{
    ChatMessage, ChatRequest, LlmClient, LlmError, ResponseFormat, Structured,
};

const SYSTEM: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/judge/system.txt"
));
const GENERATE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/judge/generate.jinja"
));
const SCORE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/judge/score.jinja"
));
const GROUND: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/judge/ground.jinja"
));
const CLAIMS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/judge/claims.jinja"
));
const REFLECT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../prompts/judge/reflect.jinja"
));

/// Prices and limits of one judge endpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlmJudgeOptions {
    /// USD per million prompt / completion tokens (0 for self-hosted judges).
    pub usd_per_mtok_prompt: f64,
    pub usd_per_mtok_completion: f64,
    /// Each stage's text is cut to this many bytes (head and tail kept) in judge prompts.
    pub max_stage_chars: usize,
    pub max_tokens: u32,
    pub temperature: f32,
}

impl Default for LlmJudgeOptions {
    fn default() -> Self {
        Self {
            usd_per_mtok_prompt: 0.0,
            usd_per_mtok_completion: 0.0,
            max_stage_chars: 12_000,
            max_tokens: 4096,
            temperature: 0.0,
        }
    }
}

pub struct LlmJudge {
    client: LlmClient,
    opts: LlmJudgeOptions,
    env: Environment<'static>,
}

impl std::fmt::Debug for LlmJudge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmJudge")
            .field("model", &self.client.model())
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

// ---- response shapes ----

#[derive(Debug, Deserialize)]
struct RubricItem {
    #[serde(default)]
    title: String,
    description: String,
    weight: f64,
}

#[derive(Debug, Deserialize)]
struct StageLists {
    #[serde(default)]
    positive_rubrics: Vec<RubricItem>,
    #[serde(default)]
    negative_rubrics: Vec<RubricItem>,
}

#[derive(Debug, Deserialize)]
struct GenerateOut {
    stage_1: StageLists,
    stage_2: StageLists,
    stage_3: StageLists,
    stage_4: StageLists,
}

#[derive(Debug, Deserialize)]
struct ScoreItem {
    index: usize,
    score: u8,
    #[serde(default)]
    justification: String,
}

#[derive(Debug, Deserialize)]
struct ScoreOut {
    scores: Vec<ScoreItem>,
}

/// DR Tulu's per-rubric verdict.
#[derive(Debug, Deserialize)]
struct PointOut {
    score: u8,
}

#[derive(Debug, Deserialize)]
struct GroundItem {
    #[serde(default)]
    title: String,
    description: String,
    #[serde(default)]
    citations: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct GroundOut {
    answer_critical: Vec<GroundItem>,
    #[serde(default)]
    valuable: Vec<GroundItem>,
    #[serde(default)]
    context: Vec<GroundItem>,
}

#[derive(Debug, Deserialize)]
struct ClaimItem {
    index: usize,
    support: String,
    relevant: bool,
}

#[derive(Debug, Deserialize)]
struct ClaimsOut {
    claims: Vec<ClaimItem>,
}

fn item_schema(extra: &[(&str, serde_json::Value)]) -> serde_json::Value {
    let mut props = serde_json::Map::new();
    props.insert("title".into(), json!({"type": "string"}));
    props.insert("description".into(), json!({"type": "string"}));
    let mut required = vec![json!("title"), json!("description")];
    for (k, v) in extra {
        props.insert((*k).into(), v.clone());
        required.push(json!(k));
    }
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn generate_schema() -> serde_json::Value {
    let item = item_schema(&[("weight", json!({"type": "integer", "enum": [1, 2, 3]}))]);
    let lists = json!({
        "type": "object",
        "properties": {
            "positive_rubrics": {"type": "array", "items": item},
            "negative_rubrics": {"type": "array", "items": item}
        },
        "required": ["positive_rubrics", "negative_rubrics"],
        "additionalProperties": false
    });
    json!({
        "type": "object",
        "properties": {"stage_1": lists, "stage_2": lists, "stage_3": lists, "stage_4": lists},
        "required": ["stage_1", "stage_2", "stage_3", "stage_4"],
        "additionalProperties": false
    })
}

fn score_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {"scores": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "index": {"type": "integer"},
                "score": {"type": "integer", "enum": [0, 1, 2]},
                "justification": {"type": "string"}
            },
            "required": ["index", "score", "justification"],
            "additionalProperties": false
        }}},
        "required": ["scores"],
        "additionalProperties": false
    })
}

/// `{"score": 0..=scale}`.
fn point_schema_to(scale: u8) -> serde_json::Value {
    let values: Vec<u8> = (0..=scale).collect();
    json!({
        "type": "object",
        "properties": {"score": {"type": "integer", "enum": values}},
        "required": ["score"],
        "additionalProperties": false
    })
}

fn ground_schema() -> serde_json::Value {
    let item = item_schema(&[(
        "citations",
        json!({"type": "array", "items": {"type": "string"}}),
    )]);
    let list = json!({"type": "array", "items": item});
    json!({
        "type": "object",
        "properties": {"answer_critical": list, "valuable": list, "context": list},
        "required": ["answer_critical", "valuable", "context"],
        "additionalProperties": false
    })
}

fn claims_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {"claims": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "index": {"type": "integer"},
                "support": {"type": "string", "enum": ["full", "partial", "none"]},
                "relevant": {"type": "boolean"}
            },
            "required": ["index", "support", "relevant"],
            "additionalProperties": false
        }}},
        "required": ["claims"],
        "additionalProperties": false
    })
}

#[derive(Debug, Deserialize)]
struct ReflectItem {
    index: usize,
    diagnostic_accuracy: f64,
    specificity: f64,
    scope: f64,
}

#[derive(Debug, Deserialize)]
struct ReflectOut {
    reflections: Vec<ReflectItem>,
}

fn reflect_schema() -> serde_json::Value {
    let unit = json!({"type": "number", "minimum": 0, "maximum": 1});
    json!({
        "type": "object",
        "properties": {"reflections": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "index": {"type": "integer"},
                "diagnostic_accuracy": unit,
                "specificity": unit,
                "scope": unit
            },
            "required": ["index", "diagnostic_accuracy", "specificity", "scope"],
            "additionalProperties": false
        }}},
        "required": ["reflections"],
        "additionalProperties": false
    })
}

/// Each index in 0..n exactly once.
fn check_indices(what: &str, idx: impl Iterator<Item = usize>, n: usize) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for i in idx {
        if i >= n {
            return Err(format!("{what} index {i} is out of range; allowed: 0..{n}"));
        }
        if !seen.insert(i) {
            return Err(format!("{what} index {i} appears twice"));
        }
    }
    if seen.len() != n {
        let missing: Vec<String> = (0..n)
            .filter(|i| !seen.contains(i))
            .map(|i| i.to_string())
            .collect();
        return Err(format!("{what} indices missing: {}", missing.join(", ")));
    }
    Ok(())
}

fn check_items(items: &[&RubricItem]) -> Result<(), String> {
    for it in items {
        if it.description.trim().is_empty() {
            return Err("a rubric has an empty description".into());
        }
        if !(1.0..=3.0).contains(&it.weight) {
            return Err(format!(
                "rubric weight {} is out of range; allowed: 1, 2, 3",
                it.weight
            ));
        }
    }
    Ok(())
}

impl LlmJudge {
    /// One criterion judged on the judged text alone (DR Tulu passes the rubric's description;
    /// a rubric without one falls back to its title), on 0/1/2 (`scale` 2) or DeepRubric's 0-4
    /// (`scale` 4, its own prompt and schema).
    async fn score_point(
        &self,
        question: &str,
        trace: &TraceView,
        rubric: &Rubric,
        mode: ScoreMode,
        scale: u8,
    ) -> Result<(RubricScore, Usage), JudgeError> {
        let text = trace.text_for(rubric.stage, mode);
        let text = if text.trim().is_empty() {
            "(empty)"
        } else {
            text
        };
        let criterion = if rubric.description.trim().is_empty() {
            &rubric.title
        } else {
            &rubric.description
        };
        let clipped = crate::domain::judge::view::clip_middle(text, self.opts.max_stage_chars);
        let (name, schema_name, max, prompt) = if scale == 4 {
            (
                "rubric_4",
                "rubric_score_4",
                4u8,
                crate::infra::prompts::judge_rubric_prompt_4(question, &clipped, criterion),
            )
        } else {
            (
                "rubric",
                "rubric_score",
                2u8,
                crate::infra::prompts::judge_rubric_prompt(question, &clipped, criterion),
            )
        };
        let user = prompt.map_err(|e| JudgeError::Prompt {
            name,
            message: e.to_string(),
        })?;
        let (out, usage): (PointOut, Usage) = self
            .call(schema_name, point_schema_to(max), user, |p: &PointOut| {
                if p.score > max {
                    Err(format!(
                        "score {} is out of range; allowed: 0..={max}",
                        p.score
                    ))
                } else {
                    Ok(())
                }
            })
            .await?;
        Ok((
            RubricScore {
                rubric_id: rubric.id,
                score: out.score,
                justification: String::new(),
            },
            usage,
        ))
    }

    pub fn new(client: LlmClient, opts: LlmJudgeOptions) -> Result<Self, JudgeError> {
        let mut env = crate::infra::prompts::environment();
        for (name, src) in [
            ("generate", GENERATE),
            ("score", SCORE),
            ("ground", GROUND),
            ("claims", CLAIMS),
            ("reflect", REFLECT),
        ] {
            env.add_template(name, src)
                .map_err(|e| JudgeError::Prompt {
                    name,
                    message: e.to_string(),
                })?;
        }
        Ok(Self { client, opts, env })
    }

    fn render(&self, name: &'static str, ctx: minijinja::Value) -> Result<String, JudgeError> {
        self.env
            .get_template(name)
            .and_then(|t| t.render(ctx))
            .map_err(|e| JudgeError::Prompt {
                name,
                message: e.to_string(),
            })
    }

    /// One structured call with accounting; retries happen inside the client.
    async fn call<T, V>(
        &self,
        schema_name: &str,
        schema: serde_json::Value,
        user: String,
        validate: V,
    ) -> Result<(T, Usage), JudgeError>
    where
        T: DeserializeOwned,
        V: Fn(&T) -> Result<(), String>,
    {
        let req = ChatRequest {
            model: self.client.model().to_string(),
            messages: vec![ChatMessage::system(SYSTEM.trim()), ChatMessage::user(user)],
            temperature: self.opts.temperature,
            max_tokens: self.opts.max_tokens,
            response_format: Some(ResponseFormat::json_schema(schema_name, schema)),
            seed: None,
            stop: Vec::new(),
        };
        let t0 = Instant::now();
        match self.client.chat_structured::<T, V>(&req, validate).await {
            Ok((
                Structured {
                    value,
                    raw,
                    attempts,
                },
                _,
            )) => {
                let p = raw.usage.prompt_tokens;
                let c = raw.usage.completion_tokens;
                let usage = Usage {
                    prompt_tokens: p.min(u64::from(u32::MAX)) as u32,
                    completion_tokens: c.min(u64::from(u32::MAX)) as u32,
                    cost_usd: raw.usage.cost_usd(
                        self.opts.usd_per_mtok_prompt,
                        self.opts.usd_per_mtok_completion,
                    ),
                    attempts,
                    latency_ms: t0.elapsed().as_millis().min(u128::from(u32::MAX)) as u32,
                };
                Ok((value, usage))
            }
            Err(e) => Err(JudgeError::Llm {
                attempts: attempts_made(&e, self.client.retry_policy().max_retries),
                source: std::sync::Arc::new(e),
            }),
        }
    }
}

/// Attempts a failed call made: all of them for a retryable error, one otherwise.
fn attempts_made(e: &LlmError, max_retries: u32) -> u32 {
    if e.is_retryable() { max_retries + 1 } else { 1 }
}

fn to_new(items: Vec<RubricItem>, negative: bool) -> impl Iterator<Item = NewRubric> {
    items.into_iter().map(move |it| NewRubric {
        title: it.title,
        description: it.description,
        weight: it.weight as f32,
        negative,
        key_terms: vec![],
    })
}

fn rubric_ctx(r: &Rubric) -> minijinja::Value {
    minijinja::context! {
        stage => r.stage.index() + 1,
        negative => r.negative,
        weight => r.weight,
        title => r.title,
        description => r.description,
    }
}

impl Judge for LlmJudge {
    fn model(&self) -> &str {
        self.client.model()
    }

    fn kind(&self) -> JudgeKind {
        JudgeKind::Llm
    }

    fn generate<'a>(
        &'a self,
        question: &'a str,
        rollouts: &'a [TraceView],
        existing: &'a [Rubric],
        stages: &'a [Stage],
    ) -> BoxFuture<'a, Result<Generated, JudgeError>> {
        Box::pin(async move {
            let only = if stages.len() == 4 {
                String::new()
            } else {
                stages
                    .iter()
                    .map(|s| (s.index() + 1).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let user = self.render(
                "generate",
                minijinja::context! {
                    question => question,
                    existing => existing.iter().map(rubric_ctx).collect::<Vec<_>>(),
                    rollouts => rollouts.iter().map(|t| t.render(self.opts.max_stage_chars)).collect::<Vec<_>>(),
                    only_stages => only,
                },
            )?;
            let (out, usage): (GenerateOut, Usage) = self
                .call(
                    "stage_rubrics",
                    generate_schema(),
                    user,
                    |g: &GenerateOut| {
                        let all: Vec<&RubricItem> =
                            [&g.stage_1, &g.stage_2, &g.stage_3, &g.stage_4]
                                .iter()
                                .flat_map(|s| s.positive_rubrics.iter().chain(&s.negative_rubrics))
                                .collect();
                        check_items(&all)
                    },
                )
                .await?;
            let mut out_gen = Generated {
                usage,
                ..Generated::default()
            };
            for (k, lists) in [out.stage_1, out.stage_2, out.stage_3, out.stage_4]
                .into_iter()
                .enumerate()
            {
                if !stages.contains(&Stage::ALL[k]) {
                    continue; // a stage the caller did not ask for is ignored, not an error
                }
                out_gen.per_stage[k] = to_new(lists.positive_rubrics, false)
                    .chain(to_new(lists.negative_rubrics, true))
                    .collect();
            }
            Ok(out_gen)
        })
    }

    fn score<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        rubrics: &'a [Rubric],
        mode: ScoreMode,
    ) -> BoxFuture<'a, Result<Scoring, JudgeError>> {
        Box::pin(async move {
            if rubrics.is_empty() {
                return Ok(Scoring {
                    scores: vec![],
                    usage: Usage::default(),
                });
            }
            let answer_only = mode == ScoreMode::AnswerOnly;
            let shown = if answer_only {
                format!(
                    "### Final answer\n{}\n",
                    crate::domain::judge::view::clip_middle(
                        trace.answer.as_deref().unwrap_or("(no answer)"),
                        self.opts.max_stage_chars
                    )
                )
            } else {
                trace.render(self.opts.max_stage_chars)
            };
            let user = self.render(
                "score",
                minijinja::context! {
                    question => question,
                    trace => shown,
                    rubrics => rubrics.iter().map(rubric_ctx).collect::<Vec<_>>(),
                    answer_only => answer_only,
                },
            )?;
            let n = rubrics.len();
            let (out, usage): (ScoreOut, Usage) = self
                .call("rubric_scores", score_schema(), user, |s: &ScoreOut| {
                    if let Some(bad) = s.scores.iter().find(|x| x.score > 2) {
                        return Err(format!(
                            "score {} for rubric {} is out of range; allowed: 0, 1, 2",
                            bad.score, bad.index
                        ));
                    }
                    check_indices("rubric", s.scores.iter().map(|x| x.index), n)
                })
                .await?;
            let mut scores: Vec<RubricScore> = out
                .scores
                .into_iter()
                .map(|x| RubricScore {
                    rubric_id: rubrics[x.index].id,
                    score: x.score,
                    justification: x.justification,
                })
                .collect();
            scores.sort_by_key(|s| rubrics.iter().position(|r| r.id == s.rubric_id));
            Ok(Scoring { scores, usage })
        })
    }

    fn score_rubric<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        rubric: &'a Rubric,
        mode: ScoreMode,
    ) -> BoxFuture<'a, Result<(RubricScore, Usage), JudgeError>> {
        Box::pin(self.score_point(question, trace, rubric, mode, 2))
    }

    fn score_rubric_on<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        rubric: &'a Rubric,
        mode: ScoreMode,
        scale: u8,
    ) -> BoxFuture<'a, Result<(RubricScore, Usage), JudgeError>> {
        Box::pin(self.score_point(question, trace, rubric, mode, scale))
    }

    fn ground<'a>(
        &'a self,
        question: &'a str,
        snippets: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<Generated, JudgeError>> {
        Box::pin(async move {
            let user = self.render(
                "ground",
                minijinja::context! { question => question, snippets => snippets },
            )?;
            let (out, usage): (GroundOut, Usage) = self
                .call(
                    "persistent_rubrics",
                    ground_schema(),
                    user,
                    |g: &GroundOut| {
                        if g.answer_critical.is_empty() {
                            return Err("no answer_critical items".into());
                        }
                        match g
                            .answer_critical
                            .iter()
                            .chain(&g.valuable)
                            .chain(&g.context)
                            .find(|i| i.description.trim().is_empty())
                        {
                            Some(_) => Err("an item has an empty description".into()),
                            None => Ok(()),
                        }
                    },
                )
                .await?;
            // Answer Critical / Valuable / Context map to weights 3 / 2 / 1 (method.md A.4.4:
            // persistent weights live on the {1, 2, 3} scale).
            let mut out_gen = Generated {
                usage,
                ..Generated::default()
            };
            for (items, w) in [
                (out.answer_critical, 3.0),
                (out.valuable, 2.0),
                (out.context, 1.0),
            ] {
                for it in items {
                    let mut description = it.description;
                    if !it.citations.is_empty() {
                        description.push_str(&format!(" (sources: {})", it.citations.join(", ")));
                    }
                    out_gen.per_stage[Stage::Answer.index()].push(NewRubric {
                        title: it.title,
                        description,
                        weight: w,
                        negative: false,
                        key_terms: vec![],
                    });
                }
            }
            Ok(out_gen)
        })
    }

    fn claims<'a>(
        &'a self,
        question: &'a str,
        claims: &'a [Claim],
        snippets: &'a HashMap<String, String>,
    ) -> BoxFuture<'a, Result<(Vec<ClaimVerdict>, Usage), JudgeError>> {
        Box::pin(async move {
            if claims.is_empty() {
                return Ok((vec![], Usage::default()));
            }
            // Only the snippets the claims cite are shown (sorted for a stable prompt).
            let mut cited: Vec<(String, String)> = claims
                .iter()
                .flat_map(|c| c.ids.iter())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter_map(|id| snippets.get(id).map(|t| (id.clone(), t.clone())))
                .collect();
            cited.sort();
            let user = self.render(
                "claims",
                minijinja::context! { question => question, snippets => cited, claims => claims },
            )?;
            let n = claims.len();
            let (out, usage): (ClaimsOut, Usage) = self
                .call("citation_claims", claims_schema(), user, |c: &ClaimsOut| {
                    if let Some(b) = c
                        .claims
                        .iter()
                        .find(|x| !matches!(x.support.as_str(), "full" | "partial" | "none"))
                    {
                        return Err(format!(
                            "support `{}` is not one of full, partial, none",
                            b.support
                        ));
                    }
                    check_indices("claim", c.claims.iter().map(|x| x.index), n)
                })
                .await?;
            let mut verdicts = vec![
                ClaimVerdict {
                    support: 0.0,
                    relevance: 0.0
                };
                n
            ];
            for it in out.claims {
                let cited = !claims[it.index].ids.is_empty();
                let support = match it.support.as_str() {
                    "full" => 1.0,
                    "partial" => 0.5,
                    _ => 0.0,
                };
                verdicts[it.index] = ClaimVerdict {
                    support,
                    relevance: if !cited || it.relevant { 1.0 } else { 0.0 },
                };
            }
            Ok((verdicts, usage))
        })
    }

    fn reflect<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        findings: &'a [Finding],
        candidates: &'a [String],
    ) -> BoxFuture<'a, Result<(Vec<ReflectionGrade>, Usage), JudgeError>> {
        Box::pin(async move {
            if candidates.is_empty() {
                return Ok((vec![], Usage::default()));
            }
            let findings: Vec<_> = findings
                .iter()
                .map(|f| {
                    minijinja::context! {
                        stage => f.stage.as_str(),
                        title => f.title,
                        score => f.score,
                        justification => f.justification,
                    }
                })
                .collect();
            let user = self.render(
                "reflect",
                minijinja::context! {
                    question => question,
                    trajectory => trace.render(self.opts.max_stage_chars),
                    findings => findings,
                    candidates => candidates,
                },
            )?;
            let n = candidates.len();
            let (out, usage): (ReflectOut, Usage) = self
                .call("reflection_grades", reflect_schema(), user, |r: &ReflectOut| {
                    for x in &r.reflections {
                        for (what, v) in [
                            ("diagnostic_accuracy", x.diagnostic_accuracy),
                            ("specificity", x.specificity),
                            ("scope", x.scope),
                        ] {
                            if !(0.0..=1.0).contains(&v) {
                                return Err(format!(
                                    "{what} {v} of reflection {} is out of range; allowed: 0..=1",
                                    x.index
                                ));
                            }
                        }
                    }
                    check_indices("reflection", r.reflections.iter().map(|x| x.index), n)
                })
                .await?;
            let mut grades = vec![ReflectionGrade::default(); n];
            for x in out.reflections {
                grades[x.index] = ReflectionGrade {
                    diagnostic_accuracy: x.diagnostic_accuracy,
                    specificity: x.specificity,
                    scope: x.scope,
                };
            }
            Ok((grades, usage))
        })
    }
}

/// The judge a configuration asks for: the LLM judge behind `judge.urls`, or the lexical judge.
pub fn from_config(
    cfg: &crate::domain::config::Config,
) -> Result<std::sync::Arc<dyn Judge>, JudgeError> {
    use crate::domain::config::JudgeKind as Kind;
    match cfg.judge.kind {
        Kind::Lexical => Ok(std::sync::Arc::new(
            crate::domain::judge::lexical::LexicalJudge::new(cfg.judge.model.clone()),
        )),
        Kind::Llm => {
            let setup = |e: LlmError| JudgeError::Llm {
                attempts: 0,
                source: std::sync::Arc::new(e),
            };
            let client =
                LlmClient::for_role(cfg, crate::infra::llm::Role::Judge, &cfg.judge.pool())
                    .map_err(setup)?;
            let opts = LlmJudgeOptions {
                usd_per_mtok_prompt: cfg.judge.usd_per_mtok_prompt,
                usd_per_mtok_completion: cfg.judge.usd_per_mtok_completion,
                max_stage_chars: cfg.judge.max_stage_chars,
                ..LlmJudgeOptions::default()
            };
            Ok(std::sync::Arc::new(LlmJudge::new(client, opts)?))
        }
    }
}
