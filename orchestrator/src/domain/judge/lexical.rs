//! The offline lexical judge: deterministic rubric scoring without an LLM. A rubric's key terms
//! (given, or taken from its title and description) are looked up in the text it judges;
//! coverage maps to 0/1/2; negatives are inverted by the aggregation like any judge's. Answer
//! rubrics lose a level when the answer cites ids it never retrieved. Generation contrasts the
//! group's stronger and weaker rollouts by term frequency; grounding takes terms that recur
//! across retrieved snippets. Scoring one rubric per call (DR Tulu's granularity) gives the
//! same score as scoring it among others. Every score it produces is labelled `lexical`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::future::BoxFuture;

use super::{
    Claim, ClaimVerdict, Finding, Generated, Judge, JudgeError, JudgeKind, NewRubric,
    ReflectionGrade, Rubric, RubricScore, ScoreMode, Scoring, TraceView, Usage,
};
use crate::domain::trajectory::Stage;

/// Words that never make a key term.
const STOPWORDS: &[&str] = &[
    "the",
    "and",
    "for",
    "are",
    "but",
    "not",
    "you",
    "all",
    "any",
    "can",
    "had",
    "her",
    "was",
    "one",
    "our",
    "out",
    "has",
    "his",
    "how",
    "its",
    "may",
    "new",
    "now",
    "see",
    "who",
    "did",
    "does",
    "this",
    "that",
    "with",
    "from",
    "they",
    "them",
    "then",
    "than",
    "there",
    "their",
    "these",
    "those",
    "what",
    "when",
    "where",
    "which",
    "while",
    "will",
    "would",
    "should",
    "could",
    "about",
    "into",
    "over",
    "also",
    "more",
    "most",
    "some",
    "such",
    "only",
    "other",
    "each",
    "very",
    "been",
    "being",
    "have",
    "were",
    "your",
    "just",
    "like",
    "because",
    "between",
    "both",
    "after",
    "before",
    "answer",
    "response",
    "question",
    "mentions",
    "mention",
    "includes",
    "include",
    "explains",
    "explain",
    "provides",
    "provide",
    "whether",
    "states",
    "clearly",
    "identifies",
    "describes",
    "discusses",
    "report",
    "stage",
    "rubric",
];

/// What a lexical call costs: one attempt, no tokens, no money, no waiting.
const LOCAL_CALL: Usage = Usage {
    prompt_tokens: 0,
    completion_tokens: 0,
    cost_usd: 0.0,
    attempts: 1,
    latency_ms: 0,
};

/// CJK characters that carry grammar, not content (particles, copulas, prepositions,
/// demonstratives): a Chinese run is cut at them before it is split into words.
const CJK_FUNCTION: &str = "的了是在和与及或并对为也就都而其这那个把被从将于以之所否吗呢吧啊";

/// Two-character words of rubric boilerplate, the Chinese counterparts of `STOPWORDS`' "report",
/// "whether", "explains", "points out", ..., and of its common function words ("could", "been",
/// "because", "they", "some", "very"): words that say nothing about a topic.
const CJK_STOPWORDS: &[&str] = &[
    "报告", "回答", "问题", "分析", "说明", "描述", "讨论", "提供", "明确", "解释", "提到", "包括",
    "包含", "是否", "能够", "应该", "如何", "什么", "哪些", "相关", "指出", "提及", "列举", "介绍",
    "阐述", "概述", "可以", "没有", "已经", "因为", "进行", "通过", "我们", "他们", "一些", "一种",
    "非常", "目前",
];

/// Lower-cased content tokens of `text` in order. Letter/digit runs of other scripts: runs of
/// ≥ 3 chars (or any with a non-ASCII letter), stopwords removed. CJK runs, written without
/// spaces, are cut at function characters and each piece into two-character words (most Chinese
/// words are two characters; an odd piece ends with an overlapping pair, a lone character stays
/// itself), boilerplate words removed; so a Chinese rubric's terms are found in a report that
/// says the same in other words or order, not only in one that copies a clause.
///
/// Why not the overlapping bigrams of Lucene's CJKAnalyzer (`CJKBigramFilter`), which the BM25
/// index (`infra::tools::local_search`) uses: there every bigram is a posting and the cross-word
/// ones (经济增长 → 济增) cost nothing, while here each term is a key term a report must contain,
/// so cross-word pairs take half of a rubric's few key terms. On the eight paraphrased topics of
/// tests/cjk_text.rs both scored a mean 0.38 of 2 at 8 key terms (overlapping bigrams 0.25 at
/// 12), English 0.50, unrelated reports 0 in both languages; with whole CJK runs as terms every
/// Chinese topic scored 0. Where terms of two texts are compared as sets, a CJK word is also
/// looked for in the other text itself (`holds`), as pairs depend on where a run starts.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for token in text.split(|c: char| !c.is_alphanumeric()) {
        let mut rest = token;
        while let Some(first) = rest.chars().next() {
            let cjk = crate::domain::util::is_cjk(first);
            let end = rest
                .char_indices()
                .find(|&(_, c)| crate::domain::util::is_cjk(c) != cjk)
                .map_or(rest.len(), |(i, _)| i);
            let (run, tail) = rest.split_at(end);
            rest = tail;
            if cjk {
                for piece in run.split(|c| CJK_FUNCTION.contains(c)) {
                    out.extend(
                        cjk_words(piece)
                            .into_iter()
                            .filter(|w| !CJK_STOPWORDS.contains(&w.as_str())),
                    );
                }
            } else {
                let w = run.to_lowercase();
                if (w.chars().count() >= 3 || !w.is_ascii()) && !STOPWORDS.contains(&w.as_str()) {
                    out.push(w);
                }
            }
        }
    }
    out
}

