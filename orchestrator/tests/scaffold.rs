//! The scaffold parser: stage spans per method.md A.2.4, tool calls, self-rubric, review,
//! answer and citations, SFT rejection rules, and property tests that it never panics and always
//! partitions the text into ordered stage spans.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use orchestrator::domain::scaffold::sft::{Rejection, Round, check, postprocess};
use orchestrator::domain::scaffold::{extract_boxed, normalize_tool_name, parse};
use orchestrator::domain::trajectory::Stage;
use proptest::prelude::*;

const PLAN: &str = "<think>The user asks about Tn5.</think>\n<structured_plan>\n<deep_analysis>Needs mechanism and uses.</deep_analysis>\n<rubric>\nKnowledge checklist:\n- cut-and-paste mechanism\n- hyperactive mutant\nAnalytical criteria:\n- compare with Tn7\nNegative constraints:\n- do not present blogs as consensus\n</rubric>\n<research_plan>1. search mechanism 2. search uses</research_plan>\n</structured_plan>\n";
const CALL1: &str =
    "<call_tool name=\"google_search\" gl=\"us\">Tn5 transposase mechanism</call_tool>";
const RESEARCH: &str = "<think>Got mechanism.</think><state_evaluation>Mechanism covered; uses missing.</state_evaluation><call_tool name=\"Scholar_Search\" limit=\"5\" year=\"2015-2025\" fieldsOfStudy=\"Biology\">Tn5 tagmentation &amp; ATAC-seq</call_tool>";
const REVIEW: &str = "<think>Enough evidence.</think><state_evaluation>All items covered.</state_evaluation><review><rubric_review>mechanism: S1; uses: S2</rubric_review><writing_plan>thesis, two sections</writing_plan></review>";
const ANSWER: &str = "<answer>## Tn5\n<cite id=\"S1\">Tn5 moves by cut-and-paste</cite> and <cite id=\"S2, X9\">is used in ATAC-seq</cite>. Final: \\boxed{cut-and-paste}</answer>";

fn full() -> String {
    format!("{PLAN}{CALL1}{RESEARCH}{REVIEW}{ANSWER}")
}

fn known(id: &str) -> bool {
    id == "S1" || id == "S2"
}

#[test]
fn stage_spans_follow_the_boundary_rule() {
    let text = full();
    let p = parse(&text, &known);
    let plan_end = text.find("</structured_plan>").unwrap() + "</structured_plan>".len();
    let review_think = text.rfind("<think>Enough").unwrap();
    let answer = text.find("<answer>").unwrap();
    assert_eq!(
        p.stage_spans,
        [
            0..plan_end,
            plan_end..review_think,
            review_think..answer,
            answer..text.len()
        ]
    );
    assert_eq!(p.stages_present, [true, true, true, true]);
    // The first turn's call_tool belongs to Research.
    assert_eq!(p.stage_at(text.find(CALL1).unwrap()), Stage::Research);
    assert_eq!(p.stage_at(0), Stage::Plan);
    assert_eq!(p.stage_at(review_think), Stage::Review);
    assert_eq!(p.stage_at(text.len() - 1), Stage::Answer);
}

#[test]
fn extracts_plan_rubric_tools_review_answer_citations() {
    let text = full();
    let p = parse(&text, &known);
    let plan = p.plan.clone().unwrap();
    assert_eq!(
        plan.deep_analysis.as_deref(),
        Some("Needs mechanism and uses.")
    );
    let r = plan.rubric.unwrap();
    assert_eq!(
        r.knowledge,
        vec!["cut-and-paste mechanism", "hyperactive mutant"]
    );
    assert_eq!(r.analytical, vec!["compare with Tn7"]);
    assert_eq!(r.negative, vec!["do not present blogs as consensus"]);
    assert_eq!(
        plan.research_plan.as_deref(),
        Some("1. search mechanism 2. search uses")
    );
    assert_eq!(p.tool_calls.len(), 2);
    assert_eq!(p.tool_calls[0].name, "google_search");
    assert_eq!(
        p.tool_calls[0].attrs.get("gl").map(String::as_str),
        Some("us")
    );
    assert_eq!(
        p.tool_calls[1].name, "snippet_search",
        "Scholar_Search is normalised"
    );
    assert_eq!(
        p.tool_calls[1].query, "Tn5 tagmentation & ATAC-seq",
        "entities unescaped"
    );
    assert_eq!(
        p.tool_calls[1]
            .attrs
            .get("fieldsOfStudy")
            .map(String::as_str),
        Some("Biology")
    );
    assert_eq!(
        p.tool_calls[1].attrs.get("year").map(String::as_str),
        Some("2015-2025")
    );
    assert_eq!(p.state_evaluations.len(), 2);
    let review = p.review.clone().unwrap();
    assert_eq!(
        review.rubric_review.as_deref(),
        Some("mechanism: S1; uses: S2")
    );
    assert_eq!(review.writing_plan.as_deref(), Some("thesis, two sections"));
    assert!(p.answer_closed);
    assert_eq!(p.boxed.as_deref(), Some("cut-and-paste"));
    assert_eq!(p.citations.len(), 2);
    assert!(p.citations[0].known);
    assert_eq!(p.citations[1].ids, vec!["S2", "X9"]);
    assert!(!p.citations[1].known);
    assert_eq!(p.citations[1].unknown_ids, vec!["X9"]);
    assert!(p.issues.is_empty(), "{:?}", p.issues);
    let json = p.to_json();
    assert_eq!(
        json["citations"][0]["known"], true,
        "the shape scripts/sql/citation_validity.sql reads"
    );
}

