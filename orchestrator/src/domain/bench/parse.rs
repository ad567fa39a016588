//! Tolerant, validated parsers of grader replies, one per grader kind of the benchmarks'
//! protocols (benchmarks.md §12.1): markdown fences and surrounding prose are skipped, the first
//! balanced JSON value is taken, and every field the protocol needs is checked. A reply that
//! does not parse is an error naming what was expected (the caller retries, then records it);
//! the protocols whose parsers never fail (SimpleQA's letter, DR Tulu's `correct: yes|no`) are
//! ported with their defaults.

use serde_json::Value;

use super::RaceDimension;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("the reply is empty")]
    Empty,
    #[error("no JSON {expected} in the reply: {excerpt:?}")]
    NoJson {
        expected: &'static str,
        excerpt: String,
    },
    #[error("field `{field}`: {message}")]
    Field { field: String, message: String },
    #[error("expected {expected} entries, got {got}")]
    Count { expected: usize, got: usize },
    #[error("unknown label {label:?}")]
    UnknownLabel { label: String },
}

fn excerpt(text: &str) -> String {
    text.chars().take(120).collect()
}

/// The first balanced JSON value of kind `open` (`{` or `[`) in `text` that parses.
fn first_json(text: &str, open: char) -> Option<Value> {
    let close = if open == '{' { '}' } else { ']' };
    for (start, _) in text.match_indices(open) {
        let rest = &text[start..];
        let (mut depth, mut in_str, mut esc) = (0usize, false, false);
        for (i, c) in rest.char_indices() {
            if in_str {
                match (esc, c) {
                    (true, _) => esc = false,
                    (false, '\\') => esc = true,
                    (false, '"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => in_str = true,
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        if let Ok(v) = serde_json::from_str(&rest[..=i]) {
                            return Some(v);
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    None
}

/// The first JSON object of a reply that parses (for the other parsers of LLM replies).
pub fn first_object(text: &str) -> Option<Value> {
    first_json(text, '{')
}

fn object(text: &str) -> Result<Value, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    first_json(text, '{').ok_or_else(|| ParseError::NoJson {
        expected: "object",
        excerpt: excerpt(text),
    })
}

fn field(field: &str, message: impl Into<String>) -> ParseError {
    ParseError::Field {
        field: field.to_string(),
        message: message.into(),
    }
}

/// A number, or a string holding one.
fn number(v: &Value) -> Option<f64> {
    v.as_f64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        .filter(|x: &f64| x.is_finite())
}

/// HealthBench's per-criterion grade.
#[derive(Debug, Clone, PartialEq)]
pub struct Met {
    pub met: bool,
    pub explanation: String,
}

/// `{"explanation": str, "criteria_met": bool}` (criteria_met must be a JSON bool, as the
/// protocol requires; anything else is retried).
pub fn binary_met(text: &str) -> Result<Met, ParseError> {
    let v = object(text)?;
    let met = v
        .get("criteria_met")
        .ok_or_else(|| field("criteria_met", "missing"))?
        .as_bool()
        .ok_or_else(|| field("criteria_met", "not a boolean"))?;
    Ok(Met {
        met,
        explanation: v["explanation"].as_str().unwrap_or("").to_string(),
    })
}

/// ResearchRubrics' verdict labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerdictLabel {
    Satisfied,
    PartiallySatisfied,
    NotSatisfied,
}

impl VerdictLabel {
    /// The released code's binary grading: partial counts as not satisfied.
    pub fn binary_score(self) -> f64 {
        f64::from(u8::from(self == VerdictLabel::Satisfied))
    }

    /// The paper's ternary grading.
    pub fn ternary_score(self) -> f64 {
        match self {
            VerdictLabel::Satisfied => 1.0,
            VerdictLabel::PartiallySatisfied => 0.5,
            VerdictLabel::NotSatisfied => 0.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub verdict: VerdictLabel,
    pub score: f64,
    pub confidence: Option<f64>,
}

/// `{verdict, score, confidence, ...}`; the score must agree with the verdict.
pub fn verdict(text: &str) -> Result<Verdict, ParseError> {
    let v = object(text)?;
    let label = v["verdict"]
        .as_str()
        .ok_or_else(|| field("verdict", "missing or not a string"))?;
    let norm = label.trim().to_lowercase().replace(['_', '-'], " ");
    let verdict = match norm.as_str() {
        "satisfied" => VerdictLabel::Satisfied,
        "partially satisfied" | "partial" => VerdictLabel::PartiallySatisfied,
        "not satisfied" | "unsatisfied" => VerdictLabel::NotSatisfied,
        _ => {
            return Err(ParseError::UnknownLabel {
                label: label.to_string(),
            });
        }
    };
    let score = match v.get("score") {
        Some(s) => number(s).ok_or_else(|| field("score", "not a number"))?,
        None => verdict.ternary_score(),
    };
    if (score - verdict.ternary_score()).abs() > 1e-9 {
        return Err(field(
            "score",
            format!("{score} disagrees with the verdict {label:?}"),
        ));
    }
    Ok(Verdict {
        verdict,
        score,
        confidence: v.get("confidence").and_then(number),
    })
}

/// ResearchQA's five labels, one per line, mapped to (x - 1) / 4. Lines may carry an
/// enumerator (`1.`, `-`) and trailing punctuation; the count must equal `n`.
pub fn coverage_labels(text: &str, n: usize) -> Result<Vec<f64>, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let labels: Vec<f64> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let l = l.trim_start_matches(|c: char| {
                c.is_ascii_digit() || matches!(c, '.' | ')' | '-' | '*')
            });
            let l = l
                .trim()
                .trim_end_matches(['.', ',', ';'])
                .trim()
                .to_lowercase();
            match l.as_str() {
                "not at all" => Ok(0.0),
                "barely" => Ok(0.25),
                "moderately" => Ok(0.5),
                "mostly" => Ok(0.75),
                "completely" => Ok(1.0),
                _ => Err(ParseError::UnknownLabel { label: l }),
            }
        })
        .collect::<Result<_, _>>()?;
    if labels.len() != n {
        return Err(ParseError::Count {
            expected: n,
            got: labels.len(),
        });
    }
    Ok(labels)
}

/// SQA's joint ingredient grading `{"scores": [{criteria_idx, score, ...}]}`: every index
/// 0..n exactly once (0-based as the prompt numbers them), score 0, 1 or 2.
pub fn ingredient_scores(text: &str, n: usize) -> Result<Vec<u8>, ParseError> {
    let v = object(text)?;
    let list = v["scores"]
        .as_array()
        .ok_or_else(|| field("scores", "missing or not a list"))?;
    let mut out: Vec<Option<u8>> = vec![None; n];
    for e in list {
        let idx = number(&e["criteria_idx"])
            .filter(|x| x.fract() == 0.0 && *x >= 0.0)
            .ok_or_else(|| field("criteria_idx", "missing or not an index"))?
            as usize;
        let score = number(&e["score"])
            .filter(|x| matches!(*x as i64, 0..=2) && x.fract() == 0.0)
            .ok_or_else(|| field("score", "not 0, 1 or 2"))? as u8;
        let slot = out
            .get_mut(idx)
            .ok_or_else(|| field("criteria_idx", format!("{idx} is out of range 0..{n}")))?;
        if slot.replace(score).is_some() {
            return Err(field("criteria_idx", format!("{idx} graded twice")));
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, s)| s.ok_or_else(|| field("criteria_idx", format!("criterion {i} not graded"))))
        .collect()
}

/// One judged RACE criterion.
#[derive(Debug, Clone, PartialEq)]
pub struct RaceJudged {
    pub criterion: String,
    pub target: f64,
    pub reference: f64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RaceJudgement {
    pub dims: std::collections::BTreeMap<String, Vec<RaceJudged>>,
}

/// RACE's merged reply: an object keyed by every dimension name, each a list of
/// `{criterion, analysis, article_1_score, article_2_score}` with scores in 0..=10.
pub fn race(text: &str, dims: &[RaceDimension]) -> Result<RaceJudgement, ParseError> {
    let v = object(text)?;
    let mut out = RaceJudgement::default();
    for d in dims {
        let list = v
            .get(&d.name)
            .and_then(Value::as_array)
            .ok_or_else(|| field(&d.name, "dimension missing or not a list"))?;
        let mut judged = Vec::with_capacity(list.len());
        for e in list {
            let score = |k: &str| {
                number(&e[k])
                    .filter(|x| (0.0..=10.0).contains(x))
                    .ok_or_else(|| field(&format!("{}.{k}", d.name), "missing or outside 0..=10"))
            };
            judged.push(RaceJudged {
                criterion: e["criterion"].as_str().unwrap_or("").to_string(),
                target: score("article_1_score")?,
                reference: score("article_2_score")?,
            });
        }
        if judged.is_empty() {
            return Err(field(&d.name, "no criterion scored"));
        }
        out.dims.insert(d.name.clone(), judged);
    }
    Ok(out)
}

/// SimpleQA's grades.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreeClass {
    Correct,
    Incorrect,
    NotAttempted,
}

/// simple-evals' rule: the first capital A, B or C anywhere in the reply (`re.search("(A|B|C)")`),
/// none -> NOT_ATTEMPTED. Faithful to the protocol, including its blind spot: a reply that
/// never writes the letter counts as not attempted.
pub fn three_class(text: &str) -> ThreeClass {
    match text.chars().find(|c| matches!(c, 'A' | 'B' | 'C')) {
        Some('A') => ThreeClass::Correct,
        Some('B') => ThreeClass::Incorrect,
        _ => ThreeClass::NotAttempted,
    }
}

/// DR Tulu's short-form judge: the first `correct: yes|no` (case-insensitive, any spaces after
/// the colon); none -> not correct.
pub fn yes_no(text: &str) -> bool {
    let lower = text.to_lowercase();
    for (i, _) in lower.match_indices("correct:") {
        let rest = lower[i + "correct:".len()..].trim_start();
        if rest.starts_with("yes") {
            return true;
        }
        if rest.starts_with("no") {
            return false;
        }
    }
    false
}

/// WebWalker's CoT-QA chain: the last `GRADE: CORRECT|INCORRECT`.
pub fn cot_grade(text: &str) -> Option<bool> {
    let upper = text.to_uppercase();
    let i = upper.rfind("GRADE:")?;
    let rest = upper[i + 6..].trim_start();
    if rest.starts_with("CORRECT") {
        Some(true)
    } else if rest.starts_with("INCORRECT") {
        Some(false)
    } else {
        None
    }
}

/// R1-Searcher's judge: "True" / "False" (the first one written).
pub fn true_false(text: &str) -> Option<bool> {
    let l = text.to_lowercase();
    match (l.find("true"), l.find("false")) {
        (Some(t), Some(f)) => Some(t < f),
        (Some(_), None) => Some(true),
        (None, Some(_)) => Some(false),
        (None, None) => None,
    }
}

/// SQA answer precision: `{"irrelevant_paragraphs": [{reason, answer_text}]}`.
pub fn irrelevant_paragraphs(text: &str) -> Result<Vec<String>, ParseError> {
    let v = object(text)?;
    let list = v["irrelevant_paragraphs"]
        .as_array()
        .ok_or_else(|| field("irrelevant_paragraphs", "missing or not a list"))?;
    list.iter()
        .map(|e| {
            e["answer_text"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| field("answer_text", "missing or not a string"))
        })
        .collect()
}

/// An id as the judge wrote it: a string, or a bare number.
fn id_list(v: &Value, name: &str) -> Result<Vec<String>, ParseError> {
    match v {
        Value::Null => Ok(vec![]),
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.trim().to_string()),
                Value::Number(n) => Ok(n.to_string()),
                _ => Err(field(name, "an id is neither a string nor a number")),
            })
            .collect(),
        _ => Err(field(name, "not a list")),
    }
}

