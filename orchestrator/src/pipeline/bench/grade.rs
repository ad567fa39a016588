//! Grading: the grader kinds the benchmarks share, run as judge calls ("units") through the LLM
//! door with the templates of `prompts/eval/` (or a user's replacement), parsed tolerantly and
//! validated by `domain::bench::parse`, retried on a malformed reply, stored one by one; then
//! each item's score from its units with the benchmark's own formula. A unit that failed after
//! its attempts makes its item unscored (excluded from the mean and counted), never a silent 0.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::domain::bench::cite::{self, Source};
use crate::domain::bench::parse::{self, ParseError};
use crate::domain::bench::score::{self as formula, Aggregation};
use crate::domain::bench::text;
use crate::domain::bench::{Benchmark, Gold, Item};
use crate::domain::util::sha256_hex;
use crate::infra::db::bench::{GradeRow, ScoreRow};
use crate::infra::llm::{ChatMessage, ChatRequest, LlmClient};

/// One judge of the panel.
#[derive(Clone)]
pub struct JudgeSpec {
    /// How the judge is named in the stored rows and the report (model@host).
    pub label: String,
    pub client: LlmClient,
    pub temperature: f32,
    pub max_tokens: u32,
    pub usd_per_mtok_prompt: f64,
    pub usd_per_mtok_completion: f64,
}

impl JudgeSpec {
    /// A judge on one endpoint with the experiment's retry and health settings (the key read
    /// from the environment variable `key_env`), labelled `model@host:port`, at temperature 0 and
    /// 2,048 completion tokens, costing nothing unless priced.
    pub fn on_endpoint(
        cfg: &crate::domain::config::Config,
        http: reqwest::Client,
        url: &str,
        model: &str,
        key_env: Option<&str>,
        max_concurrency: usize,
        timeout_secs: u64,
    ) -> Result<Self, crate::infra::llm::LlmError> {
        let endpoint = crate::domain::config::EndpointPoolConfig {
            urls: vec![url.to_string()],
            model: model.to_string(),
            max_concurrency: u32::try_from(max_concurrency.max(1)).unwrap_or(u32::MAX),
            timeout_secs,
            api_key_env: key_env.map(str::to_string),
        };
        let client = LlmClient::from_config(
            http,
            crate::infra::llm::Role::Judge,
            &endpoint,
            &cfg.retry,
            &cfg.health,
        )?;
        let host = url::Url::parse(url)
            .ok()
            .and_then(|u| {
                let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
                u.host_str().map(|h| format!("{h}{port}"))
            })
            .unwrap_or_else(|| url.to_string());
        Ok(JudgeSpec {
            label: format!("{model}@{host}"),
            client,
            temperature: 0.0,
            max_tokens: 2048,
            usd_per_mtok_prompt: 0.0,
            usd_per_mtok_completion: 0.0,
        })
    }

    pub fn model(&self) -> &str {
        self.client.model()
    }

    pub fn describe(&self) -> Value {
        json!({
            "label": self.label,
            "model": self.model(),
            "urls": self.client.pool().endpoints().iter().map(|e| e.url.clone()).collect::<Vec<_>>(),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        })
    }
}

/// The grader templates in use, each with its sha256 (recorded per run and per call).
#[derive(Debug, Clone)]
pub struct Templates {
    map: BTreeMap<String, (String, String)>,
}

impl Templates {
    /// The embedded templates.
    pub fn embedded() -> Self {
        let map = crate::infra::prompts::EVAL_TEMPLATES
            .iter()
            .map(|(n, s)| (n.to_string(), (s.to_string(), sha256_hex(s.as_bytes()))))
            .collect();
        Templates { map }
    }

    /// Replace template `name` (e.g. with the benchmark's official grader prompt).
    pub fn replace(&mut self, name: &str, source: String) -> Result<(), String> {
        if !self.map.contains_key(name) {
            return Err(format!(
                "no grader template named `{name}`; known: {}",
                self.map.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        crate::infra::prompts::check_template(&source)
            .map_err(|e| format!("grader template `{name}` does not compile: {e}"))?;
        let sha = sha256_hex(source.as_bytes());
        self.map.insert(name.to_string(), (source, sha));
        Ok(())
    }

    pub fn sha(&self, name: &str) -> &str {
        self.map.get(name).map(|(_, h)| h.as_str()).unwrap_or("")
    }

    /// The hashes of the templates a benchmark uses.
    pub fn hashes(&self, names: &[&str]) -> BTreeMap<String, String> {
        names
            .iter()
            .map(|n| (n.to_string(), self.sha(n).to_string()))
            .collect()
    }

    fn render(&self, name: &str, ctx: minijinja::Value) -> Result<String, String> {
        let (source, _) = self
            .map
            .get(name)
            .ok_or_else(|| format!("no grader template `{name}`"))?;
        crate::infra::prompts::render(source, ctx)
            .map(|s| s.trim().to_string())
            .map_err(|e| format!("rendering grader template `{name}`: {e}"))
    }
}

/// How RACE's target article is cleaned of citations before the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Clean {
    /// One judge call per article, as the protocol does.
    Llm,
    /// Remove citation markers and reference lists locally (no call; not the protocol).
    Strip,
}

/// Grading options that move the published numbers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GradeOptions {
    /// HealthBench: OpenAI's clipped mean vs DR Tulu's plain mean.
    pub aggregation: Aggregation,
    /// ResearchRubrics: count "Partially Satisfied" as 0.5 (the paper's ternary) instead of 0.
    pub ternary: bool,
    /// ResearchQA rubric items per call (official 8, DR Tulu 10).
    pub coverage_batch: usize,
    pub clean: Clean,
    /// Attempts per judge call when the reply does not parse.
    pub parse_attempts: u32,
    /// DRB: FACT citation checking and where its pages come from.
    pub fact: FactPages,
    /// WebWalkerQA: the official CoT-QA grade (`GRADE: CORRECT|INCORRECT`, WebWalker's
    /// `evaluate.py`) instead of DR Tulu's yes/no equivalence judge (which RubricEM reports).
    pub webwalker_cot_qa: bool,
    /// FACT's page fetcher when `fact` is `browse` (the browse tool behind its address guard).
    #[serde(skip)]
    pub fetcher: Option<Arc<crate::infra::tools::browse::Browser>>,
}

/// DRB FACT: off, or the cited pages taken from the agent's trace (DR Tulu's scraped route), or
/// the trace first and then fetched with the browse tool (needs the network).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FactPages {
    Off,
    Trace,
    Browse,
}