#[test]
fn aliases_are_accepted() {
    let text = "<scratchpad>x</scratchpad><structured_plan><analysis>a</analysis><rubrics>- k</rubrics></structured_plan><call_tool name=\"web_search\">q</call><think>t</think><review><rubrics_review>rr</rubrics_review></review><answer>done</answer>";
    let p = parse(text, &|_| false);
    let plan = p.plan.unwrap();
    assert_eq!(plan.deep_analysis.as_deref(), Some("a"));
    assert_eq!(plan.rubric.unwrap().other, vec!["k"]);
    assert_eq!(p.tool_calls[0].name, "google_search");
    assert!(p.tool_calls[0].closed, "</call> closes call_tool");
    assert_eq!(p.review.unwrap().rubric_review.as_deref(), Some("rr"));
    assert_eq!(p.stages_present, [true, true, true, true]);
}

#[test]
fn malformed_outputs_get_documented_stages() {
    // Never closes the plan, never answers: everything is Plan.
    let t = "<think>hmm <structured_plan><deep_analysis>never ends";
    let p = parse(t, &|_| false);
    assert_eq!(p.stage_spans[0], 0..t.len());
    assert_eq!(p.stages_present, [false, false, false, false]);
    assert!(!p.issues.is_empty());
    // No plan but an answer: Plan runs up to the answer.
    let t = "just text then <answer>x</answer>";
    let p = parse(t, &|_| false);
    let a = t.find("<answer>").unwrap();
    assert_eq!(p.stage_spans, [0..a, a..a, a..a, a..t.len()]);
    assert_eq!(p.stages_present, [false, false, false, true]);
    // Unclosed answer: still an answer, flagged.
    let p = parse(
        "<structured_plan></structured_plan><answer>cut off",
        &|_| false,
    );
    assert!(p.answer.is_some() && !p.answer_closed);
    // Stray markup is text.
    let p = parse(
        "a < b && c > d </review> <notatag> <answer x=>y</answer>",
        &|_| false,
    );
    assert!(p.answer_closed);
    assert!(p.issues.iter().any(|i| matches!(
        i,
        orchestrator::domain::scaffold::ParseIssue::StrayClose { .. }
    )));
}

#[test]
fn tool_names_and_boxed() {
    assert_eq!(normalize_tool_name("google_web_search"), "google_search");
    assert_eq!(normalize_tool_name("Scholar_Search"), "snippet_search");
    assert_eq!(normalize_tool_name("browse"), "browse_webpage");
    assert_eq!(normalize_tool_name("mcp_custom"), "mcp_custom");
    assert_eq!(
        extract_boxed("x \\boxed{a {b} c} y"),
        Some("a {b} c".into())
    );
    assert_eq!(extract_boxed("\\boxed{unclosed"), None);
}

#[test]
fn sft_rules_accept_a_good_trajectory_and_name_each_violation() {
    let r1 = format!("{PLAN}{CALL1}");
    let r2 = RESEARCH.to_string();
    let r3 = format!("{REVIEW}{ANSWER}");
    let good = [
        Round {
            text: &r1,
            tool_error: false,
        },
        Round {
            text: &r2,
            tool_error: true,
        },
        Round {
            text: &r3,
            tool_error: false,
        },
    ];
    assert_eq!(check(&good), vec![]);

    let no_answer = [
        Round {
            text: &r1,
            tool_error: false,
        },
        Round {
            text: &r2,
            tool_error: false,
        },
    ];
    assert!(check(&no_answer).contains(&Rejection::NoAnswer));

    let from_memory = [
        Round {
            text: "<think>x</think><structured_plan><deep_analysis>a</deep_analysis><rubric>r</rubric></structured_plan>I know it.",
            tool_error: false,
        },
        Round {
            text: &r3,
            tool_error: false,
        },
    ];
    assert!(check(&from_memory).contains(&Rejection::MissingToolCall { round: 0 }));
    // Answering in round 1, even as the only round, is answering from memory.
    let r1_answer = format!("{PLAN}{ANSWER}");
    let one_round = [Round {
        text: &r1_answer,
        tool_error: false,
    }];
    assert_eq!(
        check(&one_round),
        vec![Rejection::MissingToolCall { round: 0 }]
    );

    let no_plan = [
        Round {
            text: CALL1,
            tool_error: false,
        },
        Round {
            text: &r3,
            tool_error: false,
        },
    ];
    let rej = check(&no_plan);
    assert!(rej.iter().any(|r| matches!(r, Rejection::MissingPlan { missing } if missing.contains(&"structured_plan".to_string()))), "{rej:?}");

    let no_eval = [
        Round {
            text: &r1,
            tool_error: false,
        },
        Round {
            text: ANSWER,
            tool_error: false,
        },
    ];
    assert!(check(&no_eval).contains(&Rejection::MissingStateEvaluation { round: 1 }));

    let two_errors = [
        Round {
            text: &r1,
            tool_error: true,
        },
        Round {
            text: &r2,
            tool_error: true,
        },
        Round {
            text: &r3,
            tool_error: false,
        },
    ];
    assert!(check(&two_errors).contains(&Rejection::ConsecutiveToolErrors { from_round: 0 }));
    // Each rule's name is its serialised tag (rejections are counted under it).
    for r in [
        Rejection::NoAnswer,
        Rejection::MissingToolCall { round: 0 },
        Rejection::MissingPlan { missing: vec![] },
        Rejection::MissingStateEvaluation { round: 1 },
        Rejection::Malformed {
            round: 0,
            issues: vec![],
        },
        Rejection::ConsecutiveToolErrors { from_round: 0 },
    ] {
        assert_eq!(serde_json::to_value(&r).unwrap()["rule"], r.name());
    }

    let broken = format!("{PLAN}<think>unclosed {CALL1}");
    let rej = check(&[
        Round {
            text: &broken,
            tool_error: false,
        },
        Round {
            text: &r3,
            tool_error: false,
        },
    ]);
    assert!(
        rej.iter()
            .any(|r| matches!(r, Rejection::Malformed { round: 0, .. })),
        "{rej:?}"
    );
    assert!(check(&[]).contains(&Rejection::NoAnswer));
}

