//! The offline teacher's plan, written from the question alone (no gold rubric, no known
//! answer): the question is split into what it asks outright and the entities it refers to
//! without naming them (relative clauses, innermost first), or, for a report request, into the
//! parts it lists; these become the self-rubric's knowledge checklist and the research plan.

use crate::infra::chat::AnswerFormat;

/// A plan a reader of the question alone could write.
#[derive(Debug, Clone, PartialEq)]
pub struct QuestionPlan {
    /// Knowledge checklist items, each a full sentence.
    pub checklist: Vec<String>,
    /// `<deep_analysis>` text (without the question, which the caller states).
    pub analysis: String,
    /// Numbered `<research_plan>` steps.
    pub steps: Vec<String>,
}

/// Words that open a relative clause (an entity the question describes instead of naming).
const RELATIVE: [&str; 4] = ["that", "whose", "which", "who"];
/// A relative word after one of these opens the question itself ("In which city …").
const PREPOSITIONS: [&str; 10] = [
    "in", "on", "at", "of", "by", "for", "to", "from", "with", "about",
];

fn sentence_case(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// The question without its closing punctuation and with single spaces.
fn clean(q: &str) -> String {
    q.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches(['?', '.', '!'])
        .trim()
        .to_string()
}

/// The noun phrase a clause ends with: from its last article on (or its last word).
fn tail_phrase(words: &[&str]) -> String {
    let start = words
        .iter()
        .rposition(|w| matches!(w.to_lowercase().as_str(), "the" | "a" | "an"))
        .unwrap_or(words.len().saturating_sub(1));
    words[start..].join(" ")
}

/// The question split at its relative words: the main clause, then each (relative word,
/// clause) in reading order.
fn clauses(q: &str) -> (Vec<&str>, Vec<(&str, Vec<&str>)>) {
    let words: Vec<&str> = q.split(' ').collect();
    let mut main = Vec::new();
    let mut rel: Vec<(&str, Vec<&str>)> = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let lw = w.to_lowercase();
        let opens = i > 0
            && RELATIVE.contains(&lw.as_str())
            && !PREPOSITIONS.contains(&words[i - 1].to_lowercase().as_str())
            && i + 1 < words.len();
        if opens {
            rel.push((w, Vec::new()));
        } else if let Some((_, c)) = rel.last_mut() {
            c.push(w);
        } else {
            main.push(*w);
        }
    }
    (main, rel)
}

/// The plan for `query`.
pub fn from_question(query: &str, format: AnswerFormat) -> QuestionPlan {
    let q = clean(query);
    let support = "stated with a retrieved snippet that supports it";
    let boxed = if format == AnswerFormat::Exact {
        ", given in \\boxed{}"
    } else {
        ""
    };
    // A report request: "Write … on X: a, b, and c".
    if let Some((head, list)) = q.split_once(':') {
        let parts: Vec<String> = list
            .split([',', ';'])
            .map(|p| p.trim())
            .map(|p| p.strip_prefix("and ").unwrap_or(p).trim())
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        if !parts.is_empty() {
            let subject = [" on ", " about ", " of "]
                .iter()
                .find_map(|k| head.rfind(k).map(|i| head[i + k.len()..].trim()))
                .unwrap_or(head.trim());
            let checklist = parts
                .iter()
                .map(|p| format!("{}, {support}.", sentence_case(p)))
                .collect();
            return QuestionPlan {
                checklist,
                analysis: format!(
                    "The request names its subject ({subject}) and lists {} parts the report \
                     must cover; each part may need its own search, and later parts depend on \
                     what the earlier ones find.",
                    parts.len()
                ),
                steps: vec![
                    format!("Search for {subject} to find the first listed part."),
                    "Search for each entity a result names, in turn, until every listed part \
                     has a supporting snippet."
                        .to_string(),
                    "If a search comes back empty, search again with the exact name the last \
                     snippet gives."
                        .to_string(),
                ],
            };
        }
    }
    let (main, rel) = clauses(&q);
    // Each relative clause describes the entity its preceding clause ends with.
    let mut links = Vec::new();
    let mut before: &[&str] = &main;
    for (word, clause) in &rel {
        links.push(format!(
            "{} {word} {}",
            sentence_case(&tail_phrase(before)),
            clause.join(" ")
        ));
        before = clause;
    }
    links.reverse(); // innermost (what the question names) first
    let asked = sentence_case(&main.join(" "));
    let mut checklist: Vec<String> = links.iter().map(|l| format!("{l}, {support}.")).collect();
    checklist.push(format!(
        "The answer to \"{asked}\", named explicitly{boxed}, {support}."
    ));
    let mut steps = Vec::new();
    for (i, l) in links.iter().enumerate() {
        let l = lower_first(l);
        steps.push(if i == 0 {
            format!("Search for what the question names to identify {l}.")
        } else {
            format!("Search for the entity step {i} finds to identify {l}.")
        });
    }
    steps.push(if links.is_empty() {
        format!("Search for the answer to \"{asked}\".")
    } else {
        format!(
            "Search for the entity step {} finds to answer \"{asked}\".",
            links.len()
        )
    });
    steps.push(
        "If a search comes back empty, search again with the exact name the last snippet gives."
            .to_string(),
    );
    QuestionPlan {
        analysis: if links.is_empty() {
            "It asks for one fact; it must come from a search, not from memory.".to_string()
        } else {
            format!(
                "It refers to {} entities it does not name; each is a link to find by search, \
                 innermost first, before the asked fact can be found. No link can be guessed.",
                links.len()
            )
        },
        checklist,
        steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_questions_become_links_then_the_asked_fact() {
        let p = from_question(
            "Which compound is bound by the protein that the KAVE3 gene encodes?",
            AnswerFormat::Exact,
        );
        assert_eq!(
            p.checklist,
            vec![
                "The protein that the KAVE3 gene encodes, stated with a retrieved snippet that supports it.",
                "The answer to \"Which compound is bound by the protein\", named explicitly, given in \\boxed{}, stated with a retrieved snippet that supports it.",
            ]
        );
        assert_eq!(p.steps.len(), 3);
        let p = from_question(
            "In which city is the institute located whose researchers discovered the compound that Tavlin binds?",
            AnswerFormat::Exact,
        );
        assert_eq!(p.checklist.len(), 3, "{:?}", p.checklist);
        assert!(p.checklist[0].starts_with("The compound that Tavlin binds"));
        assert!(
            p.checklist[1]
                .starts_with("The institute located whose researchers discovered the compound")
        );
        assert!(
            p.checklist[2].starts_with("The answer to \"In which city is the institute located\"")
        );
        assert!(p.analysis.contains("2 entities"));
    }

    #[test]
    fn reports_list_their_parts_and_plain_questions_ask_one_fact() {
        let p = from_question(
            "Write a short report on the KAVE3 gene: the protein it encodes, where that protein is expressed, and what it binds.",
            AnswerFormat::Long,
        );
        assert_eq!(
            p.checklist,
            vec![
                "The protein it encodes, stated with a retrieved snippet that supports it.",
                "Where that protein is expressed, stated with a retrieved snippet that supports it.",
                "What it binds, stated with a retrieved snippet that supports it.",
            ]
        );
        assert!(p.steps[0].contains("the KAVE3 gene"));
        let p = from_question("Who wrote Middlemarch?", AnswerFormat::Short);
        assert_eq!(p.checklist.len(), 1);
        assert!(p.checklist[0].contains("\"Who wrote Middlemarch\""));
    }
}