/// Characters of a cited page shown to FACT's validation call.
pub const FACT_PAGE_CHARS: usize = 30_000;

impl Default for GradeOptions {
    fn default() -> Self {
        GradeOptions {
            aggregation: Aggregation::ClippedMean,
            ternary: false,
            coverage_batch: 8,
            clean: Clean::Llm,
            parse_attempts: 3,
            fact: FactPages::Off,
            webwalker_cot_qa: false,
            fetcher: None,
        }
    }
}

/// The template names a benchmark's graders use.
pub fn templates_of(bench: Benchmark, opts: &GradeOptions) -> Vec<&'static str> {
    match bench {
        Benchmark::Healthbench
        | Benchmark::HealthbenchHard
        | Benchmark::HealthbenchConsensus
        | Benchmark::Frontierscience => vec!["criterion"],
        Benchmark::Researchrubrics => vec!["verdict"],
        Benchmark::Researchqa => vec!["coverage"],
        Benchmark::Drb => {
            let mut t = match opts.clean {
                Clean::Llm => vec!["clean", "race"],
                Clean::Strip => vec!["race"],
            };
            if opts.fact != FactPages::Off {
                t.extend(["facts", "dedupe", "fact_support"]);
            }
            t
        }
        Benchmark::SqaCsV2 => vec!["ingredients", "precision", "citations"],
        Benchmark::Simpleqa => vec!["three_class"],
        Benchmark::TwoWiki | Benchmark::Hotpotqa | Benchmark::Musique | Benchmark::Bamboogle => {
            vec!["equivalence"]
        }
        Benchmark::Webwalker if opts.webwalker_cot_qa => vec!["cot_qa"],
        Benchmark::Webwalker => vec!["equivalence"],
    }
}

/// Stored grade units of an evaluation, keyed by (item, judge, unit, index).
pub type Stored = HashMap<(String, String, String, i32), GradeRow>;

/// Runs grade units against the judges, sharing one bound on judge calls in flight.
pub struct Grader {
    pub templates: Templates,
    pub opts: GradeOptions,
    pub sem: Arc<Semaphore>,
    pub stored: Stored,
    /// Where each new unit goes as soon as it is graded.
    pub sink: tokio::sync::mpsc::UnboundedSender<GradeRow>,
}

/// What one unit parses its reply into.
type Parser = Box<dyn Fn(&str) -> Result<Value, ParseError> + Send + Sync>;

impl Grader {
    /// One judge call with its parse attempts; a stored unit is returned as stored.
    #[allow(clippy::too_many_arguments)]
    async fn unit(
        &self,
        judge: &JudgeSpec,
        item: &str,
        unit: &str,
        index: i32,
        template: &str,
        ctx: minijinja::Value,
        parser: Parser,
    ) -> GradeRow {
        let key = (
            item.to_string(),
            judge.label.clone(),
            unit.to_string(),
            index,
        );
        // A unit graded before a resume is kept; one that failed is tried again.
        if let Some(g) = self.stored.get(&key).filter(|g| g.parsed.is_some()) {
            return g.clone();
        }
        let t0 = Instant::now();
        let mut row = GradeRow {
            item_id: item.to_string(),
            judge: judge.label.clone(),
            unit: unit.to_string(),
            unit_index: index,
            judge_model: judge.model().to_string(),
            template_sha256: self.templates.sha(template).to_string(),
            prompt_sha256: String::new(),
            parsed: None,
            raw: None,
            error: None,
            attempts: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            cost_usd: 0.0,
            seconds: 0.0,
        };
        let prompt = match self.templates.render(template, ctx) {
            Ok(p) => p,
            Err(e) => {
                row.error = Some(e);
                let _ = self.sink.send(row.clone());
                return row;
            }
        };
        row.prompt_sha256 = sha256_hex(prompt.as_bytes());
        let req = ChatRequest {
            model: judge.model().to_string(),
            messages: vec![ChatMessage::user(prompt)],
            temperature: judge.temperature,
            max_tokens: judge.max_tokens,
            response_format: None,
            seed: None,
            stop: vec![],
        };
        let Ok(_permit) = self.sem.acquire().await else {
            row.error = Some("cancelled".into());
            return row;
        };
        for _ in 0..self.opts.parse_attempts.max(1) {
            row.attempts += 1;
            match judge.client.chat(&req).await {
                Ok((c, _)) => {
                    row.prompt_tokens += c.usage.prompt_tokens.min(i32::MAX as u64) as i32;
                    row.completion_tokens += c.usage.completion_tokens.min(i32::MAX as u64) as i32;
                    row.cost_usd += c
                        .usage
                        .cost_usd(judge.usd_per_mtok_prompt, judge.usd_per_mtok_completion);
                    match parser(&c.content) {
                        Ok(v) => {
                            row.parsed = Some(v);
                            row.error = None;
                            row.raw = Some(c.content);
                            break;
                        }
                        Err(e) => {
                            row.error = Some(format!("unparseable judge reply: {e}"));
                            row.raw = Some(c.content);
                        }
                    }
                }
                Err(e) => {
                    // The client already retried transport failures; do not hammer it again.
                    row.error = Some(format!("judge call failed: {e}"));
                    break;
                }
            }
        }
        row.seconds = t0.elapsed().as_secs_f64();
        let _ = self.sink.send(row.clone());
        row
    }