/// SQA's citation-group judgement `{"claims": [{text, supporting, non_supporting,
/// is_fully_supported}]}` (`is_fully_supported` a JSON bool; an empty claim list is valid: a
/// section of introductory sentences only).
pub fn citation_claims(text: &str) -> Result<Vec<super::cite::ClaimJudgement>, ParseError> {
    let v = object(text)?;
    let list = v["claims"]
        .as_array()
        .ok_or_else(|| field("claims", "missing or not a list"))?;
    list.iter()
        .map(|c| {
            Ok(super::cite::ClaimJudgement {
                text: c["text"].as_str().unwrap_or("").to_string(),
                supporting: id_list(&c["supporting"], "supporting")?,
                non_supporting: id_list(&c["non_supporting"], "non_supporting")?,
                is_fully_supported: c["is_fully_supported"]
                    .as_bool()
                    .ok_or_else(|| field("is_fully_supported", "missing or not a bool"))?,
            })
        })
        .collect()
}

/// FACT's extraction: a JSON list `[{fact, ref_idx, url}]` (`[]` for a report without inline
/// citations). `ref_idx` may be a number; `url` may be missing.
pub fn fact_triples(text: &str) -> Result<Vec<super::cite::FactTriple>, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let v = first_json(text, '[').ok_or_else(|| ParseError::NoJson {
        expected: "list",
        excerpt: excerpt(text),
    })?;
    let list = v.as_array().cloned().unwrap_or_default();
    list.iter()
        .map(|e| {
            let fact = e["fact"]
                .as_str()
                .filter(|f| !f.trim().is_empty())
                .ok_or_else(|| field("fact", "missing or empty"))?;
            let ref_idx = match &e["ref_idx"] {
                Value::String(s) => s.trim().to_string(),
                Value::Number(n) => n.to_string(),
                _ => String::new(),
            };
            Ok(super::cite::FactTriple {
                fact: fact.trim().to_string(),
                ref_idx,
                url: e["url"].as_str().unwrap_or("").trim().to_string(),
            })
        })
        .collect()
}