/// A CJK piece as two-character words: non-overlapping pairs from the start, the last pair
/// overlapping when the length is odd; a lone character as itself.
fn cjk_words(piece: &str) -> Vec<String> {
    let chars: Vec<char> = piece.chars().collect();
    match chars.len() {
        0 => vec![],
        1 => vec![chars[0].to_string()],
        n => {
            let mut words: Vec<String> =
                chars.chunks_exact(2).map(|p| p.iter().collect()).collect();
            if n % 2 == 1 {
                words.push(chars[n - 2..].iter().collect());
            }
            words
        }
    }
}

/// The key terms of a rubric: its own list, else up to 6 distinct terms of title + description
/// (8 when it is written in a CJK script, whose two-character words carry less each; a lone CJK
/// character, left between function characters as 涉 of 涉及, is found in almost any Chinese
/// text and is kept only when the rubric has no other term).
pub fn key_terms(r: &Rubric) -> Vec<String> {
    if !r.key_terms.is_empty() {
        return r.key_terms.iter().map(|t| t.to_lowercase()).collect();
    }
    let text = format!("{} {}", r.title, r.description);
    let all = terms(&text);
    let limit = if text.chars().any(crate::domain::util::is_cjk) {
        8
    } else {
        6
    };
    let lone = |t: &String| {
        let mut cs = t.chars();
        matches!((cs.next(), cs.next()), (Some(c), None) if crate::domain::util::is_cjk(c))
    };
    let keep_lone = all.iter().all(lone);
    let mut seen = BTreeSet::new();
    all.into_iter()
        .filter(|t| keep_lone || !lone(t))
        .filter(|t| seen.insert(t.clone()))
        .take(limit)
        .collect()
}

/// A term specific enough to name a generated rubric: ≥ 4 characters, or a CJK word (a
/// two-character CJK word carries about as much as a four-letter English one).
fn substantive(w: &str) -> bool {
    let n = w.chars().count();
    n >= 4 || (n >= 2 && cjk_word(w))
}

/// A term made of CJK characters only.
fn cjk_word(w: &str) -> bool {
    !w.is_empty() && w.chars().all(crate::domain::util::is_cjk)
}

/// Whether a text holds term `w`, given the text lower-cased and its `terms` as a set: a term of
/// the set, or, for a CJK word, anywhere in the text. (A CJK run is paired from its own start, so
/// one word can be a term of one text and fall across two pairs of another: 经济增长 gives 经济,
/// 增长 but 高经济增长 gives 高经, 济增, 增长.) English terms are compared as before.
fn holds(set: &BTreeSet<String>, lowered: &str, w: &str) -> bool {
    set.contains(w) || (cjk_word(w) && lowered.contains(w))
}

/// The offline judge. `name` is the model label stored with its judgments.
#[derive(Debug, Clone)]
pub struct LexicalJudge {
    name: String,
}