    /// Grade one item's answer with one judge. `answer` is `None` when the responder produced
    /// none (the item is unscored: counted, not graded).
    pub async fn grade(
        &self,
        bench: Benchmark,
        judge: &JudgeSpec,
        item: &Item,
        answer: Option<&str>,
        sources: &[Source],
    ) -> ScoreRow {
        let mut out = ScoreRow {
            item_id: item.id.clone(),
            judge: judge.label.clone(),
            score: None,
            metrics: json!({}),
            error: None,
        };
        let Some(answer) = answer else {
            out.error = Some("no response".into());
            return out;
        };
        let result = match &item.gold {
            Gold::Weighted { items } => self.weighted(bench, judge, item, answer, items).await,
            Gold::Coverage { items } => self.coverage(judge, item, answer, items).await,
            Gold::Race {
                dimensions,
                reference,
            } => {
                let race = self.race(judge, item, answer, dimensions, reference.as_deref());
                if self.opts.fact == FactPages::Off {
                    race.await
                } else {
                    // FACT is reported beside RACE and independent of it: a RACE failure keeps
                    // the article's FACT counts, a FACT failure never unscores RACE.
                    let (race, fact) =
                        futures::join!(race, self.fact(judge, item, answer, sources));
                    let (score, mut m) = race.unwrap_or_else(|e| (None, json!({"judge_error": e})));
                    match fact {
                        Ok(f) => m["fact"] = f,
                        Err(e) => m["fact_error"] = json!(e),
                    }
                    Ok((score, m))
                }
            }
            Gold::Ingredients { items } => {
                self.ingredients(judge, item, answer, sources, items).await
            }
            Gold::Short { answers } => self.short(bench, judge, item, answer, answers).await,
        };
        match result {
            Ok((score, metrics)) => {
                out.score = score;
                if score.is_none() {
                    out.error = metrics
                        .get("judge_error")
                        .and_then(Value::as_str)
                        .map(|e| format!("grading failed: {e}"));
                }
                out.metrics = metrics;
            }
            Err(e) => out.error = Some(e),
        }
        out
    }

    /// HealthBench / FrontierScience (met / not met per criterion) and ResearchRubrics
    /// (verdict per criterion): Σ credit·w / Σ positive w, per-tag scores alongside.
    async fn weighted(
        &self,
        bench: Benchmark,
        judge: &JudgeSpec,
        item: &Item,
        answer: &str,
        criteria: &[crate::domain::bench::WeightedItem],
    ) -> Result<(Option<f64>, Value), String> {
        let rr = bench == Benchmark::Researchrubrics;
        let conversation = conversation_text(item, answer);
        let ternary = self.opts.ternary;
        let calls = criteria.iter().enumerate().map(|(i, c)| {
            let (template, ctx, parser): (&str, minijinja::Value, Parser) = if rr {
                let axis = c
                    .tags
                    .iter()
                    .find_map(|t| t.strip_prefix("axis:"))
                    .unwrap_or("")
                    .to_string();
                (
                    "verdict",
                    minijinja::context! { response => answer, criterion => c.text, axis => axis, weight => c.weight },
                    Box::new(move |t: &str| {
                        parse::verdict(t).map(|v| {
                            let credit = if ternary {
                                v.verdict.ternary_score()
                            } else {
                                v.verdict.binary_score()
                            };
                            json!({"verdict": format!("{:?}", v.verdict), "credit": credit})
                        })
                    }),
                )
            } else {
                (
                    "criterion",
                    minijinja::context! { conversation => conversation, criterion => c.text, weight => format_weight(c.weight) },
                    Box::new(|t: &str| {
                        parse::binary_met(t).map(|m| {
                            json!({"met": m.met, "credit": if m.met { 1.0 } else { 0.0 }, "explanation": m.explanation})
                        })
                    }),
                )
            };
            self.unit(judge, &item.id, "criterion", i as i32, template, ctx, parser)
        });
        let rows = futures::future::join_all(calls).await;
        let failed = rows.iter().filter(|r| r.parsed.is_none()).count();
        if failed > 0 {
            return Err(format!(
                "{failed} of {} criteria could not be graded (first: {})",
                rows.len(),
                rows.iter()
                    .find_map(|r| r.error.clone())
                    .unwrap_or_default()
            ));
        }
        let credits: Vec<f64> = rows
            .iter()
            .map(|r| {
                r.parsed
                    .as_ref()
                    .and_then(|p| p["credit"].as_f64())
                    .unwrap_or(0.0)
            })
            .collect();
        let pairs: Vec<(f64, f64)> = criteria
            .iter()
            .zip(&credits)
            .map(|(c, &x)| (c.weight, x))
            .collect();
        let tagged: Vec<(f64, f64, &[String])> = criteria
            .iter()
            .zip(&credits)
            .map(|(c, &x)| (c.weight, x, c.tags.as_slice()))
            .collect();
        let score = formula::weighted(&pairs)
            .ok_or_else(|| "the item has no positive-weight criterion".to_string())?;
        let met = credits.iter().filter(|&&x| x > 0.0).count();
        Ok((
            Some(score),
            json!({"tags": formula::tag_scores(&tagged), "met": met, "criteria": criteria.len()}),
        ))
    }

