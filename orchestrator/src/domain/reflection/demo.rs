//! The offline teacher's post-mortem: a reflection demonstration (the two blocks of method.md
//! A.6.1) written from what one RubricEM-scaffold trajectory shows: its plan's checklist, the
//! searches it made, whether it answered, the snippet ids its answer cites and whether an exact
//! answer is boxed. No gold rubric, known answer or judge finding reaches it, so SFT on these
//! rows teaches the form of a post-mortem and how to read an attempt, not the answer key
//! (issue 25: a warm start without them wrote 0 valid reflections of 1,152).

use std::collections::HashMap;

/// What a trajectory shows, read from its text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    /// Items of the plan's knowledge checklist (0 when there is no plan).
    pub checklist: usize,
    /// The queries of its tool calls, in order.
    pub searches: Vec<String>,
    /// The query searched most often and how often, when some query was searched again (an
    /// attempt that loops on one name until the budget runs out); None otherwise.
    pub repeated: Option<(String, usize)>,
    /// What the model's own text (tool outputs left out) keeps writing over and over, when a
    /// line or a three-word phrase occurs `LOOP_MIN` times or more: how a small policy at
    /// temperature 0.7 runs to its token budget (`<call_tool>` line after line, or one phrase
    /// until the budget; BENCHMARKS.md, issue 25 session 39). None otherwise.
    pub looped: Option<String>,
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
    let searches: Vec<String> = p
        .tool_calls
        .iter()
        .filter(|t| t.closed)
        .map(|t| t.query.trim().to_string())
        .collect();
    Seen {
        checklist: p
            .plan
            .as_ref()
            .and_then(|pl| pl.rubric.as_ref())
            .map_or(0, |r| r.knowledge.len()),
        repeated: most_repeated(&searches),
        looped: looped(trajectory),
        searches,
        answered: p.answer_closed,
        boxed: p.answer_closed && p.boxed.is_some(),
        cited,
    }
}

/// A line or phrase of the model's own text seen this often is a loop, not a scaffold: a
/// finished four-search attempt writes its most frequent line (`<think>`) five times.
pub const LOOP_MIN: usize = 8;

/// The model's text without the tool outputs. An output left open runs to the end, or to the
/// marker where `clip_middle` cut the middle out of a long attempt (the part after it is the
/// attempt's tail, which the reflection job shows as it is).
fn model_text(trajectory: &str) -> String {
    const CLIPPED: &str = " bytes omitted ...]\n";
    let mut out = String::new();
    let mut rest = trajectory;
    while let Some(i) = rest.find("<tool_output>") {
        out.push_str(&rest[..i]);
        let open = &rest[i..];
        let close = open
            .find("</tool_output>")
            .map(|j| j + "</tool_output>".len());
        let clip = open.find(CLIPPED).map(|j| j + CLIPPED.len());
        match (close, clip) {
            (Some(c), Some(m)) => rest = &open[c.min(m)..],
            (Some(e), None) | (None, Some(e)) => rest = &open[e..],
            (None, None) => return out,
        }
    }
    out.push_str(rest);
    out
}

/// The line, else the three-word phrase, that the model's text repeats most, when it does so
/// `LOOP_MIN` times or more (the first to reach the highest count), cut to 40 characters.
fn looped(trajectory: &str) -> Option<String> {
    fn most<'a>(items: impl Iterator<Item = &'a str>) -> Option<(&'a str, usize)> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let mut best: Option<(&str, usize)> = None;
        for it in items {
            let c = counts.entry(it).or_default();
            *c += 1;
            if best.is_none_or(|(_, b)| *c > b) {
                best = Some((it, *c));
            }
        }
        best.filter(|(_, c)| *c >= LOOP_MIN)
    }
    let text = model_text(trajectory);
    let hit =
        most(text.lines().map(str::trim).filter(|l| !l.is_empty())).map(|(l, _)| l.to_string());
    let hit = hit.or_else(|| {
        let words: Vec<&str> = text.split_whitespace().collect();
        let grams: Vec<String> = words.windows(3).map(|w| w.join(" ")).collect();
        most(grams.iter().map(String::as_str)).map(|(g, _)| g.to_string())
    })?;
    Some(hit.chars().take(40).collect::<String>().trim().to_string())
}

/// The query searched most often (the first of equals) when it was searched more than once.
fn most_repeated(searches: &[String]) -> Option<(String, usize)> {
    let mut best: Option<(String, usize)> = None;
    for q in searches {
        let k = searches
            .iter()
            .filter(|x| x.eq_ignore_ascii_case(q))
            .count();
        if k > 1 && best.as_ref().is_none_or(|(_, b)| k > *b) {
            best = Some((q.clone(), k));
        }
    }
    best
}