#[test]
fn postprocess_converts_scratchpad_and_tool_names() {
    let out = postprocess(
        "<scratchpad>x</scratchpad><call_tool name=\"google_web_search\" gl=\"us\">q</call_tool><call_tool name='Scholar_Search'>p</call_tool>",
    );
    assert_eq!(
        out,
        "<think>x</think><call_tool name=\"google_search\" gl=\"us\">q</call_tool><call_tool name='snippet_search'>p</call_tool>"
    );
}

#[test]
fn one_megabyte_of_adversarial_text() {
    let mut s = String::new();
    let pieces = [
        "<",
        "&",
        "</",
        "<think",
        "<answer>",
        "</answer",
        "<cite id=\"",
        "<<>>",
        "é",
        "\u{0}",
        "<call_tool name=\"x\"",
        ">",
        "<structured_plan>",
        "</structured_plan>",
    ];
    let mut k = 0usize;
    while s.len() < 1 << 20 {
        s.push_str(pieces[k % pieces.len()]);
        s.push_str(&"x".repeat(k % 7));
        k = k.wrapping_mul(31).wrapping_add(17);
    }
    let p = parse(&s, &|_| false);
    assert_eq!(p.stage_spans[3].end, s.len());
    // Deep nesting of unclosed elements.
    let deep = "<think>".repeat(100_000);
    let p = parse(&deep, &|_| false);
    assert_eq!(p.stage_spans[0], 0..deep.len());
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("<structured_plan>".to_string()),
        Just("</structured_plan>".to_string()),
        Just("<rubric>- a\n".to_string()),
        Just("</rubric>".to_string()),
        Just("<call_tool name=\"google_search\">".to_string()),
        Just("</call_tool>".to_string()),
        Just("</call>".to_string()),
        Just("<review>".to_string()),
        Just("</review>".to_string()),
        Just("<answer>".to_string()),
        Just("</answer>".to_string()),
        Just("<cite id=\"a,b\">".to_string()),
        Just("</cite>".to_string()),
        Just("<state_evaluation>".to_string()),
        Just("&amp;".to_string()),
        Just("&bogus;".to_string()),
        Just("<".to_string()),
        Just("\"".to_string()),
        Just("é日".to_string()),
        "[a-z <>/&\"'=]{0,12}",
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_and_partitions(frags in proptest::collection::vec(fragment(), 0..60)) {
        let text: String = frags.concat();
        let p = parse(&text, &|id| id == "a");
        let s = &p.stage_spans;
        prop_assert_eq!(s[0].start, 0);
        prop_assert_eq!(s[3].end, text.len());
        for k in 0..3 {
            prop_assert_eq!(s[k].end, s[k + 1].start);
        }
        for r in s.iter() {
            prop_assert!(r.start <= r.end);
            prop_assert!(text.is_char_boundary(r.start) && text.is_char_boundary(r.end));
        }
        // stage_at is monotone over the text.
        let mut last = Stage::Plan;
        for (i, _) in text.char_indices() {
            let st = p.stage_at(i);
            prop_assert!(st >= last);
            last = st;
        }
        let _ = check(&[Round { text: &text, tool_error: false }]);
        let _ = postprocess(&text);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let text = String::from_utf8_lossy(&bytes);
        let p = parse(&text, &|_| true);
        prop_assert_eq!(p.stage_spans[3].end, text.len());
    }
}