    /// ResearchQA: batches of rubric items, five labels each, the query's mean; a batch that
    /// fails drops the query (the protocol's rule).
    async fn coverage(
        &self,
        judge: &JudgeSpec,
        item: &Item,
        answer: &str,
        items: &[crate::domain::bench::CoverageItem],
    ) -> Result<(Option<f64>, Value), String> {
        let batch = self.opts.coverage_batch.max(1);
        let calls = items.chunks(batch).enumerate().map(|(b, chunk)| {
            let texts: Vec<String> = chunk.iter().map(|c| c.text.clone()).collect();
            let n = texts.len();
            self.unit(
                judge,
                &item.id,
                "coverage",
                b as i32,
                "coverage",
                minijinja::context! { question => item.question(), response => answer, items => texts },
                Box::new(move |t: &str| parse::coverage_labels(t, n).map(|v| json!(v))),
            )
        });
        let rows = futures::future::join_all(calls).await;
        let mut scores = Vec::new();
        for r in &rows {
            match r
                .parsed
                .as_ref()
                .and_then(|p| serde_json::from_value::<Vec<f64>>(p.clone()).ok())
            {
                Some(v) => scores.extend(v),
                None => {
                    return Err(format!(
                        "coverage batch {} failed: {}",
                        r.unit_index,
                        r.error.clone().unwrap_or_default()
                    ));
                }
            }
        }
        Ok((formula::coverage(&scores), json!({"items": scores})))
    }