impl LexicalJudge {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }

    fn score_sync(&self, trace: &TraceView, rubrics: &[Rubric], mode: ScoreMode) -> Scoring {
        let fabricated = unknown_cited_ids(trace);
        let lowered: [String; 4] =
            std::array::from_fn(|k| trace.text_for(Stage::ALL[k], mode).to_lowercase());
        let scores = rubrics
            .iter()
            .map(|r| {
                let (mut s, mut why) = score_lowered(r, &lowered[r.stage.index()]);
                if r.stage == Stage::Answer && !r.negative && !fabricated.is_empty() && s > 0 {
                    s -= 1;
                    why.push_str(&format!(
                        "; lowered one level: cites ids never retrieved ({})",
                        fabricated.join(", ")
                    ));
                }
                RubricScore {
                    rubric_id: r.id,
                    score: s,
                    justification: why,
                }
            })
            .collect();
        Scoring {
            scores,
            usage: LOCAL_CALL,
        }
    }

    fn generate_sync(
        &self,
        rollouts: &[TraceView],
        existing: &[Rubric],
        stages: &[Stage],
    ) -> Generated {
        let mut out = Generated {
            usage: LOCAL_CALL,
            ..Generated::default()
        };
        if rollouts.len() < 2 {
            return out;
        }
        // Quality signal: the lexical score against the existing Answer rubrics, else how many
        // answer terms are grounded in the rollout's own snippets.
        let answer_rubrics: Vec<&Rubric> = existing
            .iter()
            .filter(|r| r.stage == Stage::Answer)
            .collect();
        let quality: Vec<f64> = rollouts
            .iter()
            .map(|t| {
                if answer_rubrics.is_empty() {
                    grounded_terms(t) as f64
                } else {
                    let answer = t
                        .text_for(Stage::Answer, ScoreMode::Stagewise)
                        .to_lowercase();
                    answer_rubrics
                        .iter()
                        .map(|r| {
                            let (s, _) = score_lowered(r, &answer);
                            super::score::contribution(s, r.negative) * f64::from(r.weight)
                        })
                        .sum()
                }
            })
            .collect();
        let mut sorted = quality.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[(sorted.len() - 1) / 2];
        let strong: Vec<usize> = (0..rollouts.len())
            .filter(|&i| quality[i] > median)
            .collect();
        let weak: Vec<usize> = (0..rollouts.len())
            .filter(|&i| quality[i] <= median)
            .collect();
        if strong.is_empty() || weak.is_empty() {
            return out; // all rollouts alike: no dimension separates them
        }
        for &stage in stages {
            // Coverage is stage-local (method.md A.4.3: rubrics are stage-local, skip dimensions
            // already covered): a term an Answer rubric holds is still a dimension of another
            // stage ("the research retrieved the fact" is not "the answer states it"). A stage
            // whose texts are the same in every rollout of the group still gets no rubric: no
            // term separates them (BENCHMARKS.md, "Issue 25, session 22": the smoke world's plans).
            let covered: BTreeSet<String> = existing
                .iter()
                .filter(|r| r.stage == stage)
                .flat_map(key_terms)
                .collect();
            let lowered: Vec<String> = rollouts
                .iter()
                .map(|t| t.stage_text[stage.index()].to_lowercase())
                .collect();
            let sets: Vec<BTreeSet<String>> = rollouts
                .iter()
                .map(|t| {
                    terms(&t.stage_text[stage.index()])
                        .into_iter()
                        .filter(|w| substantive(w))
                        .collect()
                })
                .collect();
            let frac = |idx: &[usize], w: &str| {
                idx.iter()
                    .filter(|&&i| holds(&sets[i], &lowered[i], w))
                    .count() as f64
                    / idx.len() as f64
            };
            let mut gap: BTreeMap<String, f64> = BTreeMap::new();
            for w in sets.iter().flatten() {
                if !covered.contains(w) && !gap.contains_key(w) {
                    gap.insert(w.clone(), frac(&strong, w) - frac(&weak, w));
                }
            }
            let mut ranked: Vec<(String, f64)> = gap.into_iter().collect();
            // Largest gap first; ties by term for determinism.
            ranked.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()).then(a.0.cmp(&b.0)));
            let max_pos = if stage == Stage::Answer { 3 } else { 2 };
            let (mut pos, mut neg) = (0, 0);
            for (w, g) in ranked {
                if g.abs() < 0.5 {
                    break;
                }
                let name = stage.as_str();
                if g > 0.0 && pos < max_pos {
                    pos += 1;
                    out.per_stage[stage.index()].push(NewRubric {
                        title: format!("{name}: covers `{w}`"),
                        description: format!(
                            "The {name} stage addresses `{w}`, which stronger attempts at this task covered and weaker ones did not."
                        ),
                        weight: 1.0,
                        negative: false,
                        key_terms: vec![w],
                    });
                } else if g < 0.0 && neg < 1 {
                    neg += 1;
                    out.per_stage[stage.index()].push(NewRubric {
                        title: format!("{name}: dwells on `{w}`"),
                        description: format!(
                            "The {name} stage dwells on `{w}`, which marked the weaker attempts at this task."
                        ),
                        weight: 1.0,
                        negative: true,
                        key_terms: vec![w],
                    });
                }
                if pos == max_pos && neg == 1 {
                    break;
                }
            }
        }
        out
    }

    fn ground_sync(&self, question: &str, snippets: &[(String, String)]) -> Generated {
        let asked: BTreeSet<String> = terms(question).into_iter().collect();
        let asked_text = question.to_lowercase();
        let lowered: Vec<String> = snippets.iter().map(|(_, t)| t.to_lowercase()).collect();
        let sets: Vec<BTreeSet<String>> = snippets
            .iter()
            .map(|(_, text)| {
                terms(text)
                    .into_iter()
                    .filter(|w| substantive(w) && !holds(&asked, &asked_text, w))
                    .collect()
            })
            .collect();
        // Document frequency of each term across snippets, with the ids that contain it.
        let mut df: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for w in sets.iter().flatten().collect::<BTreeSet<_>>() {
            let ids: Vec<&str> = snippets
                .iter()
                .enumerate()
                .filter(|&(i, _)| holds(&sets[i], &lowered[i], w))
                .map(|(_, (id, _))| id.as_str())
                .collect();
            df.insert(w.clone(), ids);
        }
        let mut ranked: Vec<(String, Vec<&str>)> =
            df.into_iter().filter(|(_, ids)| ids.len() >= 2).collect();
        ranked.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let mut out = Generated {
            usage: LOCAL_CALL,
            ..Generated::default()
        };
        for (i, (w, ids)) in ranked.into_iter().take(5).enumerate() {
            out.per_stage[Stage::Answer.index()].push(NewRubric {
                title: format!("reports `{w}`"),
                description: format!(
                    "The answer reports what the retrieved sources say about `{w}` (sources {}).",
                    ids.iter().take(3).copied().collect::<Vec<_>>().join(", ")
                ),
                weight: if i < 3 { 2.0 } else { 1.0 },
                negative: false,
                key_terms: vec![w],
            });
        }
        out
    }

    fn claims_sync(
        &self,
        claims: &[Claim],
        snippets: &HashMap<String, String>,
    ) -> Vec<ClaimVerdict> {
        claims
            .iter()
            .map(|c| {
                let words = terms(&c.text);
                if c.ids.is_empty() {
                    let factual = c.text.chars().any(|ch| ch.is_ascii_digit()) || words.len() >= 8;
                    return ClaimVerdict {
                        support: if factual { 0.0 } else { 1.0 },
                        relevance: 1.0,
                    };
                }
                if c.ids.iter().any(|id| !snippets.contains_key(id)) {
                    return ClaimVerdict {
                        support: 0.0,
                        relevance: 0.0,
                    };
                }
                let source = c
                    .ids
                    .iter()
                    .filter_map(|id| snippets.get(id))
                    .map(|s| s.to_lowercase())
                    .collect::<Vec<_>>()
                    .join("\n");
                let hit = words.iter().filter(|w| source.contains(w.as_str())).count();
                let cov = if words.is_empty() {
                    0.0
                } else {
                    hit as f64 / words.len() as f64
                };
                ClaimVerdict {
                    support: if cov >= 0.5 {
                        1.0
                    } else if cov >= 0.2 {
                        0.5
                    } else {
                        0.0
                    },
                    relevance: if hit > 0 { 1.0 } else { 0.0 },
                }
            })
            .collect()
    }
}

