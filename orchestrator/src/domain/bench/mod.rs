//! Benchmarks scored by their own protocols (../shared/spec/benchmarks.md): the items a loader
//! reads from a benchmark's published file, the gold each protocol grades against, the grader
//! kinds the benchmarks share, and the formulas and aggregators that turn graded items into the
//! benchmark's own number. Pure: no I/O beyond reading the benchmark file in `load`.

pub mod cite;
pub mod load;
pub mod monitor;
pub mod parse;
pub mod sample;
pub mod score;
pub mod stats;
pub mod text;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The published scale: every benchmark here reports its score x 100.
pub const SCALE: f64 = 100.0;

/// A benchmark this harness runs, with the protocol its published numbers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Benchmark {
    /// HealthBench "all" (5,000 conversations, points rubrics graded item by item).
    Healthbench,
    /// HealthBench Hard (1,000 examples; same file format and protocol).
    HealthbenchHard,
    /// HealthBench Consensus (34 physician-validated cluster criteria; same protocol).
    HealthbenchConsensus,
    /// ResearchQA: per-query coverage of up to 8 rubric items on a 5-label scale.
    Researchqa,
    /// DeepResearch Bench: RACE (reference-relative weighted criteria) and FACT (citations).
    Drb,
    /// ResearchRubrics (Scale AI): binary per-criterion verdicts, signed weights.
    Researchrubrics,
    /// ScholarQA-CS2 (AstaBench SQA): ingredient recall, answer precision, citation P/R.
    SqaCsV2,
    /// SimpleQA: three-class grading against the gold answer.
    Simpleqa,
    /// 2WikiMultihopQA, HotpotQA, MuSiQue, Bamboogle: EM / F1 plus LLM-judge accuracy.
    TwoWiki,
    Hotpotqa,
    Musique,
    Bamboogle,
    /// WebWalkerQA: LLM-judge accuracy with the {single,multi}_source x difficulty breakdown.
    Webwalker,
    /// FrontierScience research problems with points rubrics (graded like HealthBench items).
    Frontierscience,
}

impl Benchmark {
    pub const ALL: [Benchmark; 14] = [
        Benchmark::Healthbench,
        Benchmark::HealthbenchHard,
        Benchmark::HealthbenchConsensus,
        Benchmark::Researchqa,
        Benchmark::Drb,
        Benchmark::Researchrubrics,
        Benchmark::SqaCsV2,
        Benchmark::Simpleqa,
        Benchmark::TwoWiki,
        Benchmark::Hotpotqa,
        Benchmark::Musique,
        Benchmark::Bamboogle,
        Benchmark::Webwalker,
        Benchmark::Frontierscience,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Benchmark::Healthbench => "healthbench",
            Benchmark::HealthbenchHard => "healthbench-hard",
            Benchmark::HealthbenchConsensus => "healthbench-consensus",
            Benchmark::Researchqa => "researchqa",
            Benchmark::Drb => "drb",
            Benchmark::Researchrubrics => "researchrubrics",
            Benchmark::SqaCsV2 => "sqa-cs-v2",
            Benchmark::Simpleqa => "simpleqa",
            Benchmark::TwoWiki => "2wiki",
            Benchmark::Hotpotqa => "hotpotqa",
            Benchmark::Musique => "musique",
            Benchmark::Bamboogle => "bamboogle",
            Benchmark::Webwalker => "webwalker",
            Benchmark::Frontierscience => "frontierscience",
        }
    }

    /// HealthBench or one of its subsets (same file format and protocol).
    pub fn is_healthbench(self) -> bool {
        matches!(
            self,
            Benchmark::Healthbench | Benchmark::HealthbenchHard | Benchmark::HealthbenchConsensus
        )
    }

    /// Whether the benchmark is graded against a short known answer.
    pub fn short_answer(self) -> bool {
        matches!(
            self,
            Benchmark::Simpleqa
                | Benchmark::TwoWiki
                | Benchmark::Hotpotqa
                | Benchmark::Musique
                | Benchmark::Bamboogle
                | Benchmark::Webwalker
        )
    }
}