/// The searches without repeats, in first-search order.
fn distinct(searches: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for q in searches {
        if !out.iter().any(|x| x.eq_ignore_ascii_case(q)) {
            out.push(q.clone());
        }
    }
    out
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
const ONCE: &str = "Search each name once; answer when the chain ends.";
const LOOP: &str = "Write each block once; end with the answer.";

/// The two blocks for a trajectory that shows `seen`, ending with the closing tag the
/// meta-policy's generation stops at (`parse::STOP`). `exact`: the question asks for one boxed
/// answer. Short: the smoke preset's candidates stop at 192 tokens (BENCHMARKS.md, issue 25).
pub fn write(question: &str, seen: &Seen, exact: bool) -> String {
    let n = seen.searches.len();
    let links = distinct(&seen.searches);
    let path = match links.as_slice() {
        [] => "none".to_string(),
        [one] => one.clone(),
        [first, .., last] => format!("{first}, on to {last}"),
    };
    let box_it = if exact { "; box the answer" } else { "" };
    // The attempt's own failure, the first that shows, or none.
    let (pitfall, lesson) = if let (false, Some(l)) = (seen.answered, &seen.looped) {
        (format!("no answer; the text loops on \"{l}\"."), LOOP)
    } else if let (false, Some((q, k))) = (seen.answered, &seen.repeated) {
        (format!("no answer; searched {q} {k} times."), ONCE)
    } else if !seen.answered {
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
    fn loops_and_repeated_searches_are_read_and_named() {
        let q = "Where was the founder of Orvane Mills born?";
        let head = &FULL[..FULL
            .find("<call_tool name=\"google_search\">Ada Kell")
            .unwrap()];
        // A tag line over and over (the first loop session 39 sampled), the forced answer
        // opened and never closed.
        let tags = format!(
            "{head}{}\n<answer>\n{}",
            "<call_tool>\n".repeat(40),
            "<call_tool>".repeat(5)
        );
        let s = read(&tags);
        assert!(!s.answered);
        assert_eq!(s.looped.as_deref(), Some("<call_tool>"));
        let pm = write(q, &s, true);
        assert!(
            pm.contains("Pitfalls: no answer; the text loops on \"<call_tool>\"."),
            "{pm}"
        );
        assert!(
            pm.contains("- Write each block once; end with the answer."),
            "{pm}"
        );
        assert!(crate::domain::reflection::parse(&pm).is_some());
        // One phrase on one line (the second).
        let phrase = format!(
            "{head}Found: Ada Kell{}",
            " the compound- expressed".repeat(30)
        );
        assert_eq!(
            read(&phrase).looped.as_deref(),
            Some("the compound- expressed")
        );
        // A snippet that repeats itself is the tool's text, not a loop of the model's.
        let tool = format!(
            "{head}<tool_output>{}</tool_output>",
            "The nomenclature was harmonised.\n".repeat(20)
        );
        assert_eq!(read(&tool).looped, None);
        // Clipped in the middle of a tool output: the loop in the tail is still read.
        let long = format!(
            "{head}<tool_output>{}{}",
            "a".repeat(5_000),
            "<call_tool>\n".repeat(600)
        );
        let shown = crate::domain::judge::view::clip_middle(&long, 6_000);
        assert!(!shown.contains("</tool_output>"));
        assert_eq!(read(&shown).looped.as_deref(), Some("<call_tool>"));
        // A finished attempt, and a finished one with a loop in it, are not budget loops.
        assert_eq!(read(FULL).looped, None);
        let answered = FULL.replace(
            "</think>\n<structured_plan>",
            &format!("{}</think>\n<structured_plan>", "x y z ".repeat(12)),
        );
        let s = read(&answered);
        assert!(s.answered && s.looped.is_some());
        assert!(write(q, &s, true).contains("Pitfalls: none seen;"));
        // The same name searched again and again without an answer.
        let again = format!(
            "{head}{}",
            "<call_tool name=\"google_search\">Orvane Mills</call_tool>[s1] x\n".repeat(3)
        );
        let s = read(&again);
        assert_eq!(s.repeated, Some(("Orvane Mills".to_string(), 4)));
        assert_eq!(s.looped, None);
        let pm = write(q, &s, true);
        assert!(
            pm.contains("Pitfalls: no answer; searched Orvane Mills 4 times."),
            "{pm}"
        );
        assert!(pm.contains("one search per link: Orvane Mills.\n"), "{pm}");
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