/// Score one rubric against an already lower-cased text (callers lower a text once for all its
/// rubrics): coverage of its key terms ≥ 2/3 → 2, ≥ 1/3 → 1, else 0.
fn score_lowered(r: &Rubric, hay: &str) -> (u8, String) {
    let keys = key_terms(r);
    if keys.is_empty() {
        return (1, "no key terms to look for; neutral score".into());
    }
    let (hit, miss): (Vec<&String>, Vec<&String>) =
        keys.iter().partition(|k| hay.contains(k.as_str()));
    let cov = hit.len() as f64 / keys.len() as f64;
    let s = if cov >= 2.0 / 3.0 {
        2
    } else if cov >= 1.0 / 3.0 {
        1
    } else {
        0
    };
    let list = |v: &[&String]| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
    (
        s,
        format!(
            "{}/{} key terms present [{}]; missing [{}]",
            hit.len(),
            keys.len(),
            list(&hit),
            list(&miss)
        ),
    )
}

/// The lexical proxy of the reflection judge (method.md A.6.2), deterministic and labelled as
/// lexical wherever it is reported:
/// - diagnostic accuracy: 0.8 x the share of the evaluator's failed findings (raw score 0; all
///   findings when none failed) whose title terms the reflection names, + 0.2 x the share of the
///   reflection's terms that occur in the question, trajectory or findings (nothing invented);
/// - specificity: 0.7 x coverage of the question's terms (up to 5), + 0.3 x the share of the four
///   rubric sections present;
/// - scope: 0.5 if it has 1-4 takeaways, + 0.5 x the share of distinct takeaway lines;
/// - all three 0 when the blocks are degenerate text (`degenerate`): a phrase written twice in a
///   line, tag fragments or document ids copied from the attempt, which an LLM judge reads as
///   no diagnosis at all but term matching scored as high as clean reflections (BENCHMARKS.md,
///   issue 25 session 40).
pub fn grade_reflection(
    question: &str,
    trace: &TraceView,
    findings: &[Finding],
    candidate: &str,
) -> ReflectionGrade {
    let Some(blocks) = crate::domain::reflection::parse(candidate) else {
        return ReflectionGrade::default();
    };
    if degenerate(&blocks.rubrics) || degenerate(&blocks.takeaways) {
        return ReflectionGrade::default();
    }
    let text = format!("{}\n{}", blocks.rubrics, blocks.takeaways).to_lowercase();
    let own: BTreeSet<String> = terms(&text).into_iter().collect();
    let failed: Vec<&Finding> = findings.iter().filter(|f| f.score < 0.5).collect();
    let targets: Vec<&Finding> = if failed.is_empty() {
        findings.iter().collect()
    } else {
        failed
    };
    let coverage = if targets.is_empty() {
        1.0
    } else {
        targets
            .iter()
            .filter(|f| terms(&f.title).iter().any(|t| holds(&own, &text, t)))
            .count() as f64
            / targets.len() as f64
    };
    let mut seen_text = question.to_lowercase();
    for st in &trace.stage_text {
        seen_text.push_str(&st.to_lowercase());
    }
    for f in findings {
        seen_text.push_str(&f.title.to_lowercase());
        seen_text.push_str(&f.justification.to_lowercase());
    }
    let grounded = if own.is_empty() {
        0.0
    } else {
        own.iter()
            .filter(|t| seen_text.contains(t.as_str()))
            .count() as f64
            / own.len() as f64
    };
    let q_terms: BTreeSet<String> = terms(question).into_iter().collect();
    let q_cover = if q_terms.is_empty() {
        0.0
    } else {
        let hits = q_terms.iter().filter(|t| holds(&own, &text, t)).count();
        (hits as f64 / q_terms.len().min(5) as f64).min(1.0)
    };
    let sections = [
        "critical requirement",
        "analytical approach",
        "communication",
        "pitfall",
    ];
    let present = sections
        .iter()
        .filter(|s| blocks.rubrics.to_lowercase().contains(*s))
        .count() as f64
        / sections.len() as f64;
    let lines: Vec<String> = blocks
        .takeaways
        .lines()
        .map(|l| l.trim().trim_start_matches(['-', '*', ' ']).to_lowercase())
        .filter(|l| !l.is_empty())
        .collect();
    let distinct = lines.iter().collect::<BTreeSet<_>>().len();
    let scope = if lines.is_empty() {
        0.0
    } else {
        let count_ok = if (1..=4).contains(&lines.len()) {
            0.5
        } else {
            0.0
        };
        count_ok + 0.5 * distinct as f64 / lines.len() as f64
    };
    ReflectionGrade {
        diagnostic_accuracy: 0.8 * coverage + 0.2 * grounded,
        specificity: 0.7 * q_cover + 0.3 * present,
        scope,
    }
}