    /// DeepResearch Bench RACE: the target cleaned of citations, then one comparison against the
    /// reference article with the criteria (weights withheld), weighted into T / (T + R).
    async fn race(
        &self,
        judge: &JudgeSpec,
        item: &Item,
        answer: &str,
        dims: &[crate::domain::bench::RaceDimension],
        reference: Option<&str>,
    ) -> Result<(Option<f64>, Value), String> {
        let reference = reference.ok_or_else(|| {
            "no reference article for this task (pass --references reference.jsonl)".to_string()
        })?;
        let cleaned = match self.opts.clean {
            Clean::Strip => strip_citations(answer),
            Clean::Llm => {
                let original = answer.chars().count();
                let r = self
                    .unit(
                        judge,
                        &item.id,
                        "clean",
                        0,
                        "clean",
                        minijinja::context! { article => answer },
                        Box::new(move |t: &str| {
                            let t = t.trim();
                            // The protocol retries a cleaning shorter than 100 characters.
                            if t.chars().count() < 100.min(original) {
                                Err(ParseError::Field {
                                    field: "article".into(),
                                    message: format!(
                                        "cleaned article has {} characters; at least {} expected",
                                        t.chars().count(),
                                        100.min(original)
                                    ),
                                })
                            } else {
                                Ok(json!(t))
                            }
                        }),
                    )
                    .await;
                match r.parsed.as_ref().and_then(Value::as_str) {
                    Some(s) => s.to_string(),
                    None => {
                        return Err(format!("cleaning failed: {}", r.error.unwrap_or_default()));
                    }
                }
            }
        };
        let criteria: BTreeMap<&str, Vec<Value>> = dims
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.criteria
                        .iter()
                        .map(|c| json!({"criterion": c.criterion, "explanation": c.explanation}))
                        .collect(),
                )
            })
            .collect();
        let names: Vec<&str> = dims.iter().map(|d| d.name.as_str()).collect();
        let owned = dims.to_vec();
        let r = self
            .unit(
                judge,
                &item.id,
                "race",
                0,
                "race",
                minijinja::context! {
                    task => item.question(),
                    target => cleaned,
                    reference => reference,
                    criteria => serde_json::to_string_pretty(&criteria).unwrap_or_default(),
                    dimensions => names.join(", "),
                },
                Box::new(move |t: &str| {
                    let j = parse::race(t, &owned)?;
                    let s = formula::race(&owned, &j).map_err(|e| ParseError::Field {
                        field: "scores".into(),
                        message: e.to_string(),
                    })?;
                    Ok(json!({"overall": s.overall, "dims": s.dims, "target": s.target, "reference": s.reference}))
                }),
            )
            .await;
        match r.parsed {
            Some(p) => Ok((p["overall"].as_f64(), p)),
            None => Err(format!(
                "RACE scoring failed: {}",
                r.error.unwrap_or_default()
            )),
        }
    }

    /// SQA-CS2 (AstaBench `simplified_eval`, `all_at_once`): ingredient recall (joint 0/1/2
    /// grading), answer precision (irrelevant paragraphs), and citation precision / recall (one
    /// call per cited section); the item's score is their mean, `global_avg`.
    async fn ingredients(
        &self,
        judge: &JudgeSpec,
        item: &Item,
        answer: &str,
        sources: &[Source],
        items: &[crate::domain::bench::Ingredient],
    ) -> Result<(Option<f64>, Value), String> {
        let sections = cite::asta_sections(answer)
            .unwrap_or_else(|| cite::sections_from_answer(answer, sources));
        let report = sections
            .iter()
            .map(|s| s.text.as_str())
            .filter(|t| !t.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n\n");
        let graded: Vec<&crate::domain::bench::Ingredient> = items
            .iter()
            .filter(|i| !i.criterion.trim().is_empty())
            .collect();
        let n = graded.len();
        let criteria: Vec<Value> = graded
            .iter()
            .map(|i| json!({"criterion": i.criterion, "examples": i.examples}))
            .collect();
        let recall = self.unit(
            judge,
            &item.id,
            "ingredients",
            0,
            "ingredients",
            minijinja::context! { question => item.question(), response => report, criteria => criteria },
            Box::new(move |t: &str| parse::ingredient_scores(t, n).map(|v| json!(v))),
        );
        let precision = self.unit(
            judge,
            &item.id,
            "precision",
            0,
            "precision",
            minijinja::context! { question => item.question(), response => report },
            Box::new(|t: &str| parse::irrelevant_paragraphs(t).map(|v| json!(v))),
        );
        let cited = sections
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.citations.is_empty())
            .map(|(i, s)| {
                let citations: Vec<Value> = s
                    .citations
                    .iter()
                    .map(|c| json!({"id": c.id, "text": c.text}))
                    .collect();
                self.unit(
                    judge,
                    &item.id,
                    "citations",
                    i as i32,
                    "citations",
                    minijinja::context! { section => s.text, citations => citations },
                    Box::new(|t: &str| parse::citation_claims(t).map(|v| json!(v))),
                )
            });
        let (r, p, c) = futures::join!(recall, precision, futures::future::join_all(cited));
        let scores: Vec<u8> = r
            .parsed
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .ok_or_else(|| {
                format!(
                    "ingredient grading failed: {}",
                    r.error.clone().unwrap_or_default()
                )
            })?;
        let irrelevant: Vec<String> = p
            .parsed
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .ok_or_else(|| {
                format!(
                    "answer-precision grading failed: {}",
                    p.error.clone().unwrap_or_default()
                )
            })?;
        let mut judged: HashMap<i32, Vec<cite::ClaimJudgement>> = HashMap::new();
        for row in &c {
            let claims = row
                .parsed
                .as_ref()
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .ok_or_else(|| {
                    format!(
                        "citation grading of section {} failed: {}",
                        row.unit_index,
                        row.error.clone().unwrap_or_default()
                    )
                })?;
            judged.insert(row.unit_index, claims);
        }
        let groups: Vec<cite::GroupCounts> = sections
            .iter()
            .enumerate()
            .map(|(i, s)| match judged.get(&(i as i32)) {
                Some(claims) => cite::group_counts(claims, &s.citations),
                None => cite::uncited_group(text::sentences(&s.text).len()),
            })
            .collect();
        let (citation_recall, citation_precision) = cite::citation_scores(&groups);
        let weights: Vec<f64> = graded.iter().map(|i| i.weight).collect();
        let ingredient_recall = formula::ingredient_recall(&weights, &scores)
            .ok_or_else(|| "the item has no weighted ingredient".to_string())?;
        let answer_precision =
            formula::answer_precision(&text::paragraphs(&report), &irrelevant).unwrap_or(0.0);
        let global =
            0.25 * (ingredient_recall + answer_precision + citation_precision + citation_recall);
        Ok((
            Some(global),
            json!({"ingredient_recall": ingredient_recall, "answer_precision": answer_precision,
                   "citation_precision": citation_precision, "citation_recall": citation_recall,
                   "sections": sections.len(),
                   "citations": sections.iter().map(|s| s.citations.len()).sum::<usize>(),
                   "half_credit_citations": sections.iter().flat_map(|s| &s.citations).filter(|c| c.half_credit).count()}),
        ))
    }

    /// DeepResearch Bench FACT on the raw article: extract the cited statements, group them by
    /// URL, deduplicate each group of several, then validate each group against its page (from
    /// the trace, or fetched with the browse tool). A group whose page or validation fails is
    /// left unscored and counted; a failed extraction fails FACT for the article.
    async fn fact(
        &self,
        judge: &JudgeSpec,
        item: &Item,
        answer: &str,
        sources: &[Source],
    ) -> Result<Value, String> {
        let article = fact_article(answer, sources);
        let r = self
            .unit(
                judge,
                &item.id,
                "facts",
                0,
                "facts",
                minijinja::context! { response => article },
                Box::new(|t: &str| parse::fact_triples(t).map(|v| json!(v))),
            )
            .await;
        let triples: Vec<cite::FactTriple> = r
            .parsed
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .ok_or_else(|| format!("extraction failed: {}", r.error.clone().unwrap_or_default()))?;
        let by_id: HashMap<&str, &Source> = sources.iter().map(|s| (s.id.as_str(), s)).collect();
        let resolve = |idx: &str| {
            let idx = idx.trim_matches(|c| c == '[' || c == ']');
            by_id.get(idx).and_then(|s| s.url.clone())
        };
        let groups = cite::group_by_url(&triples, &resolve);
        let jobs = groups
            .iter()
            .enumerate()
            .map(|(g, (url, facts))| async move {
                self.fact_group(judge, item, g as i32, url, facts, sources)
                    .await
            });
        let outcomes = futures::future::join_all(jobs).await;
        let mut tally = cite::FactTally::default();
        let mut fetches = Vec::new();
        let mut errors = Vec::new();
        for (o, fetch) in outcomes {
            fetches.extend(fetch);
            match o {
                Ok((kept, results)) => {
                    tally.citations += kept;
                    for x in results {
                        match x {
                            cite::Support::Supported => tally.supported += 1,
                            cite::Support::Unsupported => tally.unsupported += 1,
                            cite::Support::Unknown => tally.unknown += 1,
                        }
                    }
                }
                Err((kept, e)) => {
                    tally.citations += kept;
                    tally.errored_groups += 1;
                    errors.push(e);
                }
            }
        }
        let mut v = serde_json::to_value(&tally).unwrap_or(Value::Null);
        v["urls"] = json!(groups.len());
        v["fetches"] = json!(fetches);
        v["group_errors"] = json!(errors.into_iter().take(5).collect::<Vec<_>>());
        Ok(v)
    }

    /// One URL group of FACT: dedupe (when it has several statements), the page, validation.
    /// Returns the kept statements' count with their results, or with the group's error; and
    /// the record of an external fetch when one was made.
    async fn fact_group(
        &self,
        judge: &JudgeSpec,
        item: &Item,
        g: i32,
        url: &str,
        facts: &[String],
        sources: &[Source],
    ) -> (
        Result<(usize, Vec<cite::Support>), (usize, String)>,
        Option<Value>,
    ) {
        let mut kept: Vec<String> = facts.to_vec();
        if facts.len() > 1 {
            let n = facts.len();
            let d = self
                .unit(
                    judge,
                    &item.id,
                    "dedupe",
                    g,
                    "dedupe",
                    minijinja::context! { facts => facts },
                    Box::new(move |t: &str| parse::unique_indices(t, n).map(|v| json!(v))),
                )
                .await;
            match d
                .parsed
                .as_ref()
                .and_then(|v| serde_json::from_value::<Vec<usize>>(v.clone()).ok())
            {
                Some(idx) => {
                    kept = idx
                        .into_iter()
                        .filter_map(|i| facts.get(i).cloned())
                        .collect()
                }
                None => {
                    return (
                        Err((
                            n,
                            format!("{url}: dedupe failed: {}", d.error.unwrap_or_default()),
                        )),
                        None,
                    );
                }
            }
        }
        let k = kept.len();
        let (page, fetch) = self.fact_page(url, sources).await;
        let page = match page {
            Ok(p) => p,
            Err(e) => return (Err((k, format!("{url}: {e}"))), fetch),
        };
        let r = self
            .unit(
                judge,
                &item.id,
                "fact_support",
                g,
                "fact_support",
                minijinja::context! { page => page, facts => kept },
                Box::new(move |t: &str| parse::fact_results(t, k).map(|v| json!(v))),
            )
            .await;
        match r
            .parsed
            .as_ref()
            .and_then(|v| serde_json::from_value::<Vec<cite::Support>>(v.clone()).ok())
        {
            Some(results) => (Ok((k, results)), fetch),
            None => (
                Err((
                    k,
                    format!("{url}: validation failed: {}", r.error.unwrap_or_default()),
                )),
                fetch,
            ),
        }
    }

    /// The text of a cited page: the trace's sources with that URL, else (in `browse` mode) the
    /// page fetched now, recorded with its time, hash and error.
    async fn fact_page(
        &self,
        url: &str,
        sources: &[Source],
    ) -> (Result<String, String>, Option<Value>) {
        if let Some(page) = trace_page(url, sources) {
            return (Ok(page), None);
        }
        let fetcher = match (self.opts.fact, &self.opts.fetcher) {
            (FactPages::Browse, Some(f)) => f,
            _ => return (
                Err(
                    "the page is not in the trace and fetching is off (--fact browse fetches it)"
                        .into(),
                ),
                None,
            ),
        };
        let at = chrono::Utc::now().to_rfc3339();
        match fetcher.fetch(url, None).await {
            Ok(p) => {
                let text = cap_chars(&p.text, FACT_PAGE_CHARS);
                let rec = json!({"url": url, "fetched_at": at, "sha256": sha256_hex(p.text.as_bytes()),
                                 "chars": p.text.chars().count(), "truncated": p.truncated});
                (Ok(text), Some(rec))
            }
            Err(e) => {
                let rec = json!({"url": url, "fetched_at": at, "error": e.to_string()});
                (Err(format!("fetch failed: {e}")), Some(rec))
            }
        }
    }

    /// Short answers: exact match, sub-EM and token F1 with SQuAD normalisation (no call), plus
    /// the LLM grade the papers report (SimpleQA three classes; DR Tulu's yes/no equivalence).
    async fn short(
        &self,
        bench: Benchmark,
        judge: &JudgeSpec,
        item: &Item,
        answer: &str,
        golds: &[String],
    ) -> Result<(Option<f64>, Value), String> {
        let mut m = string_metrics(answer, golds);
        let gold = golds.join(" / ");
        let r = if bench == Benchmark::Simpleqa {
            self.unit(
                judge,
                &item.id,
                "three_class",
                0,
                "three_class",
                minijinja::context! { question => item.question(), gold => gold, response => answer },
                Box::new(|t: &str| Ok(json!(format!("{:?}", parse::three_class(t))))),
            )
            .await
        } else if bench == Benchmark::Webwalker && self.opts.webwalker_cot_qa {
            self.unit(
                judge,
                &item.id,
                "cot_qa",
                0,
                "cot_qa",
                minijinja::context! { question => item.question(), gold => gold, response => answer },
                Box::new(|t: &str| {
                    parse::cot_grade(t).map(|b| json!(b)).ok_or_else(|| ParseError::Field {
                        field: "GRADE".into(),
                        message: "no final `GRADE: CORRECT` or `GRADE: INCORRECT` line".into(),
                    })
                }),
            )
            .await
        } else {
            self.unit(
                judge,
                &item.id,
                "equivalence",
                0,
                "equivalence",
                minijinja::context! { question => item.question(), gold => gold, response => answer },
                Box::new(|t: &str| Ok(json!(parse::yes_no(t)))),
            )
            .await
        };
        let Some(p) = r.parsed else {
            // The string-match metrics stand; the judged score is missing (counted as failed).
            m["judge_error"] = json!(r.error.unwrap_or_default());
            return Ok((None, m));
        };
        let correct = match &p {
            Value::String(class) => {
                m["class"] = p.clone();
                class == "Correct"
            }
            Value::Bool(b) => *b,
            _ => false,
        };
        m["judge_correct"] = json!(correct);
        Ok((Some(if correct { 1.0 } else { 0.0 }), m))
    }
}

