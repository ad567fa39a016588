//! The stagewise rubric judge: rubric and judgment types, the `Judge` trait with its two
//! implementations (an LLM behind an OpenAI-compatible endpoint, and the deterministic offline
//! lexical judge), and per-call accounting (tokens, cost, attempts, failures).
//! Method: shared/spec/method.md A.4 (RubricEM), B.2-B.6 (DR Tulu).

pub mod citation;
pub mod group;
pub mod lexical;
pub mod score;
pub mod view;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::trajectory::Stage;
pub use view::TraceView;

/// Where a rubric came from (the `rubrics.origin` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Search-grounded or dataset rubrics of the Answer stage; never pruned.
    Persistent,
    /// Proposed online by contrasting a task's rollouts.
    Generated,
    /// Written by the reflection meta-policy.
    Reflection,
    /// Shipped with a benchmark (HealthBench points, DeepResearch Bench criteria).
    Dataset,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Persistent => "persistent",
            Origin::Generated => "generated",
            Origin::Reflection => "reflection",
            Origin::Dataset => "dataset",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "persistent" => Some(Origin::Persistent),
            "generated" => Some(Origin::Generated),
            "reflection" => Some(Origin::Reflection),
            "dataset" => Some(Origin::Dataset),
            _ => None,
        }
    }
}

/// A rubric as the judge sees it. `weight` is positive; polarity is `negative`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rubric {
    pub id: Uuid,
    pub stage: Stage,
    pub title: String,
    pub description: String,
    pub weight: f32,
    pub negative: bool,
    /// Terms the lexical judge looks for; empty means "derive from title and description".
    pub key_terms: Vec<String>,
    pub origin: Origin,
}

/// A rubric proposed by a judge, before it gets an id and a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewRubric {
    pub title: String,
    pub description: String,
    pub weight: f32,
    pub negative: bool,
    #[serde(default)]
    pub key_terms: Vec<String>,
}

impl NewRubric {
    pub fn into_rubric(self, stage: Stage, origin: Origin) -> Rubric {
        Rubric {
            id: Uuid::now_v7(),
            stage,
            title: self.title,
            description: self.description,
            weight: self.weight,
            negative: self.negative,
            key_terms: self.key_terms,
            origin,
        }
    }
}

/// One rubric's raw score: 0, 1 or 2 (before negative inversion) with a short justification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RubricScore {
    pub rubric_id: Uuid,
    pub score: u8,
    pub justification: String,
}

/// What a judge call cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cost_usd: f64,
    /// Attempts made (1 = first try succeeded).
    pub attempts: u32,
    pub latency_ms: u32,
}

/// Which judge produced a score; every stored judgment and report carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JudgeKind {
    /// An LLM judge behind an OpenAI-compatible chat endpoint.
    Llm,
    /// The deterministic offline lexical judge (labelled as such in every report).
    Lexical,
}

impl JudgeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JudgeKind::Llm => "llm",
            JudgeKind::Lexical => "lexical",
        }
    }
}

/// Which text a scoring call judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreMode {
    /// Every rubric against its own stage's text (RubricEM, method.md A.4.4).
    Stagewise,
    /// Every rubric against the final answer only (DR Tulu, method.md B.2).
    AnswerOnly,
}

/// How many rubrics one scoring call judges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Granularity {
    /// One call per trajectory scores every rubric (RubricEM).
    #[default]
    PerTrajectory,
    /// One call per (trajectory, rubric), as DR Tulu's reward code does (method.md B.2;
    /// drtulu.md 2.3): the judge sees the question, the text and a single criterion, and answers
    /// `{"score": 0|1|2}`.
    PerRubric,
}

/// Scores of one trajectory against a rubric set.
#[derive(Debug, Clone, PartialEq)]
pub struct Scoring {
    pub scores: Vec<RubricScore>,
    pub usage: Usage,
}

/// Rubrics proposed for each stage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generated {
    pub per_stage: [Vec<NewRubric>; 4],
    pub usage: Usage,
}

/// A factual claim of an answer with the snippet ids it cites (empty: uncited).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub text: String,
    pub ids: Vec<String>,
}