impl fmt::Display for Benchmark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Benchmark {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        let alias = match s.as_str() {
            "twowiki" | "2wikimultihopqa" => "2wiki",
            "deepresearch-bench" | "deep-research-bench" => "drb",
            "sqa" | "sqa-cs2" | "scholarqa-cs2" | "sqav2" => "sqa-cs-v2",
            other => other,
        };
        Benchmark::ALL
            .into_iter()
            .find(|b| b.as_str() == alias)
            .ok_or_else(|| {
                let names: Vec<&str> = Benchmark::ALL.iter().map(|b| b.as_str()).collect();
                format!("unknown benchmark `{s}`; known: {}", names.join(", "))
            })
    }
}

/// One turn of the conversation the policy answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub role: String,
    pub content: String,
}

impl Turn {
    pub fn user(content: impl Into<String>) -> Self {
        Turn {
            role: "user".into(),
            content: content.into(),
        }
    }
}

/// One benchmark item as its file states it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// The benchmark's own id (HealthBench `prompt_id`, ResearchQA `id`, DRB `id`,
    /// ResearchRubrics `sample_id`, SQA `case_id`), else the 0-based row index as a string.
    pub id: String,
    /// 0-based position of the item in the file (after nothing is filtered).
    pub row: usize,
    /// The conversation the policy answers (one user turn for single-turn benchmarks).
    pub prompt: Vec<Turn>,
    pub gold: Gold,
    /// Example-level tags the benchmark breaks scores down by: HealthBench `example_tags`
    /// (`theme:*`, `physician_agreed_category:*`), WebWalker `cell:single_source/easy`,
    /// DRB `language:zh|en` and `topic:*`, ResearchQA `field:*`, ResearchRubrics `domain:*`.
    pub tags: Vec<String>,
    /// Language code where the file states it (DRB `language`, WebWalker `lang`).
    pub language: Option<String>,
}

impl Item {
    /// The last user turn (the question the item asks).
    pub fn question(&self) -> &str {
        self.prompt
            .iter()
            .rev()
            .find(|t| t.role == "user")
            .map(|t| t.content.as_str())
            .unwrap_or("")
    }
}

/// What an item is graded against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Gold {
    /// Signed weighted criteria graded one by one (HealthBench points in -10..10,
    /// ResearchRubrics float weights, FrontierScience points): met items add their weight,
    /// met negative items (undesirable behaviour present) subtract; normalised by the sum of
    /// positive weights.
    Weighted { items: Vec<WeightedItem> },
    /// ResearchQA rubric items graded for coverage on five labels.
    Coverage { items: Vec<CoverageItem> },
    /// DeepResearch Bench RACE criteria per dimension with the dimension weights; the
    /// reference article is joined from the reference file by prompt text when given.
    Race {
        dimensions: Vec<RaceDimension>,
        reference: Option<String>,
    },
    /// SQA-CS2 ingredients (criteria with weights, evidence and examples).
    Ingredients { items: Vec<Ingredient> },
    /// Known short answers (any matches).
    Short { answers: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightedItem {
    pub text: String,
    /// Signed weight (points); negative = undesirable behaviour.
    pub weight: f64,
    /// Rubric-level tags (HealthBench `axis:*`, `level:*`, `cluster:*`; ResearchRubrics
    /// `axis:<axis>`).
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoverageItem {
    pub text: String,
    /// ResearchQA `type` (a string or a list in the files).
    pub kinds: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RaceDimension {
    pub name: String,
    pub weight: f64,
    pub criteria: Vec<RaceCriterion>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RaceCriterion {
    pub criterion: String,
    pub explanation: String,
    pub weight: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ingredient {
    pub name: String,
    pub criterion: String,
    pub weight: f64,
    pub evidence: Vec<String>,
    pub examples: Vec<String>,
}