/// EM, sub-EM and F1 of a short answer (the string-match grader).
pub fn string_metrics(answer: &str, golds: &[String]) -> Value {
    let pred = text::extract(answer, &[text::Extract::ExactAnswerLine]);
    json!({
        "em": text::exact_match(&pred, golds),
        "sub_em": text::sub_exact_match(&pred, golds),
        "f1": text::f1(&pred, golds),
    })
}

/// FACT's input article: the raw answer; an agent's `<cite id>` tags become `[id]` markers
/// (DR Tulu's `drb_formatter.py`) with a reference list of the cited sources' titles and URLs.
pub fn fact_article(answer: &str, sources: &[Source]) -> String {
    if !answer.contains("<cite") {
        return answer.to_string();
    }
    let (text, ids) = cite::bracket_citations(answer, " ");
    let refs: Vec<String> = ids
        .iter()
        .filter_map(|id| {
            let s = sources.iter().find(|s| &s.id == id)?;
            Some(
                format!("[{id}] {} {}", s.title, s.url.as_deref().unwrap_or(""))
                    .trim()
                    .to_string(),
            )
        })
        .collect();
    if refs.is_empty() {
        text
    } else {
        format!("{text}\n\nReferences\n{}", refs.join("\n"))
    }
}

/// A cited page as the trace saw it: the texts of the sources with that URL (DR Tulu's
/// `run_benchmark_scraped.sh` route), capped; `None` when the trace never retrieved it.
pub fn trace_page(url: &str, sources: &[Source]) -> Option<String> {
    let texts: Vec<&str> = sources
        .iter()
        .filter(|s| s.url.as_deref().map(cite::clean_url).as_deref() == Some(url))
        .map(|s| s.text.as_str())
        .filter(|t| !t.trim().is_empty())
        .collect();
    (!texts.is_empty()).then(|| cap_chars(&texts.join("\n\n"), FACT_PAGE_CHARS))
}