/// Whether a reflection block is degenerate: a line that holds a phrase of at least
/// `REPEAT_MIN_WORDS` words twice (case-insensitive; "of every link has a snippet id of every
/// link has a snippet id", "none seen; 3 links found: none seen; 3 links found"), an angle
/// bracket (tag fragments copied from the attempt: `">`, `<think>`, `rubrics>`), or a document
/// id of the research world (`protein-00476`: a hyphen and five digits).
fn degenerate(block: &str) -> bool {
    const REPEAT_MIN_WORDS: usize = 4;
    if block.contains(['<', '>']) {
        return true;
    }
    let doc_id = |w: &str| {
        w.split('-')
            .skip(1)
            .any(|p| p.len() >= 5 && p.chars().take(5).all(|c| c.is_ascii_digit()))
    };
    block.lines().any(|line| {
        let w: Vec<String> = line.split_whitespace().map(str::to_lowercase).collect();
        if w.iter().any(|x| doc_id(x)) {
            return true;
        }
        let mut seen = std::collections::HashSet::new();
        w.windows(REPEAT_MIN_WORDS).any(|g| !seen.insert(g))
    })
}

/// Cited ids of the answer that are not among the trajectory's snippets, sorted.
fn unknown_cited_ids(trace: &TraceView) -> Vec<String> {
    let Some(a) = &trace.answer else {
        return vec![];
    };
    let ids: BTreeSet<String> = super::citation::split_claims(a)
        .into_iter()
        .flat_map(|c| c.ids)
        .filter(|id| !trace.snippets.contains_key(id))
        .collect();
    ids.into_iter().collect()
}

/// Distinct answer terms that occur in the trajectory's own snippets.
fn grounded_terms(t: &TraceView) -> usize {
    let Some(a) = &t.answer else { return 0 };
    let source = t
        .snippets
        .values()
        .map(|s| s.to_lowercase())
        .collect::<Vec<_>>()
        .join("\n");
    terms(a)
        .into_iter()
        .collect::<BTreeSet<_>>()
        .iter()
        .filter(|w| source.contains(w.as_str()))
        .count()
}