/// The citation judge's verdict on one claim (method.md B.6).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClaimVerdict {
    /// Cited: the cited snippets support it (1 fully, 0.5 partially, 0 not). Uncited: 1 when the
    /// claim needs no citation, 0 when it does.
    pub support: f64,
    /// Cited: the cited snippets are relevant to it (1 or 0). Uncited: 1.
    pub relevance: f64,
}

/// One evaluator finding the reflection judge sees: a rubric, its stage, its raw 0-2 score and
/// the justification (method.md A.6.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub stage: Stage,
    pub title: String,
    pub score: f32,
    pub justification: String,
}

/// The reflection judge's three dimensions for one candidate, each in [0, 1].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReflectionGrade {
    pub diagnostic_accuracy: f64,
    pub specificity: f64,
    pub scope: f64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum JudgeError {
    #[error("judge call failed after {attempts} attempt(s): {source}")]
    Llm {
        attempts: u32,
        /// The inference-client error (`infra::llm::LlmError` for the LLM judge).
        #[source]
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot render judge prompt `{name}`: {message}")]
    Prompt { name: &'static str, message: String },
    #[error("judge input invalid: {0}")]
    Input(String),
}

/// A judge: the same interface whether an LLM or the lexical scorer sits behind it.
pub trait Judge: Send + Sync {
    /// The model name recorded with every judgment.
    fn model(&self) -> &str;
    fn kind(&self) -> JudgeKind;

    /// Propose new stage rubrics by contrasting one task's rollouts (method.md A.4.3); `stages`
    /// limits which stages may get rubrics (RLER: Answer only).
    fn generate<'a>(
        &'a self,
        question: &'a str,
        rollouts: &'a [TraceView],
        existing: &'a [Rubric],
        stages: &'a [Stage],
    ) -> BoxFuture<'a, Result<Generated, JudgeError>>;

    /// Score one trajectory against every rubric (one call), 0/1/2 each.
    fn score<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        rubrics: &'a [Rubric],
        mode: ScoreMode,
    ) -> BoxFuture<'a, Result<Scoring, JudgeError>>;

    /// Score one trajectory against one rubric (one call), 0/1/2, on the text `mode` gives the
    /// rubric (answer-only: the final answer). DR Tulu's granularity (method.md B.2).
    fn score_rubric<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        rubric: &'a Rubric,
        mode: ScoreMode,
    ) -> BoxFuture<'a, Result<(RubricScore, Usage), JudgeError>>;

    /// Persistent Answer rubrics for a new task, grounded only in retrieved snippets (method.md
    /// B.3). Snippets are `(id, text)`.
    fn ground<'a>(
        &'a self,
        question: &'a str,
        snippets: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<Generated, JudgeError>>;

    /// Claim-level citation verdicts (method.md B.6); `snippets` are the trajectory's retrieved
    /// snippets by id.
    fn claims<'a>(
        &'a self,
        question: &'a str,
        claims: &'a [Claim],
        snippets: &'a std::collections::HashMap<String, String>,
    ) -> BoxFuture<'a, Result<(Vec<ClaimVerdict>, Usage), JudgeError>>;

    /// Grade reflection candidates written about one trajectory (method.md A.6.2), one grade
    /// per candidate in order; the judge sees the trajectory and the evaluator's findings.
    /// Callers grade only valid candidates (invalid ones score 0 without a call).
    fn reflect<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        findings: &'a [Finding],
        candidates: &'a [String],
    ) -> BoxFuture<'a, Result<(Vec<ReflectionGrade>, Usage), JudgeError>>;

    /// [`Judge::score_rubric`] on a `0..=scale` scale: 2 (0/1/2) or 4 (DeepRubric's 0-4,
    /// method.md C.5). A judge that grades 0/1/2 only answers a 4-point request with its score
    /// doubled (0, 2 or 4), which loses the odd grades; the LLM judge asks for 0-4 itself.
    fn score_rubric_on<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        rubric: &'a Rubric,
        mode: ScoreMode,
        scale: u8,
    ) -> BoxFuture<'a, Result<(RubricScore, Usage), JudgeError>> {
        Box::pin(async move {
            let (mut s, usage) = self.score_rubric(question, trace, rubric, mode).await?;
            if scale == 4 {
                s.score = s.score.min(2) * 2;
            }
            Ok((s, usage))
        })
    }
}