fn cap_chars(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

/// Points as the grader sees them (`[10]`, `[-5]`, `[2.5]`).
fn format_weight(w: f64) -> String {
    if w.fract() == 0.0 {
        format!("{}", w as i64)
    } else {
        format!("{w}")
    }
}

/// The conversation with the response appended, as `role: content` blocks (HealthBench's
/// grader input).
fn conversation_text(item: &Item, answer: &str) -> String {
    item.prompt
        .iter()
        .map(|t| format!("{}: {}", t.role, t.content))
        .chain(std::iter::once(format!("assistant: {answer}")))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Remove citation markers (`[1]`, `[1, 2]`, `[1†L3]`, `<cite id="…">…</cite>` tags, markdown
/// links) and a trailing reference list: the local alternative to RACE's cleaning call.
pub fn strip_citations(text: &str) -> String {
    let mut lines: Vec<&str> = text.lines().collect();
    if let Some(i) = lines.iter().rposition(|l| {
        let l = l.trim().trim_start_matches('#').trim().to_lowercase();
        matches!(
            l.as_str(),
            "references" | "sources" | "bibliography" | "参考文献" | "参考资料"
        )
    }) {
        lines.truncate(i);
    }
    let joined = lines.join("\n");
    let mut out = String::with_capacity(joined.len());
    let mut rest = joined.as_str();
    while let Some(c) = rest.chars().next() {
        if c == '<' && (rest.starts_with("<cite") || rest.starts_with("</cite")) {
            match rest.find('>') {
                Some(end) => {
                    rest = &rest[end + 1..];
                    continue;
                }
                None => break,
            }
        }
        if c == '['
            && let Some(end) = rest.find(']')
        {
            {
                let inner = &rest[1..end];
                let after = &rest[end + 1..];
                if after.starts_with('(') {
                    // A markdown link: keep its text, drop the target.
                    if let Some(close) = after.find(')') {
                        out.push_str(inner);
                        rest = &after[close + 1..];
                        continue;
                    }
                }
                if !inner.is_empty()
                    && inner.chars().all(|ch| {
                        ch.is_ascii_digit() || matches!(ch, ',' | ' ' | '-' | '†' | 'L' | ':')
                    })
                    && inner.chars().next().is_some_and(|ch| ch.is_ascii_digit())
                {
                    while out.ends_with(' ') {
                        out.pop();
                    }
                    rest = after;
                    continue;
                }
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fact_input_rewrites_agent_citations_and_finds_pages_in_the_trace() {
        let sources = vec![
            Source {
                id: "a1".into(),
                title: "Stats office".into(),
                url: Some("https://stats.example/gdp#:~:text=grew".into()),
                text: "GDP grew 3.1% in 2023.".into(),
            },
            Source {
                id: "b2".into(),
                title: "Blog".into(),
                url: Some("https://stats.example/gdp".into()),
                text: "Second view of the same page.".into(),
            },
        ];
        let a = fact_article("<cite id=\"a1,b2\">GDP grew 3.1%.</cite> Done.", &sources);
        assert!(a.starts_with("GDP grew 3.1%. [a1] [b2] Done."), "{a}");
        assert!(a.contains("References\n[a1] Stats office https://stats.example/gdp#:~:text=grew"));
        assert_eq!(fact_article("Plain [1] text.", &sources), "Plain [1] text.");
        let page = trace_page("https://stats.example/gdp", &sources).unwrap();
        assert_eq!(
            page,
            "GDP grew 3.1% in 2023.\n\nSecond view of the same page."
        );
        assert!(trace_page("https://other.example", &sources).is_none());
    }

    #[test]
    fn strip_citations_removes_markers_links_and_reference_lists() {
        let t = "Growth was 5% [1][2, 3]. See [the report](https://x.org/a) and <cite id=\"a1\">this</cite>.\nArrays [a] stay.\n\n## References\n[1] https://x.org";
        let s = strip_citations(t);
        assert_eq!(
            s,
            "Growth was 5%. See the report and this.\nArrays [a] stay."
        );
        assert_eq!(
            strip_citations("中文报告[3]。\n参考文献\n[3] x"),
            "中文报告。"
        );
    }

    #[test]
    fn sqa_sections_are_joined_and_plain_text_kept() {
        let j = r#"{"response": {"sections": [{"title": "A", "text": "First.", "citations": []}, {"title": "B", "text": "Second."}]}}"#;
        let texts: Vec<String> = cite::asta_sections(j)
            .unwrap()
            .into_iter()
            .map(|s| s.text)
            .collect();
        assert_eq!(texts, vec!["First.", "Second."]);
        let plain = cite::sections_from_answer("plain report", &[]);
        assert_eq!(plain.len(), 1);
        assert_eq!(plain[0].text, "plain report");
    }

    #[test]
    fn embedded_templates_render_with_their_variables() {
        let t = Templates::embedded();
        for name in [
            "criterion",
            "verdict",
            "coverage",
            "race",
            "clean",
            "three_class",
            "equivalence",
            "ingredients",
            "precision",
        ] {
            assert_eq!(t.sha(name).len(), 64, "{name}");
        }
        let p = t
            .render(
                "criterion",
                minijinja::context! { conversation => "user: hi\n\nassistant: hello", criterion => "Greets", weight => "5" },
            )
            .unwrap();
        assert!(
            p.contains("[5] Greets") && p.contains("assistant: hello"),
            "{p}"
        );
        let mut t2 = t.clone();
        assert!(t2.replace("criterion", "{{ nope".into()).is_err());
        assert!(t2.replace("nonexistent", "x".into()).is_err());
        t2.replace("criterion", "Official: {{ criterion }}".into())
            .unwrap();
        assert_ne!(t2.sha("criterion"), t.sha("criterion"));
    }
}
