//! The offline teacher's post-mortem: a reflection demonstration (the two blocks of method.md
//! A.6.1) written from what one RubricEM-scaffold trajectory shows: its plan's checklist, the
//! searches it made, whether it answered, the snippet ids its answer cites and whether an exact
//! answer is boxed. No gold rubric, known answer or judge finding reaches it, so SFT on these
//! rows teaches the form of a post-mortem and how to read an attempt, not the answer key
//! (issue 25: a warm start without them wrote 0 valid reflections of 1,152).

/// What a trajectory shows, read from its text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    /// Items of the plan's knowledge checklist (0 when there is no plan).
    pub checklist: usize,
    /// The queries of its tool calls, in order.
    pub searches: Vec<String>,
    /// An `<answer>` block was closed.
    pub answered: bool,
    /// Distinct snippet ids cited in the answer, in order.
    pub cited: Vec<String>,
    /// The answer holds `\boxed{`.
    pub boxed: bool,
}

/// Read a trajectory's text (every segment, model and tool, in order) with the scaffold parser
/// the judge and the rollout summaries use: closed tool calls only, and the answer's citations
/// and box only when its block is closed.
pub fn read(trajectory: &str) -> Seen {
    let p = crate::domain::scaffold::parse::parse(trajectory, &|_| true);
    let mut cited: Vec<String> = Vec::new();
    if p.answer_closed {
        for id in p.citations.iter().flat_map(|c| &c.ids) {
            if !cited.contains(id) {
                cited.push(id.clone());
            }
        }
    }
    Seen {
        checklist: p
            .plan
            .as_ref()
            .and_then(|pl| pl.rubric.as_ref())
            .map_or(0, |r| r.knowledge.len()),
        searches: p
            .tool_calls
            .iter()
            .filter(|t| t.closed)
            .map(|t| t.query.trim().to_string())
            .collect(),
        answered: p.answer_closed,
        boxed: p.answer_closed && p.boxed.is_some(),
        cited,
    }
}