/// FACT's deduplication: the 0-based indices of the unique statements among `n`, as a JSON
/// list (or `{"unique": [...]}`); at least one, each in range, no repeats.
pub fn unique_indices(text: &str, n: usize) -> Result<Vec<usize>, ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let v = first_json(text, '{')
        .and_then(|o| o.get("unique").cloned())
        .or_else(|| first_json(text, '['))
        .ok_or_else(|| ParseError::NoJson {
            expected: "list of indices",
            excerpt: excerpt(text),
        })?;
    let list = v.as_array().ok_or_else(|| field("unique", "not a list"))?;
    let mut out = Vec::new();
    for x in list {
        let i = number(x)
            .filter(|x| x.fract() == 0.0 && *x >= 0.0)
            .ok_or_else(|| field("unique", "an entry is not an index"))? as usize;
        if i >= n {
            return Err(field("unique", format!("{i} is out of range 0..{n}")));
        }
        if !out.contains(&i) {
            out.push(i);
        }
    }
    if out.is_empty() && n > 0 {
        return Err(field("unique", "no statement kept"));
    }
    out.sort_unstable();
    Ok(out)
}

/// FACT's validation: `[{idx, result}]` with exactly one entry per statement 0..n (the protocol
/// retries a reply of another length), result supported / unsupported / unknown.
pub fn fact_results(text: &str, n: usize) -> Result<Vec<super::cite::Support>, ParseError> {
    use super::cite::Support;
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let v = first_json(text, '[').ok_or_else(|| ParseError::NoJson {
        expected: "list",
        excerpt: excerpt(text),
    })?;
    let list = v.as_array().cloned().unwrap_or_default();
    if list.len() != n {
        return Err(ParseError::Count {
            expected: n,
            got: list.len(),
        });
    }
    let mut out: Vec<Option<Support>> = vec![None; n];
    for e in &list {
        let i = number(&e["idx"])
            .filter(|x| x.fract() == 0.0 && *x >= 0.0)
            .ok_or_else(|| field("idx", "missing or not an index"))? as usize;
        let label = e["result"].as_str().unwrap_or("").trim().to_lowercase();
        let r = match label.as_str() {
            "supported" => Support::Supported,
            "unsupported" => Support::Unsupported,
            "unknown" => Support::Unknown,
            other => {
                return Err(ParseError::UnknownLabel {
                    label: other.to_string(),
                });
            }
        };
        let slot = out
            .get_mut(i)
            .ok_or_else(|| field("idx", format!("{i} is out of range 0..{n}")))?;
        if slot.replace(r).is_some() {
            return Err(field("idx", format!("{i} judged twice")));
        }
    }
    Ok(out
        .into_iter()
        .map(|r| r.unwrap_or(Support::Unknown))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::bench::RaceCriterion;
    use proptest::prelude::*;

    const REFUSAL: &str = "I'm sorry, but I can't help with that.";

    #[test]
    fn citation_and_fact_parsers_validate_what_the_protocols_need() {
        let c = citation_claims(
            "```json\n{\"claims\": [{\"text\": \"a\", \"supporting\": [\"[1]\", 2], \"non_supporting\": [], \"is_fully_supported\": true}]}\n```",
        )
        .unwrap();
        assert_eq!(c[0].supporting, vec!["[1]", "2"]);
        assert!(citation_claims("{\"claims\": []}").unwrap().is_empty());
        assert!(citation_claims("{\"claims\": [{\"text\": \"a\", \"supporting\": []}]}").is_err());
        assert!(citation_claims(REFUSAL).is_err());

        let t = fact_triples(
            "Here: [{\"fact\": \"X rose\", \"ref_idx\": 3, \"url\": \"https://x.org\"}]",
        )
        .unwrap();
        assert_eq!(
            (t[0].ref_idx.as_str(), t[0].url.as_str()),
            ("3", "https://x.org")
        );
        assert!(fact_triples("[]").unwrap().is_empty());
        assert!(fact_triples("[{\"ref_idx\": 1}]").is_err());
        assert!(fact_triples("[{\"fact\": \"x\"").is_err(), "truncated");

        assert_eq!(unique_indices("[2, 0, 2]", 3).unwrap(), vec![0, 2]);
        assert_eq!(unique_indices("{\"unique\": [1]}", 2).unwrap(), vec![1]);
        assert!(unique_indices("[5]", 3).is_err());
        assert!(unique_indices("[]", 3).is_err());

        use crate::domain::bench::cite::Support;
        let r = fact_results(
            "[{\"idx\": 1, \"result\": \"unknown\"}, {\"idx\": 0, \"result\": \"Supported\"}]",
            2,
        )
        .unwrap();
        assert_eq!(r, vec![Support::Supported, Support::Unknown]);
        assert!(matches!(
            fact_results("[{\"idx\": 0, \"result\": \"supported\"}]", 2),
            Err(ParseError::Count { .. })
        ));
        assert!(fact_results("[{\"idx\": 0, \"result\": \"maybe\"}]", 1).is_err());
        assert!(fact_results("[{\"idx\": 0, \"result\": \"supported\"}, {\"idx\": 0, \"result\": \"supported\"}]", 2).is_err());
    }

    #[test]
    fn binary_met_tolerates_fences_and_prose_and_rejects_the_rest() {
        let fenced =
            "Sure.\n```json\n{\"explanation\": \"has it\", \"criteria_met\": true}\n```\nDone.";
        assert_eq!(
            binary_met(fenced).unwrap(),
            Met {
                met: true,
                explanation: "has it".into()
            }
        );
        assert!(
            !binary_met("{\"criteria_met\": false, \"explanation\": \"{x}\"}")
                .unwrap()
                .met
        );
        assert!(matches!(
            binary_met("{\"criteria_met\": \"yes\"}"),
            Err(ParseError::Field { .. })
        ));
        assert!(matches!(
            binary_met("{\"explanation\": \"cut"),
            Err(ParseError::NoJson { .. })
        ));
        assert!(matches!(
            binary_met(REFUSAL),
            Err(ParseError::NoJson { .. })
        ));
        assert_eq!(binary_met("  "), Err(ParseError::Empty));
    }

    #[test]
    fn verdicts_coverage_and_ingredients() {
        let v = verdict(r#"{"verdict": "Partially Satisfied", "score": 0.5, "confidence": 0.8}"#)
            .unwrap();
        assert_eq!(v.verdict, VerdictLabel::PartiallySatisfied);
        assert_eq!(
            (v.verdict.binary_score(), v.verdict.ternary_score()),
            (0.0, 0.5)
        );
        assert!(verdict(r#"{"verdict": "Satisfied", "score": 0.0}"#).is_err());
        assert!(matches!(
            verdict(r#"{"verdict": "Maybe"}"#),
            Err(ParseError::UnknownLabel { .. })
        ));
        assert_eq!(
            coverage_labels("Completely\n\n2. Barely\nnot at all.", 3).unwrap(),
            vec![1.0, 0.25, 0.0]
        );
        assert_eq!(
            coverage_labels("Mostly", 2),
            Err(ParseError::Count {
                expected: 2,
                got: 1
            })
        );
        assert!(matches!(
            coverage_labels("Kind of", 1),
            Err(ParseError::UnknownLabel { .. })
        ));
        assert!(coverage_labels(REFUSAL, 1).is_err());
        let j =
            r#"{"scores": [{"criteria_idx": 1, "score": 2}, {"criteria_idx": 0, "score": "1"}]}"#;
        assert_eq!(ingredient_scores(j, 2).unwrap(), vec![1, 2]);
        assert!(ingredient_scores(j, 3).is_err(), "criterion 2 missing");
        assert!(ingredient_scores(r#"{"scores": [{"criteria_idx": 0, "score": 3}]}"#, 1).is_err());
    }

    #[test]
    fn race_needs_every_dimension_with_scores_in_range() {
        let dims = vec![
            RaceDimension {
                name: "insight".into(),
                weight: 0.6,
                criteria: vec![RaceCriterion {
                    criterion: "c".into(),
                    explanation: String::new(),
                    weight: 1.0,
                }],
            },
            RaceDimension {
                name: "readability".into(),
                weight: 0.4,
                criteria: vec![RaceCriterion {
                    criterion: "d".into(),
                    explanation: String::new(),
                    weight: 1.0,
                }],
            },
        ];
        let ok = r#"```json
{"insight": [{"criterion": "c", "analysis": "x", "article_1_score": 7, "article_2_score": "5.5"}],
 "readability": [{"criterion": "d", "analysis": "y", "article_1_score": 6, "article_2_score": 6}]}
```"#;
        let j = race(ok, &dims).unwrap();
        assert_eq!(j.dims["insight"][0].reference, 5.5);
        let missing =
            r#"{"insight": [{"criterion": "c", "article_1_score": 7, "article_2_score": 5}]}"#;
        assert!(matches!(
            race(missing, &dims),
            Err(ParseError::Field { .. })
        ));
        let high = ok.replace("\"article_1_score\": 7", "\"article_1_score\": 11");
        assert!(race(&high, &dims).is_err());
        assert!(race(&ok[..ok.len() / 2], &dims).is_err(), "truncated");
    }

    #[test]
    fn short_answer_grades_follow_their_protocols() {
        assert_eq!(three_class("A"), ThreeClass::Correct);
        assert_eq!(three_class("The grade is B"), ThreeClass::Incorrect);
        assert_eq!(three_class("no letter"), ThreeClass::NotAttempted);
        assert_eq!(three_class(REFUSAL), ThreeClass::NotAttempted);
        assert!(yes_no(
            "extracted_final_answer: x\nreasoning: y\nCorrect:  Yes"
        ));
        assert!(!yes_no("correct: no"));
        assert!(!yes_no(REFUSAL));
        assert_eq!(cot_grade("step 1...\nGRADE: CORRECT"), Some(true));
        assert_eq!(cot_grade("GRADE: INCORRECT"), Some(false));
        assert_eq!(true_false("False. Not aligned"), Some(false));
        assert_eq!(
            irrelevant_paragraphs(
                r#"{"irrelevant_paragraphs": [{"reason": "r", "answer_text": "P2"}]}"#
            )
            .unwrap(),
            vec!["P2"]
        );
        assert!(irrelevant_paragraphs(REFUSAL).is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".{0,300}") {
            let _ = binary_met(&s);
            let _ = verdict(&s);
            let _ = coverage_labels(&s, 3);
            let _ = ingredient_scores(&s, 3);
            let _ = race(&s, &[]);
            let _ = three_class(&s);
            let _ = yes_no(&s);
            let _ = cot_grade(&s);
            let _ = irrelevant_paragraphs(&s);
        }
    }
}
