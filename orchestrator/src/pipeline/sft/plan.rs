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

/// The plan for `query`. Every part is as short as the scaffold allows (a 4-layer policy
/// imitates it and must then write it free-running; each template word is a token it can loop
/// on): checklist items are the question's own clauses, the analysis and the steps one line.
pub fn from_question(query: &str, format: AnswerFormat) -> QuestionPlan {
    let q = clean(query);
    let boxed = if format == AnswerFormat::Exact {
        ", in \\boxed{}"
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
                .map(|p| format!("{}.", sentence_case(p)))
                .collect();
            return QuestionPlan {
                checklist,
                analysis: format!("A report on {subject} in {} parts.", parts.len()),
                steps: vec![
                    format!("Search {subject}."),
                    "Search each entity a result names.".to_string(),
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
    let mut checklist: Vec<String> = links.iter().map(|l| format!("{l}.")).collect();
    checklist.push(format!("The answer to \"{asked}\"{boxed}."));
    let mut steps = vec!["Search what the question names.".to_string()];
    if !links.is_empty() {
        steps.push("Search the entity each result names.".to_string());
    }
    QuestionPlan {
        analysis: if links.is_empty() {
            "One fact, from a search.".to_string()
        } else {
            format!("{} unnamed links, innermost first.", links.len())
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
                "The protein that the KAVE3 gene encodes.",
                "The answer to \"Which compound is bound by the protein\", in \\boxed{}.",
            ]
        );
        assert_eq!(p.steps.len(), 2);
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
        assert_eq!(p.analysis, "2 unnamed links, innermost first.");
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
                "The protein it encodes.",
                "Where that protein is expressed.",
                "What it binds.",
            ]
        );
        assert_eq!(p.steps[0], "Search the KAVE3 gene.");
        assert_eq!(p.analysis, "A report on the KAVE3 gene in 3 parts.");
        let p = from_question("Who wrote Middlemarch?", AnswerFormat::Short);
        assert_eq!(
            p.checklist,
            vec!["The answer to \"Who wrote Middlemarch\"."]
        );
        assert_eq!(p.steps.len(), 1);
    }
}