/// The question as a clause: trimmed, without its closing punctuation, lower case first.
fn clause(question: &str) -> String {
    let q = question.trim().trim_end_matches(['?', '.', '!']).trim();
    let mut c = q.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

const SEARCH_ON: &str = "Search the name each snippet gives before answering.";
const CITE: &str = "Cite the snippet id of every fact.";

/// The two blocks for a trajectory that shows `seen`, ending with the closing tag the
/// meta-policy's generation stops at (`parse::STOP`). `exact`: the question asks for one boxed
/// answer. Short: the smoke preset's candidates stop at 192 tokens (BENCHMARKS.md, issue 25).
pub fn write(question: &str, seen: &Seen, exact: bool) -> String {
    let n = seen.searches.len();
    let path = match seen.searches.as_slice() {
        [] => "none".to_string(),
        [one] => one.clone(),
        [first, .., last] => format!("{first}, on to {last}"),
    };
    let box_it = if exact { "; box the answer" } else { "" };
    // The attempt's own failure, the first that shows, or none.
    let (pitfall, lesson) = if !seen.answered {
        (format!("no answer after {n} searches."), SEARCH_ON)
    } else if seen.checklist > 0 && n < seen.checklist {
        (
            format!(
                "answered after {n} of {} links; stopped at {}.",
                seen.checklist,
                seen.searches.last().map_or("the question", String::as_str)
            ),
            "Answer only when every link has a snippet.",
        )
    } else if seen.cited.is_empty() {
        ("the answer cites no snippet.".to_string(), CITE)
    } else if exact && !seen.boxed {
        (
            "no boxed answer.".to_string(),
            "End with the one boxed answer asked for.",
        )
    } else {
        (
            format!("none seen; {n} links found, {} cited.", seen.cited.len()),
            SEARCH_ON,
        )
    };
    let second = if lesson == CITE { SEARCH_ON } else { CITE };
    format!(
        "<reflection_rubrics>\n\
         Critical Requirement: {q}.\n\
         Analytical Approach: one search per link: {path}.\n\
         Communication & Structure: cite each fact's snippet id{box_it}.\n\
         Pitfalls: {pitfall}\n\
         </reflection_rubrics>\n\
         <reflection_takeaways>\n- {lesson}\n- {second}\n</reflection_takeaways>",
        q = clause(question),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "<think>\n2 facts.\n</think>\n<structured_plan>\n<rubric>\nKnowledge checklist:\n- Who founded Orvane Mills\n- Where that person was born\nAnalytical criteria:\n- Each fact leads to the next.\n</rubric>\n</structured_plan>\n<call_tool name=\"google_search\">Orvane Mills</call_tool>\n[s1] Orvane Mills was founded by Ada Kell.\n<call_tool name=\"google_search\">Ada Kell</call_tool>\n[s4] Ada Kell was born in Tarsk.\n<answer>\n<cite id=\"s1\">Orvane Mills was founded by Ada Kell.</cite>\n<cite id=\"s4\">Ada Kell was born in Tarsk.</cite>\nThe answer is \\boxed{Tarsk}.\n</answer>";

    #[test]
    fn reads_what_the_trajectory_shows() {
        let s = read(FULL);
        assert_eq!(s.checklist, 2);
        assert_eq!(s.searches, vec!["Orvane Mills", "Ada Kell"]);
        assert!(s.answered && s.boxed);
        assert_eq!(s.cited, vec!["s1", "s4"]);
        assert_eq!(read("no scaffold at all"), Seen::default());
        // An unclosed call or answer is not counted.
        let cut = read("<call_tool name=\"x\">a</call_tool><call_tool name=\"x\">b");
        assert_eq!(cut.searches, vec!["a"]);
        assert!(!read("<answer>half").answered);
    }

    #[test]
    fn each_attempt_gets_its_own_pitfall_and_a_valid_post_mortem() {
        let q = "Where was the founder of Orvane Mills born?";
        let full = write(q, &read(FULL), true);
        let b = crate::domain::reflection::parse(&full).expect("valid blocks");
        assert!(full.ends_with(crate::domain::reflection::STOP));
        assert!(
            b.rubrics
                .starts_with("Critical Requirement: where was the founder of Orvane Mills born.")
        );
        assert!(
            b.rubrics
                .contains("one search per link: Orvane Mills, on to Ada Kell.")
        );
        assert!(
            b.rubrics
                .contains("Pitfalls: none seen; 2 links found, 2 cited.")
        );
        for s in [
            "Analytical Approach",
            "Communication & Structure",
            "Pitfalls",
        ] {
            assert!(b.rubrics.contains(s), "{s}");
        }
        // Stopped after the first link: the pitfall names where the chain stops.
        let short = FULL
            .split("<call_tool name=\"google_search\">Ada Kell")
            .next()
            .unwrap();
        let short = format!("{short}<answer>\n<cite id=\"s1\">x</cite>\n</answer>");
        let b = crate::domain::reflection::parse(&write(q, &read(&short), true)).unwrap();
        assert!(
            b.rubrics
                .contains("Pitfalls: answered after 1 of 2 links; stopped at Orvane Mills."),
            "{}",
            b.rubrics
        );
        assert!(b.takeaways.starts_with("- Answer only when every link"));
        // No answer; an answer without a box; an answer without citations.
        let none = write(q, &read(&FULL[..FULL.find("<answer>").unwrap()]), true);
        assert!(none.contains("Pitfalls: no answer after 2 searches."));
        let unboxed = write(q, &read(&FULL.replace("\\boxed{Tarsk}", "Tarsk")), true);
        assert!(unboxed.contains("Pitfalls: no boxed answer."));
        assert!(
            !write(q, &read(&FULL.replace("\\boxed{Tarsk}", "Tarsk")), false).contains("boxed")
        );
        let uncited = write(
            q,
            &read(
                &FULL
                    .replace("<cite id=\"s1\">", "<cite>")
                    .replace("<cite id=\"s4\">", "<cite>"),
            ),
            true,
        );
        assert!(uncited.contains("Pitfalls: the answer cites no snippet."));
        // A report request ends with a full stop: the clause drops it.
        assert!(
            write("Write a short report on Ada Kell.", &read(FULL), false)
                .contains("Critical Requirement: write a short report on Ada Kell.\n")
        );
        // Takeaways: 1 to 4 distinct lines, as the prompt asks.
        for t in [&full, &none, &unboxed, &uncited] {
            let b = crate::domain::reflection::parse(t).unwrap();
            let lines: Vec<&str> = b.takeaways.lines().collect();
            assert!((1..=4).contains(&lines.len()));
            let set: std::collections::BTreeSet<&&str> = lines.iter().collect();
            assert_eq!(set.len(), lines.len());
        }
    }
}