impl Judge for LexicalJudge {
    fn model(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> JudgeKind {
        JudgeKind::Lexical
    }

    fn generate<'a>(
        &'a self,
        _question: &'a str,
        rollouts: &'a [TraceView],
        existing: &'a [Rubric],
        stages: &'a [Stage],
    ) -> BoxFuture<'a, Result<Generated, JudgeError>> {
        Box::pin(async move { Ok(self.generate_sync(rollouts, existing, stages)) })
    }

    fn score<'a>(
        &'a self,
        _question: &'a str,
        trace: &'a TraceView,
        rubrics: &'a [Rubric],
        mode: ScoreMode,
    ) -> BoxFuture<'a, Result<Scoring, JudgeError>> {
        Box::pin(async move { Ok(self.score_sync(trace, rubrics, mode)) })
    }

    fn score_rubric<'a>(
        &'a self,
        _question: &'a str,
        trace: &'a TraceView,
        rubric: &'a Rubric,
        mode: ScoreMode,
    ) -> BoxFuture<'a, Result<(RubricScore, Usage), JudgeError>> {
        Box::pin(async move {
            let mut s = self.score_sync(trace, std::slice::from_ref(rubric), mode);
            let score = s.scores.pop().ok_or_else(|| {
                JudgeError::Input("the lexical judge returned no score for its rubric".into())
            })?;
            Ok((score, s.usage))
        })
    }

    fn ground<'a>(
        &'a self,
        question: &'a str,
        snippets: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<Generated, JudgeError>> {
        Box::pin(async move { Ok(self.ground_sync(question, snippets)) })
    }

    fn claims<'a>(
        &'a self,
        _question: &'a str,
        claims: &'a [Claim],
        snippets: &'a HashMap<String, String>,
    ) -> BoxFuture<'a, Result<(Vec<ClaimVerdict>, Usage), JudgeError>> {
        Box::pin(async move { Ok((self.claims_sync(claims, snippets), LOCAL_CALL)) })
    }

    fn reflect<'a>(
        &'a self,
        question: &'a str,
        trace: &'a TraceView,
        findings: &'a [Finding],
        candidates: &'a [String],
    ) -> BoxFuture<'a, Result<(Vec<ReflectionGrade>, Usage), JudgeError>> {
        Box::pin(async move {
            let grades = candidates
                .iter()
                .map(|c| grade_reflection(question, trace, findings, c))
                .collect();
            Ok((grades, LOCAL_CALL))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::judge::Origin;

    #[test]
    fn degenerate_reflections_grade_zero() {
        // Blocks written by the smoke policy after RL (session 40's bank), and clean ones.
        assert!(degenerate(
            "- Answer only when every link has a snippet id of every link has a snippet id of \
             every fact."
        ));
        assert!(degenerate(
            "- appeared\">It was discovered the name each snippet gives before answer."
        ));
        assert!(degenerate("Pitfalls: none seen </answer>"));
        assert!(degenerate(
            "Critical Requirement: the compound that Doltorlin (protein<think>"
        ));
        assert!(degenerate(
            "Critical Requirement: where that protein-00476 gene: it encodes,"
        ));
        assert!(degenerate(
            "Pitfalls: none seen; 3 links found: none seen; 3 links found, 3 cited."
        ));
        for clean in [
            "Pitfalls: none seen; 4 links found, 4 cited.",
            "- Cite the snippet id of every fact; search every link.",
            "Critical Requirement: write a short report on the NARKA9 gene: the protein it \
             encodes, where that protein is expressed, what it binds, and when and where its \
             binding partner was discovered.",
            "Pitfalls: answered after 2 of 3 links; stopped at Lumgrofel (protein).",
            "- Search the name each snippet gives before answering.\n- Search again.",
            "Analytical Approach: one search per link: The KAOX6 gene, on to Morvemi (protein).",
            "no no no",
        ] {
            assert!(!degenerate(clean), "{clean}");
        }
        let trace = TraceView::default();
        let wrap = |r: &str, t: &str| {
            format!(
                "<reflection_rubrics>{r}</reflection_rubrics>\n\
                 <reflection_takeaways>{t}</reflection_takeaways>"
            )
        };
        let q = "Which compound is bound by the protein that the KAOX6 gene encodes?";
        let rubrics = "Critical Requirement: which compound is bound by the protein that the \
                       KAOX6 gene encodes.\nPitfalls: none seen.";
        let clean = grade_reflection(q, &trace, &[], &wrap(rubrics, "- Cite every fact."));
        assert!(clean.specificity > 0.3 && clean.scope > 0.5, "{clean:?}");
        let looped = grade_reflection(
            q,
            &trace,
            &[],
            &wrap(
                rubrics,
                "- Cite every fact of every link of every fact of every link of every fact.",
            ),
        );
        assert_eq!(looped, ReflectionGrade::default());
    }

    fn rubric(title: &str, description: &str) -> Rubric {
        Rubric {
            id: uuid::Uuid::now_v7(),
            stage: Stage::Answer,
            title: title.into(),
            description: description.into(),
            weight: 1.0,
            negative: false,
            key_terms: vec![],
            origin: Origin::Dataset,
        }
    }

    fn score(r: &Rubric, report: &str) -> u8 {
        let view = TraceView {
            stage_text: [
                String::new(),
                String::new(),
                String::new(),
                report.to_string(),
            ],
            answer: Some(report.to_string()),
            ..TraceView::default()
        };
        let s = LexicalJudge::new("lexical").score_sync(
            &view,
            std::slice::from_ref(r),
            ScoreMode::Stagewise,
        );
        s.scores[0].score
    }

    #[test]
    fn terms_read_cjk_runs_as_two_character_words() {
        // ASCII rules unchanged: ≥ 3 chars, stopwords out; 的 is a function character.
        assert_eq!(terms("GPT-4模型的性能"), vec!["gpt", "模型", "性能"]);
        assert_eq!(terms("人工智能技术"), vec!["人工", "智能", "技术"]);
        // An odd run ends with an overlapping pair; a lone character stays itself.
        assert_eq!(terms("老龄化"), vec!["老龄", "龄化"]);
        assert_eq!(terms("水"), vec!["水"]);
        // The script changes inside one alphanumeric token: cut there.
        assert_eq!(
            terms("Transformer架构2017年"),
            vec!["transformer", "架构", "2017", "年"]
        );
        // Boilerplate words go, like "report" and "explains" in English.
        assert_eq!(terms("报告是否说明了碳排放"), vec!["碳排", "排放"]);
        // Kana and Hangul are CJK runs too; emoji and punctuation separate.
        assert_eq!(terms("인공지능 연구"), vec!["인공", "지능", "연구"]);
        assert!(terms("東京の人口").contains(&"東京".to_string()));
        assert_eq!(terms("数据🚀模型，。！"), vec!["数据", "模型"]);
        assert!(terms("").is_empty() && terms("🚀🔥 ok …").is_empty());
        assert!(terms("的了是在").is_empty());
        // English text as before.
        assert_eq!(
            terms("The model's accuracy improves with more data"),
            vec!["model", "accuracy", "improves", "data"]
        );
    }

    #[test]
    fn key_terms_of_a_chinese_rubric_are_words() {
        let zh = rubric(
            "芯片出口管制对中国半导体产业的影响",
            "讨论先进设备受限、国产替代和研发投入的变化",
        );
        let keys = key_terms(&zh);
        assert_eq!(keys.len(), 8, "{keys:?}");
        assert!(keys.iter().all(|k| k.chars().count() == 2), "{keys:?}");
        assert!(keys.contains(&"芯片".to_string()) && keys.contains(&"管制".to_string()));
        // A lone character (涉 of 涉及, cut at 及) is no key term while there are words.
        let keys = key_terms(&rubric("涉及碳排放", ""));
        assert_eq!(keys, vec!["碳排", "排放"]);
        assert_eq!(key_terms(&rubric("水", "")), vec!["水"]);
        // English rubrics keep 6 terms.
        let en = rubric(
            "Impact of chip export controls on China's semiconductor industry",
            "Discusses restricted advanced equipment and domestic substitution",
        );
        assert_eq!(
            key_terms(&en),
            vec![
                "impact",
                "chip",
                "export",
                "controls",
                "china",
                "semiconductor"
            ]
        );
    }

    /// A hand-written Chinese report that covers the rubric in its own order and sentences (not
    /// built from the rubric's text) scores as the English pair does; unrelated reports get 0.
    #[test]
    fn a_paraphrased_chinese_report_scores_like_its_english_counterpart() {
        let zh = rubric(
            "芯片出口管制对中国半导体产业的影响",
            "讨论先进设备受限、国产替代和研发投入的变化",
        );
        let en = rubric(
            "Impact of chip export controls on China's semiconductor industry",
            "Discusses restricted advanced equipment, domestic substitution and changes in R&D spending",
        );
        let zh_on = "由于美国限制向中国出口先进光刻设备，国内半导体企业不得不加快国产替代；\
                     芯片产业的研发投入因此大增。这些管制带来的影响在未来几年仍会显现。";
        let en_on = "Because the US restricted exports of advanced lithography equipment to China, \
                     domestic semiconductor firms had to speed up substitution; R&D spending in the \
                     chip industry rose sharply. The impact of these controls will last for years.";
        let zh_off = "今年夏天雨水偏多，农民担心水稻收成，城市里的游泳馆人满为患。";
        let en_off = "This summer was rainy, farmers worry about the rice harvest, and city \
                      swimming pools were packed.";
        assert_eq!((score(&zh, zh_on), score(&en, en_on)), (2, 2));
        assert_eq!((score(&zh, zh_off), score(&en, en_off)), (0, 0));
        // The pair of tests/judge.rs (lexical_judge_scores_chinese_reports_like_english_ones).
        let ageing = rubric(
            "人口老龄化对经济增长的影响",
            "指出劳动力供给减少和养老支出上升",
        );
        let report = "随着老龄化程度加深，劳动人口占比下降，经济增长因此放缓；\
                      这种影响在未来十年会更明显。";
        assert_eq!(score(&ageing, report), 2);
        assert_eq!(
            score(&ageing, "今天天气晴朗，适合去公园散步，晚上可以看电影。"),
            0
        );
        // Odd reports never panic.
        for text in ["", "水", "🚀", "a", "中", "ｇｐｔ４模型"] {
            assert!(score(&zh, text) <= 2 && score(&en, text) <= 2);
        }
    }

    /// A term the Answer rubrics already hold still makes a Plan rubric when it separates the
    /// group's plans (coverage is per stage); a Plan rubric on the term stops a second one.
    #[test]
    fn a_term_covered_by_an_answer_rubric_still_makes_a_plan_rubric() {
        let view = |plan: &str, answer: &str| TraceView {
            stage_text: [plan.into(), String::new(), String::new(), answer.into()],
            answer: Some(answer.into()),
            ..TraceView::default()
        };
        // Two plans read the question's entity (Orlavex) and their answers name the river; two
        // misread it (Orlando) and answer something else.
        let group = vec![
            view(
                "Find where Orlavex was founded, then its river.",
                "Orlavex lies on the Taumere river.",
            ),
            view(
                "Search Orlavex founding city and river.",
                "The Taumere river runs by Orlavex.",
            ),
            view("Find where Orlando was founded.", "It lies on a lake."),
            view("Search Orlando founding city.", "Unknown."),
        ];
        let mut answer = rubric("Names Orlavex and the Taumere", "");
        answer.key_terms = vec!["orlavex".into(), "taumere".into()];
        let judge = LexicalJudge::new("lexical");
        let plan_terms = |existing: &[Rubric]| -> Vec<(String, bool)> {
            judge
                .generate_sync(&group, existing, &[Stage::Plan])
                .per_stage[Stage::Plan.index()]
            .iter()
            .map(|r| (r.key_terms[0].clone(), r.negative))
            .collect()
        };
        let got = plan_terms(std::slice::from_ref(&answer));
        assert!(got.contains(&("orlavex".into(), false)), "{got:?}");
        assert!(got.contains(&("orlando".into(), true)), "{got:?}");
        // Once a Plan rubric holds the term, the plan stage does not get it again.
        let mut plan = rubric("Plan reads Orlavex", "");
        plan.stage = Stage::Plan;
        plan.key_terms = vec!["orlavex".into()];
        let got = plan_terms(&[answer, plan]);
        assert!(!got.iter().any(|(t, _)| t == "orlavex"), "{got:?}");
    }

    /// Grounding finds words that recur across Chinese snippets, also where a snippet's pairs
    /// fall across the word (新型固态锂电池能量密度 pairs as 锂电, 池能, 量密, ...).
    #[test]
    fn grounding_reads_chinese_snippets() {
        let snippets = vec![
            ("s1".to_string(), "电池能量密度提高".to_string()),
            ("s2".to_string(), "新型固态锂电池能量密度更高".to_string()),
            ("s3".to_string(), "今天天气晴朗".to_string()),
        ];
        let g = LexicalJudge::new("lexical").ground_sync("电动车的发展", &snippets);
        let got: Vec<(&str, &str)> = g.per_stage[Stage::Answer.index()]
            .iter()
            .map(|r| (r.key_terms[0].as_str(), r.description.as_str()))
            .collect();
        for word in ["电池", "能量", "密度"] {
            assert!(
                got.iter()
                    .any(|(k, d)| *k == word && d.contains("sources s1, s2")),
                "{word}: {got:?}"
            );
        }
        assert!(got.iter().all(|(k, _)| !k.contains('天')), "{got:?}");
        // English grounding as before: ≥ 4 letters, in ≥ 2 snippets.
        let snippets = vec![
            (
                "a".to_string(),
                "Lithium batteries store energy".to_string(),
            ),
            (
                "b".to_string(),
                "Solid-state batteries store more energy".to_string(),
            ),
        ];
        let g = LexicalJudge::new("lexical").ground_sync("battery", &snippets);
        let keys: Vec<&str> = g.per_stage[Stage::Answer.index()]
            .iter()
            .map(|r| r.key_terms[0].as_str())
            .collect();
        assert_eq!(keys, vec!["batteries", "energy", "store"]);
    }
}
