//! The `drtulu` recipe judged by DR Tulu's rules (method.md B.1-B.7, drtulu.md 1.3, 2.1-2.4) on
//! scripted groups: a DR Tulu trajectory (think / call_tool / answer / cite, no plan) is not a
//! parse failure, in the parser and through the rollout engine; the signed rubric score with a
//! penalty rubric differs from RubricEM's inverted mean and is not clipped; per-rubric judging
//! makes one call per (trajectory, rubric) on the answer text only (lexical judge and a loopback
//! LLM judge); RLER buffers keep K_max = 5 active rubrics by std with persistent ones never
//! pruned and new ones at +1 / -1; the composite reward uses DR Tulu's weights; a zero-variance
//! group is flagged degenerate.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::float_cmp,
    reason = "test code fails loudly"
)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use futures::future::BoxFuture;
use orchestrator::domain::config::Recipe;
use orchestrator::domain::credit::{
    CompositeInputs, Lambda, composite_reward, format_reward, search_reward,
};
use orchestrator::domain::judge::group::{CallKind, GroupConfig, judge_group};
use orchestrator::domain::judge::lexical::LexicalJudge;
use orchestrator::domain::judge::score::AnswerScore;
use orchestrator::domain::judge::{
    Claim, ClaimVerdict, Finding, Generated, Granularity, Judge, JudgeError, JudgeKind, NewRubric,
    ReflectionGrade, Rubric, RubricScore, ScoreMode, Scoring, TraceView, Usage,
};
use orchestrator::domain::rubrics::{RLER_K_MAX, RubricBuffer, State as BufState};
use orchestrator::domain::scaffold::{Scaffold, parse, parse_as};
use orchestrator::domain::trajectory::{SegmentKind, Stage, Trajectory};
use orchestrator::infra::db;
use orchestrator::infra::llm::judge::{LlmJudge, LlmJudgeOptions};
use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy, Role};
use orchestrator::pipeline::judging::{
    StepOptions, judge_step, persistent_rubrics, persistent_rubrics_as,
};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

// ---- 1. The scaffold ------------------------------------------------------------------------

/// A DR Tulu trajectory in the shape of the real one in drtulu.md 1.3 (its evaluation data,
/// `sqa_eval/test.jsonl`), written for this test: a think, a `snippet_search` call with the
/// attributes DR Tulu's prompt advertises, the tool output with `CALLID-IDX` snippet ids, a
/// second think, and a cited answer. No `<structured_plan>`: DR Tulu's prompt never asks for one.
const CALL: &str = "<call_tool name=\"snippet_search\" limit=\"5\" year=\"2012-2025\" fieldsOfStudy=\"Computer Science,Engineering\">neural speech activity detection for speaker diarization</call_tool>";
const THINK1: &str = "<think>The question is how deep networks detect speech before diarization. Papers that compare neural detectors with WFST smoothing and energy thresholds would settle it.</think>\n";
const OUTPUT: &str = "<tool_output><snippet id=7552a5aa-0>\nTitle: Frame-level neural speech detection as a diarization front end\nSnippet: A feed-forward network labels each frame speech or non-speech; a small WFST smooths the labels.\n</snippet>\n<snippet id=7552a5aa-1>\nTitle: Neural versus energy-based voice activity detection on meetings\nSnippet: The neural detector cut the diarization error rate (<5% missed speech) against an energy threshold.\n</snippet></tool_output>";
const THINK2: &str = "<think>Both snippets answer it; the second gives the comparison.</think>\n";
const ANSWER: &str = "<answer>Deep networks act as the front end of diarization: <cite id=\"7552a5aa-0\">a frame classifier separates speech from non-speech and a small WFST smooths its decisions</cite>, and <cite id=\"7552a5aa-0,7552a5aa-1\">such detectors lower diarization errors compared with energy thresholds</cite>.</answer>";

fn dr_tulu_trace() -> String {
    format!("{THINK1}{CALL}{OUTPUT}{THINK2}{ANSWER}")
}

#[test]
fn a_dr_tulu_trajectory_is_well_formed_by_dr_tulus_rules() {
    let text = dr_tulu_trace();
    let ids: Vec<String> = orchestrator::domain::judge::view::parse_snippets(&text)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, ["7552a5aa-0", "7552a5aa-1"]);
    let known = |id: &str| ids.iter().any(|k| k == id);

    let p = parse_as(Scaffold::Drtulu, &text, &known);
    assert_eq!(p.scaffold, Scaffold::Drtulu);
    assert!(
        !p.failed(),
        "a real DR Tulu trajectory is well-formed: {p:?}"
    );
    assert!(p.issues.is_empty(), "{:?}", p.issues);
    assert!(p.plan.is_none() && p.review.is_none());
    assert_eq!(p.tool_calls.len(), 1);
    let call = &p.tool_calls[0];
    assert_eq!(call.name, "snippet_search");
    assert_eq!(
        call.query,
        "neural speech activity detection for speaker diarization"
    );
    assert_eq!(call.attrs["limit"], "5");
    assert_eq!(call.attrs["year"], "2012-2025");
    assert_eq!(call.attrs["fieldsOfStudy"], "Computer Science,Engineering");
    assert!(p.answer_closed);
    assert_eq!(p.citations.len(), 2);
    assert_eq!(p.citations[1].ids, ["7552a5aa-0", "7552a5aa-1"]);
    assert!(
        p.citations.iter().all(|c| c.known),
        "cited ids are the tool output's"
    );
    // No plan or review stage: everything before the answer is research.
    let answer_at = text.find("<answer>").unwrap();
    assert_eq!(
        p.stage_spans,
        [
            0..0,
            0..answer_at,
            answer_at..answer_at,
            answer_at..text.len()
        ]
    );
    assert_eq!(p.stages_present, [false, true, false, true]);
    assert_eq!(p.stage_at(0), Stage::Research);
    assert_eq!(p.stage_at(answer_at), Stage::Answer);
    assert_eq!(p.to_json()["scaffold"], "drtulu");

    // Judged by RubricEM's rules the same text lacks its plan: the flag the issue reported.
    assert!(parse(&text, &known).failed());

    // think and call_tool are optional; a closed answer is what DR Tulu extracts.
    assert!(!parse_as(Scaffold::Drtulu, "<answer>\\boxed{42}</answer>", &|_| true).failed());
    let no_answer = format!("{THINK1}{CALL}{OUTPUT}{THINK2}");
    assert!(parse_as(Scaffold::Drtulu, &no_answer, &known).failed());
    let cut = format!("{THINK1}<answer>Deep networks act as");
    assert!(parse_as(Scaffold::Drtulu, &cut, &known).failed());
    // An unclosed think is no error in DR Tulu's grammar.
    assert!(
        !parse_as(Scaffold::Drtulu, "<think>hmm <answer>ok</answer>", &|_| {
            true
        })
        .failed()
    );
}

#[tokio::test]
async fn the_rollout_engine_parses_by_the_configured_scaffold() {
    use common::fake_openai::{FakeServer, Scripted, ToyCodec};
    use orchestrator::domain::config::RolloutConfig;
    use orchestrator::infra::tools::runner::ToolRunner;
    use orchestrator::pipeline::rollout::{RolloutCtx, RolloutSlot, RolloutTask, summarize};

    let turn1 = format!("{THINK1}{CALL}");
    let turn2 = format!("{THINK2}{ANSWER}");
    let server = FakeServer::start().await;
    let ctx = |scaffold| RolloutCtx {
        client: server.client(Role::Policy, "policy"),
        codec: Arc::new(ToyCodec),
        tools: Arc::new(ToolRunner::new(None)),
        cfg: RolloutConfig {
            n: 1,
            tasks_per_step: 1,
            max_tool_calls: 10,
            max_tokens: 8000,
            forced_answer_tokens: Some(200),
            max_prompt_tokens: None,
            repetition_detection: None,
            answer_after_loop: false,
            temperature: 1.0,
            top_p: 1.0,
        },
        seed: None,
        scaffold,
    };
    let task = RolloutTask {
        task_id: Uuid::now_v7(),
        key: 1,
        system: "SYS".into(),
        user: "How do deep networks help diarization?".into(),
    };
    let slot = RolloutSlot {
        run_id: Uuid::now_v7(),
        step: 0,
        sample_index: 0,
        policy_version: 0,
    };
    let mut failures = BTreeMap::new();
    for scaffold in [Scaffold::Drtulu, Scaffold::Rubricem] {
        server.push_scripted(Scripted::reply(&turn1, "stop")).await;
        server.push_scripted(Scripted::reply(&turn2, "stop")).await;
        let r = ctx(scaffold).run(&task, slot).await.unwrap();
        assert_eq!(r.trajectory.finish_reason, "answer");
        assert_eq!(r.parsed.scaffold, scaffold);
        if scaffold == Scaffold::Drtulu {
            // The call is research, the answer is the answer stage; the stored parse says so.
            assert!(r.calls.iter().all(|c| c.stage == Stage::Research));
            let stages: Vec<Option<Stage>> = r
                .trajectory
                .segments
                .iter()
                .filter(|s| s.kind == SegmentKind::Model)
                .map(|s| s.stage)
                .collect();
            assert_eq!(
                stages,
                [
                    Some(Stage::Research),
                    Some(Stage::Research),
                    Some(Stage::Answer)
                ]
            );
            assert_eq!(r.trajectory.parsed["scaffold"], "drtulu");
        }
        let answer = r.parsed.answer.clone().expect("the rollout answered");
        let (_, summary) = summarize(vec![Ok(r)]);
        failures.insert(scaffold.as_str(), summary.parse_failures);
        // `rollout/answer_chars` (the report's answer length) counts the parsed answer.
        assert_eq!(summary.answers, 1);
        assert_eq!(summary.answer_chars, answer.chars().count());
        assert!(summary.answer_chars > 0);
    }
    assert_eq!(
        failures["drtulu"], 0,
        "DR Tulu's rules: not a parse failure"
    );
    assert_eq!(failures["rubricem"], 1, "RubricEM's rules ask for a plan");
}

// ---- helpers ----------------------------------------------------------------------------------

fn view(answer: Option<&str>) -> TraceView {
    let text = answer
        .map(|a| format!("<answer>{a}</answer>"))
        .unwrap_or_default();
    TraceView {
        stage_text: [
            String::new(),
            "<think>secret reasoning</think>".into(),
            String::new(),
            text,
        ],
        answer: answer.map(str::to_string),
        tool_calls: 1,
        ..TraceView::default()
    }
}

fn group(answers: &[Option<&str>]) -> Vec<(Uuid, TraceView)> {
    answers.iter().map(|a| (Uuid::now_v7(), view(*a))).collect()
}

fn drtulu_cfg(citation: bool) -> GroupConfig {
    StepOptions::for_recipe(Recipe::Drtulu, Lambda::default(), citation).group
}

fn score_calls(calls: &[orchestrator::domain::judge::group::CallRecord]) -> usize {
    calls.iter().filter(|c| c.kind == CallKind::Score).count()
}

// ---- 2. Signed rubric score -------------------------------------------------------------------

#[tokio::test]
async fn the_signed_score_keeps_dataset_weights_and_penalties_unclipped() {
    let cfg = drtulu_cfg(false);
    assert_eq!(cfg.answer_score, AnswerScore::SignedPoints);
    assert_eq!(cfg.granularity, Granularity::PerRubric);
    assert_eq!(cfg.mode, ScoreMode::AnswerOnly);
    let specs = json!([
        {"title": "core", "description": "names the alpha pathway", "weight": 2.0, "key_terms": ["alpha"]},
        {"title": "copying", "description": "copies sources verbatim", "weight": -5.0, "key_terms": ["verbatim"]},
        {"title": "extra", "description": "adds context", "weight": 0.5, "key_terms": ["context"]},
    ]);
    // DR Tulu keeps the dataset's weights; RubricEM maps them onto {1, 2, 3}.
    let signed = persistent_rubrics_as(AnswerScore::SignedPoints, &specs);
    let clamped = persistent_rubrics(&specs);
    let w =
        |rs: &[Rubric]| -> Vec<(f32, bool)> { rs.iter().map(|r| (r.weight, r.negative)).collect() };
    assert_eq!(w(&signed), [(2.0, false), (5.0, true), (0.5, false)]);
    assert_eq!(w(&clamped), [(2.0, false), (3.0, true), (1.0, false)]);

    let answers = [
        Some("the alpha pathway, in context"),
        Some("a verbatim copy of the abstract"),
        Some("the alpha pathway, copied verbatim"),
    ];
    let judge = LexicalJudge::new("lexical-v1");
    let g = group(&answers);
    let mut dr = cfg;
    dr.generate = false;
    let mut buf = RubricBuffer::with_persistent(signed, 0);
    let dr_out = judge_group(&judge, &mut buf, dr, "Q?", &g, 0).await;
    let rem = GroupConfig {
        granularity: Granularity::PerTrajectory,
        answer_score: AnswerScore::WeightedMean,
        ..dr
    };
    let mut buf = RubricBuffer::with_persistent(clamped, 0);
    let rem_out = judge_group(&judge, &mut buf, rem, "Q?", &g, 0).await;

    // S = Σ w·s/2 / max(Σ_{w>0} w, 1): positive weights sum to 2.5.
    let signed_scores: Vec<f64> = dr_out.trajectories.iter().map(|t| t.rubric_score).collect();
    let want = [(2.0 + 0.5) / 2.5, -5.0 / 2.5, (2.0 - 5.0) / 2.5];
    for (got, want) in signed_scores.iter().zip(want) {
        assert!((got - want).abs() < 1e-9, "{signed_scores:?}");
    }
    // RubricEM's inverted weighted mean of the same answers: (Σ w·c) / Σ|w| with c = 1 − s/2
    // for the penalty, on weights {2, 3, 1}.
    let mean_scores: Vec<f64> = rem_out
        .trajectories
        .iter()
        .map(|t| t.rubric_score)
        .collect();
    let want_mean = [6.0 / 6.0, 0.0, 2.0 / 6.0];
    for (got, want) in mean_scores.iter().zip(want_mean) {
        assert!((got - want).abs() < 1e-9, "{mean_scores:?}");
    }
    assert_ne!(signed_scores[2], mean_scores[2]);
    // Unclipped in the reward; the stage rows keep R in [0, 1].
    assert!(signed_scores[1] < 0.0);
    assert_eq!(dr_out.trajectories[1].stage_scores, [0.0; 4]);
}

// ---- 3. Judging granularity -------------------------------------------------------------------

#[tokio::test]
async fn per_rubric_judging_makes_one_call_per_trajectory_and_rubric_on_the_answer() {
    let specs = json!([
        {"description": "names the alpha pathway", "weight": 1.0, "key_terms": ["alpha"]},
        {"description": "gives the beta dose", "weight": 1.0, "key_terms": ["beta"]},
        {"description": "mentions the secret reasoning", "weight": -1.0, "key_terms": ["secret"]},
    ]);
    let rubrics = persistent_rubrics_as(AnswerScore::SignedPoints, &specs);
    let answers = [
        Some("alpha and beta"),
        Some("alpha only"),
        Some("nothing useful"),
        None,
    ];
    let g = group(&answers);
    let judge = LexicalJudge::new("lexical-v1");
    let mut cfg = drtulu_cfg(false);
    cfg.generate = false;
    let mut buf = RubricBuffer::with_persistent(rubrics.clone(), 0);
    let per_rubric = judge_group(&judge, &mut buf, cfg, "Q?", &g, 0).await;
    // 3 answered trajectories x 3 rubrics; the one without an answer scores 0 without a call.
    assert_eq!(score_calls(&per_rubric.calls), 3 * 3);
    assert!(per_rubric.calls.iter().all(|c| c.trajectory_id.is_some()));
    let no_answer = &per_rubric.trajectories[3];
    assert!(no_answer.scores.iter().all(|s| s.score == 0));
    assert_eq!(no_answer.rubric_score, 0.0);
    // The judge read the answer only: "secret" sits in the trajectory's think, never scored.
    for t in &per_rubric.trajectories {
        assert_eq!(t.scores.len(), 3);
        assert_eq!(t.scores[2].score, 0, "the think text is not judged");
    }
    // The same rubrics in one call per trajectory give the same raw scores.
    let per_traj_cfg = GroupConfig {
        granularity: Granularity::PerTrajectory,
        ..cfg
    };
    let mut buf = RubricBuffer::with_persistent(rubrics, 0);
    let per_traj = judge_group(&judge, &mut buf, per_traj_cfg, "Q?", &g, 0).await;
    assert_eq!(score_calls(&per_traj.calls), 4);
    for (a, b) in per_rubric.trajectories.iter().zip(&per_traj.trajectories) {
        let raw = |t: &orchestrator::domain::judge::group::TrajectoryJudgment| {
            t.scores.iter().map(|s| s.score).collect::<Vec<_>>()
        };
        assert_eq!(raw(a), raw(b));
    }
    assert_eq!(
        per_rubric.trajectories[0].rubric_score, 1.0,
        "both positives met, no penalty"
    );
    assert_eq!(per_rubric.trajectories[1].rubric_score, 0.5);
}

// ---- 4. Evolving rubrics, K_max = 5 -----------------------------------------------------------

/// A judge whose scores are a table: trajectory `i` (its answer reads `answer i`) gets
/// `table[rubric title][i]`; generation proposes the rubrics it was given. It records what every
/// scoring call was shown.
struct TableJudge {
    table: HashMap<String, Vec<u8>>,
    proposals: Vec<NewRubric>,
    seen: Mutex<Vec<String>>,
}

impl TableJudge {
    fn lookup(&self, text: &str, r: &Rubric) -> u8 {
        let i: usize = text.trim_start_matches("answer ").parse().unwrap();
        self.table[&r.title][i]
    }
}

fn unused<T: Send + 'static>() -> BoxFuture<'static, Result<T, JudgeError>> {
    Box::pin(async { Err(JudgeError::Input("not used by this test".into())) })
}

impl Judge for TableJudge {
    fn model(&self) -> &str {
        "table"
    }
    fn kind(&self) -> JudgeKind {
        JudgeKind::Lexical
    }
    fn generate<'a>(
        &'a self,
        _q: &'a str,
        _r: &'a [TraceView],
        _e: &'a [Rubric],
        stages: &'a [Stage],
    ) -> BoxFuture<'a, Result<Generated, JudgeError>> {
        assert_eq!(stages, [Stage::Answer], "RLER evolves Answer rubrics only");
        let mut g = Generated::default();
        g.per_stage[Stage::Answer.index()] = self.proposals.clone();
        Box::pin(async move { Ok(g) })
    }
    fn score<'a>(
        &'a self,
        _q: &'a str,
        trace: &'a TraceView,
        rubrics: &'a [Rubric],
        mode: ScoreMode,
    ) -> BoxFuture<'a, Result<Scoring, JudgeError>> {
        let text = trace.text_for(Stage::Answer, mode).to_string();
        let scores = rubrics
            .iter()
            .map(|r| RubricScore {
                rubric_id: r.id,
                score: self.lookup(&text, r),
                justification: String::new(),
            })
            .collect();
        Box::pin(async move {
            Ok(Scoring {
                scores,
                usage: Usage::default(),
            })
        })
    }
    fn score_rubric<'a>(
        &'a self,
        _q: &'a str,
        trace: &'a TraceView,
        rubric: &'a Rubric,
        mode: ScoreMode,
    ) -> BoxFuture<'a, Result<(RubricScore, Usage), JudgeError>> {
        let text = trace.text_for(rubric.stage, mode).to_string();
        self.seen.lock().unwrap().push(text.clone());
        let s = RubricScore {
            rubric_id: rubric.id,
            score: self.lookup(&text, rubric),
            justification: String::new(),
        };
        Box::pin(async move { Ok((s, Usage::default())) })
    }
    fn ground<'a>(
        &'a self,
        _q: &'a str,
        _s: &'a [(String, String)],
    ) -> BoxFuture<'a, Result<Generated, JudgeError>> {
        unused()
    }
    fn claims<'a>(
        &'a self,
        _q: &'a str,
        _c: &'a [Claim],
        _s: &'a HashMap<String, String>,
    ) -> BoxFuture<'a, Result<(Vec<ClaimVerdict>, Usage), JudgeError>> {
        unused()
    }
    fn reflect<'a>(
        &'a self,
        _q: &'a str,
        _t: &'a TraceView,
        _f: &'a [Finding],
        _c: &'a [String],
    ) -> BoxFuture<'a, Result<(Vec<ReflectionGrade>, Usage), JudgeError>> {
        unused()
    }
}

#[tokio::test]
async fn rler_buffers_keep_the_top_five_by_std_and_never_prune_persistent_rubrics() {
    // Raw scores of four rollouts; std over s/2 in brackets.
    let rows: &[(&str, [u8; 4], bool)] = &[
        ("p0", [2, 2, 2, 2], false), // persistent, std 0: stays persistent
        ("p1", [0, 2, 0, 0], true),  // persistent penalty
        ("r0", [2, 2, 2, 2], false), // std 0 -> inactive
        ("r1", [0, 0, 0, 0], false), // std 0 -> inactive
        ("r2", [2, 0, 2, 0], false), // var .25
        ("r3", [2, 0, 0, 0], false), // var .1875
        ("r4", [1, 0, 1, 0], false), // var .0625
        ("r5", [2, 1, 0, 1], true),  // var .125 (a negative rubric)
        ("r6", [2, 2, 0, 0], false), // var .25
        ("r7", [1, 1, 1, 0], false), // var .046875: the sixth, pruned by K_max
    ];
    let table: HashMap<String, Vec<u8>> = rows
        .iter()
        .map(|(t, s, _)| (t.to_string(), s.to_vec()))
        .collect();
    let proposals: Vec<NewRubric> = rows[2..]
        .iter()
        .map(|(t, _, neg)| NewRubric {
            title: t.to_string(),
            description: format!("criterion {t}"),
            weight: 3.0, // RLER ignores proposed weights: +1 or -1
            negative: *neg,
            key_terms: vec![],
        })
        .collect();
    let judge = TableJudge {
        table,
        proposals,
        seen: Mutex::new(Vec::new()),
    };
    let specs = json!([
        {"title": "p0", "description": "criterion p0", "weight": 2.0},
        {"title": "p1", "description": "criterion p1", "weight": -1.0},
    ]);
    let mut buf =
        RubricBuffer::with_persistent(persistent_rubrics_as(AnswerScore::SignedPoints, &specs), 0);
    let answers: Vec<String> = (0..4).map(|i| format!("answer {i}")).collect();
    let g: Vec<(Uuid, TraceView)> = answers
        .iter()
        .map(|a| (Uuid::now_v7(), view(Some(a.as_str()))))
        .collect();
    let out = judge_group(&judge, &mut buf, drtulu_cfg(false), "Q?", &g, 1).await;

    // New rubrics join the active set before scoring, weights +1 / -1.
    assert_eq!(out.new_rubrics.len(), 8);
    for r in &out.new_rubrics {
        assert_eq!((r.weight, r.stage), (1.0, Stage::Answer));
        assert_eq!(r.negative, r.title == "r5");
    }
    // Every rollout scored against 2 persistent + 8 new rubrics, one call each, answers only.
    assert_eq!(score_calls(&out.calls), 4 * 10);
    assert!(
        judge
            .seen
            .lock()
            .unwrap()
            .iter()
            .all(|t| answers.contains(t))
    );

    let state: BTreeMap<String, BufState> = buf
        .entries
        .iter()
        .map(|e| (e.rubric.title.clone(), e.state))
        .collect();
    let active: Vec<&str> = state
        .iter()
        .filter(|(_, s)| **s == BufState::Active)
        .map(|(t, _)| t.as_str())
        .collect();
    assert_eq!(active.len(), RLER_K_MAX);
    assert_eq!(active, ["r2", "r3", "r4", "r5", "r6"]);
    for t in ["r0", "r1", "r7"] {
        assert_eq!(state[t], BufState::Inactive, "{t}");
    }
    assert_eq!(state["p0"], BufState::Persistent, "zero std, never pruned");
    assert_eq!(state["p1"], BufState::Persistent);
    assert_eq!(out.pruned.len(), 3);

    // Rollout 1 meets p0 (+2) and shows p1's flaw (-1); of the new rubrics r0 (+1), r5 half
    // (-0.5), r6 (+1), r7 half (+0.5): (2 - 1 + 1 - 0.5 + 1 + 0.5) / (2 + 7).
    assert!((out.trajectories[1].rubric_score - 3.0 / 9.0).abs() < 1e-12);
}

// ---- 5 and 6. Composite reward and degenerate groups, end to end on Postgres -------------------

/// A loopback LLM judge: `rubric_score` gives 2 when the response contains the criterion's last
/// word, else 0; `stage_rubrics` proposes one positive and one negative Answer rubric. Every
/// `rubric_score` response block is recorded.
#[derive(Default)]
struct FakeState {
    by_schema: Mutex<BTreeMap<String, usize>>,
    responses: Mutex<Vec<String>>,
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> &'a str {
    let a = text.find(open).unwrap() + open.len();
    let b = text[a..].find(close).unwrap() + a;
    &text[a..b]
}

async fn chat(State(s): State<Arc<FakeState>>, Json(body): Json<Value>) -> Json<Value> {
    let schema = body["response_format"]["json_schema"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let prompt = body["messages"][1]["content"].as_str().unwrap_or("");
    *s.by_schema
        .lock()
        .unwrap()
        .entry(schema.clone())
        .or_default() += 1;
    let content = match schema.as_str() {
        "rubric_score" if prompt.contains("flaky") => {
            // A judge that never answers this criterion in the schema.
            json!("the judge rambles instead of answering")
        }
        "rubric_score" => {
            let response = between(prompt, "<response>\n", "\n</response>").to_string();
            let criterion = between(prompt, "<criterion>\n", "\n</criterion>");
            let word = criterion.split_whitespace().last().unwrap().to_lowercase();
            let score = if response.to_lowercase().contains(&word) {
                2
            } else {
                0
            };
            s.responses.lock().unwrap().push(response);
            json!({"score": score})
        }
        // DeepRubric's 0-4 scale: 3 ("met with small gaps") when the word is there.
        "rubric_score_4" => {
            let response = between(prompt, "<response>\n", "\n</response>").to_string();
            let criterion = between(prompt, "<criterion>\n", "\n</criterion>");
            let word = criterion.split_whitespace().last().unwrap().to_lowercase();
            let score = if response.to_lowercase().contains(&word) {
                3
            } else {
                0
            };
            json!({"score": score})
        }
        "stage_rubrics" => {
            let empty = json!({"positive_rubrics": [], "negative_rubrics": []});
            json!({
                "stage_1": empty, "stage_2": empty, "stage_3": empty,
                "stage_4": {
                    "positive_rubrics": [{"title": "g", "description": "mentions gamma", "weight": 2}],
                    "negative_rubrics": [{"title": "d", "description": "mentions delta", "weight": 3}],
                },
            })
        }
        _ => json!({}),
    };
    Json(json!({
        "id": "fake", "object": "chat.completion", "model": "fake-judge",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content.to_string()}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }))
}

async fn fake_judge() -> (SocketAddr, Arc<FakeState>) {
    let state = Arc::new(FakeState::default());
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, state)
}

fn llm_judge(addr: SocketAddr) -> LlmJudge {
    let pool = EndpointPool::new(
        Role::Judge,
        "fake-judge",
        &[format!("http://{addr}")],
        64,
        Duration::from_secs(10),
        1000,
    );
    let client = LlmClient::new(
        orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap(),
        Arc::new(pool),
        RetryPolicy::none(),
    );
    LlmJudge::new(client, LlmJudgeOptions::default()).unwrap()
}

/// A stored DR Tulu trajectory: model turns (research, then the answer) around one tool output,
/// with the parse the engine stores (`parse_as(Drtulu)`).
fn trajectory(run: Uuid, task: Uuid, i: i32, answer: &str) -> Trajectory {
    use common::fixtures::{segment, stored_trajectory};
    let research = format!("<think>step {i}</think>{CALL}");
    let parse_text = format!("{research}{THINK2}{answer}");
    let parsed = parse_as(Scaffold::Drtulu, &parse_text, &|_| true);
    let mut segments = vec![
        segment(SegmentKind::Model, Some(Stage::Research), &research),
        segment(SegmentKind::ToolOutput, None, OUTPUT),
        segment(SegmentKind::Model, Some(Stage::Research), THINK2),
    ];
    if !answer.is_empty() {
        segments.push(segment(SegmentKind::Model, Some(Stage::Answer), answer));
    }
    stored_trajectory(run, task, i, segments, parsed.to_json())
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_drtulu_step_scores_signed_composites_and_flags_a_zero_variance_group(pool: PgPool) {
    let (addr, fake) = fake_judge().await;
    let judge = llm_judge(addr);
    let new = vec![
        db::tasks::NewTask {
            source: "fixture".into(),
            external_id: "varied".into(),
            prompt: "Which pathway does the drug act on?".into(),
            answer_format: "long".into(),
            persistent_rubrics: json!([
                {"title": "core", "description": "names the pathway alpha", "weight": 2.0},
                {"title": "copying", "description": "copies the source verbatim", "weight": -5.0},
            ]),
            metadata: json!({}),
        },
        db::tasks::NewTask {
            source: "fixture".into(),
            external_id: "alike".into(),
            prompt: "Which pathway, briefly?".into(),
            answer_format: "long".into(),
            persistent_rubrics: json!([{"description": "names the pathway alpha", "weight": 1.0}]),
            metadata: json!({}),
        },
    ];
    let tasks = db::tasks::upsert(&pool, &new).await.unwrap();
    let exp = db::runs::create_experiment(&pool, "exp", "drtulu", &json!({}))
        .await
        .unwrap();
    let run = db::runs::create_run(&pool, exp, "drtulu", "drtulu", &json!({}), 1)
        .await
        .unwrap();
    db::runs::begin_step(&pool, run, 0, 0, &tasks)
        .await
        .unwrap();
    let cited = "<answer>It acts on <cite id=\"7552a5aa-0\">the alpha pathway</cite>.</answer>";
    let copied = "<answer>A verbatim copy of the abstract.</answer>";
    let unclosed = "<answer>It acts on <cite id=\"7552a5aa-0\">the alpha pathway";
    let trajs = vec![
        trajectory(run, tasks[0], 0, cited),
        trajectory(run, tasks[0], 1, copied),
        trajectory(run, tasks[0], 2, ""),
        trajectory(run, tasks[0], 3, unclosed),
        trajectory(run, tasks[1], 0, cited),
        trajectory(run, tasks[1], 1, cited),
    ];
    db::trajectories::insert_batch(&pool, &trajs).await.unwrap();

    let opts = StepOptions::for_recipe(Recipe::Drtulu, Lambda::default(), false);
    let r = judge_step(&pool, &judge, &opts, run, 0).await.unwrap();

    // Granularity: one generation per task, then one call per (answered trajectory, rubric):
    // task 1 has 2 closed answers x (2 persistent + 2 new), task 2 has 2 x (1 + 2).
    let calls = fake.by_schema.lock().unwrap().clone();
    assert_eq!(calls.get("stage_rubrics"), Some(&2));
    assert_eq!(calls.get("rubric_score"), Some(&(2 * 4 + 2 * 3)));
    assert_eq!(calls.get("rubric_scores"), None, "no per-trajectory calls");
    assert_eq!(r.failed_calls, 0);
    // The judge saw the answer text only: never the think, the call or the tool output.
    let answers = [
        "It acts on <cite id=\"7552a5aa-0\">the alpha pathway</cite>.",
        "A verbatim copy of the abstract.",
    ];
    for shown in fake.responses.lock().unwrap().iter() {
        assert!(answers.contains(&shown.as_str()), "judged text: {shown:?}");
    }

    // Persistent weights are the dataset's (5, not RubricEM's 3); new rubrics are +1 / -1.
    let weights: Vec<(String, f32, bool)> = sqlx::query_as(
        "SELECT description, weight, negative FROM rubrics WHERE run_id = $1 OR run_id IS NULL
         ORDER BY description",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    let w: BTreeMap<&str, (f32, bool)> = weights
        .iter()
        .map(|(d, w, n)| (d.as_str(), (*w, *n)))
        .collect();
    assert_eq!(w["copies the source verbatim"], (5.0, true));
    assert_eq!(w["mentions gamma"], (1.0, false));
    assert_eq!(w["mentions delta"], (1.0, true));
    // No rollout mentions gamma or delta: zero std, so both went inactive; persistent stayed.
    let states: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM rubric_buffers WHERE run_id = $1 GROUP BY state ORDER BY state",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        [("inactive".to_string(), 4), ("persistent".to_string(), 3)]
    );

    // Rewards: the signed rubric score (positive weights 2 + 1 for the new positive) and the
    // composite 0.6 rubric + 0.2 format + 0.2 search (citation off), search = min(1/3, 1).
    type Row = (Uuid, f32, f32, Option<f32>, Option<f32>, Option<f32>, f32);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT r.trajectory_id, r.reward, r.rubric, r.citation, r.format, r.search, r.advantage
         FROM trajectory_rewards r JOIN trajectories t ON t.id = r.trajectory_id
         WHERE t.run_id = $1 AND r.recipe = 'drtulu'",
    )
    .bind(run)
    .fetch_all(&pool)
    .await
    .unwrap();
    let by_id: HashMap<Uuid, &Row> = rows.iter().map(|r| (r.0, r)).collect();
    let search = search_reward(1);
    let expect = [
        // (rubric, has_answer, has_cite)
        (2.0 / 3.0, true, true),   // cited alpha answer
        (-5.0 / 3.0, true, false), // the penalty, unclipped
        (0.0, false, false),       // no answer: format and search only
        (0.0, false, true),        // an answer never closed is no answer; its cite still counts
    ];
    for (t, (rubric, has_answer, has_cite)) in trajs.iter().zip(expect) {
        let row = by_id[&t.id];
        let inputs = CompositeInputs {
            rubric,
            citation: 0.0,
            has_answer,
            has_cite,
            has_tool_query: true,
            search_queries: 1,
        };
        let format =
            0.5 * f64::from(u8::from(has_answer)) + 0.3 * f64::from(u8::from(has_cite)) + 0.2;
        assert!((format_reward(&inputs) - format).abs() < 1e-12);
        let reward = if has_answer {
            0.6 * rubric + 0.2 * format + 0.2 * search
        } else {
            0.2 * format + 0.2 * search
        };
        assert!((composite_reward(&inputs, false) - reward).abs() < 1e-12);
        assert!(
            (f64::from(row.1) - reward).abs() < 1e-5,
            "{row:?} want {reward}"
        );
        assert!((f64::from(row.2) - rubric).abs() < 1e-5, "{row:?}");
        assert_eq!(row.3, None, "citation off");
        assert!((f64::from(row.4.unwrap()) - format).abs() < 1e-6);
        assert!((f64::from(row.5.unwrap()) - search).abs() < 1e-6);
    }
    // With the citation reward on, the weights are 0.5 / 0.2 / 0.2 / 0.1.
    let on = CompositeInputs {
        rubric: 0.8,
        citation: 0.5,
        has_answer: true,
        has_cite: true,
        has_tool_query: true,
        search_queries: 5,
    };
    assert!((composite_reward(&on, true) - (0.5 * 0.8 + 0.2 * 0.5 + 0.2 + 0.1)).abs() < 1e-12);
    // The stage rows keep R in [0, 1]: the penalised answer's R is 0 at every stage.
    let r_pen: Vec<f32> =
        sqlx::query_scalar("SELECT score FROM stage_scores WHERE trajectory_id = $1")
            .bind(trajs[1].id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(r_pen, [0.0; 4]);

    // The second task's two rollouts earned the same reward: zero std, flagged degenerate and
    // carrying zero advantage; the first task's group is not degenerate.
    assert_eq!(r.degenerate_groups, 1);
    for t in &trajs[4..] {
        assert_eq!(by_id[&t.id].6, 0.0);
    }
    assert!(trajs[..4].iter().any(|t| by_id[&t.id].6 != 0.0));
}

// ---- DeepRubric recipe -----------------------------------------------------------------------

/// The DeepRubric recipe judges the task's fixed rubrics only (no generation calls), per rubric
/// on the answer, and scores `Σ w·s / Σ |w|` with the dataset's signed weights; the composite
/// weights are the paper's 0.5 / 0.2 / 0.2 / 0.1.
#[tokio::test]
async fn the_deeprubric_recipe_scores_fixed_rubrics_by_absolute_weights() {
    let opts = StepOptions::for_recipe(Recipe::Deeprubric, Lambda::default(), true);
    let cfg = opts.group;
    assert_eq!(cfg.answer_score, AnswerScore::AbsWeighted);
    assert_eq!(cfg.granularity, Granularity::PerRubric);
    assert_eq!(cfg.mode, ScoreMode::AnswerOnly);
    assert!(!cfg.generate, "DeepRubric's rubrics are fixed per task");
    let specs = json!([
        {"title": "R1 (factual)", "description": "names the alpha pathway", "weight": 2.0, "key_terms": ["alpha"]},
        {"title": "R2 (logical)", "description": "copies sources verbatim", "weight": -5.0, "key_terms": ["verbatim"]},
        {"title": "R3 (logical)", "description": "adds context", "weight": 0.5, "key_terms": ["context"]},
    ]);
    let rubrics = persistent_rubrics_as(AnswerScore::AbsWeighted, &specs);
    let answers = [
        Some("the alpha pathway, in context"),
        Some("a verbatim copy of the abstract"),
        Some("the alpha pathway, copied verbatim"),
    ];
    let judge = LexicalJudge::new("lexical-v1");
    let mut buf = RubricBuffer::with_persistent(rubrics, 0);
    let out = judge_group(&judge, &mut buf, cfg, "Q?", &group(&answers), 0).await;
    assert!(
        out.calls.iter().all(|c| c.kind != CallKind::Generate),
        "no generation"
    );
    // Σ|w| = 7.5.
    let want = [(2.0 + 0.5) / 7.5, -5.0 / 7.5, (2.0 - 5.0) / 7.5];
    for (t, want) in out.trajectories.iter().zip(want) {
        assert!(
            (t.rubric_score - want).abs() < 1e-9,
            "{} vs {want}",
            t.rubric_score
        );
    }
    assert!(matches!(
        opts.credit,
        orchestrator::pipeline::judging::Credit::Composite { citation: true }
    ));
}

/// With the LLM judge, the DeepRubric recipe asks each criterion on DeepRubric's 0-4 scale (its
/// own prompt and schema) and normalises by 4.
#[tokio::test]
async fn the_deeprubric_recipe_asks_the_llm_judge_for_zero_to_four() {
    let (addr, state) = fake_judge().await;
    let judge = llm_judge(addr);
    let cfg = StepOptions::for_recipe(Recipe::Deeprubric, Lambda::default(), false).group;
    assert_eq!(cfg.point_scale, 4);
    let specs = json!([
        {"title": "R1 (factual)", "description": "names the alpha pathway", "weight": 2.0},
        {"title": "R2 (logical)", "description": "copies sources verbatim", "weight": -5.0},
        {"title": "R3 (logical)", "description": "adds context", "weight": 0.5},
    ]);
    let rubrics = persistent_rubrics_as(AnswerScore::AbsWeighted, &specs);
    let answers = [
        Some("the alpha pathway, in context"),
        Some("a verbatim copy of the abstract"),
        Some("the alpha pathway, copied verbatim"),
    ];
    let mut buf = RubricBuffer::with_persistent(rubrics, 0);
    let out = judge_group(&judge, &mut buf, cfg, "Q?", &group(&answers), 0).await;
    assert_eq!(
        state.by_schema.lock().unwrap().get("rubric_score_4"),
        Some(&9),
        "one 0-4 call per (trajectory, rubric)"
    );
    // Grades of 3 of 4 on the criteria whose word is present; Σ|w| = 7.5.
    let want = [
        (2.0 + 0.5) * 0.75 / 7.5,
        -5.0 * 0.75 / 7.5,
        (2.0 - 5.0) * 0.75 / 7.5,
    ];
    for (t, want) in out.trajectories.iter().zip(want) {
        assert_eq!(t.point_scale, 4);
        assert!(
            (t.rubric_score - want).abs() < 1e-9,
            "{} vs {want}",
            t.rubric_score
        );
    }
}

/// A per-rubric judge call that fails after its retries leaves the trajectory unscored (source
/// `failed`, out of the group's advantages, the error in the call records), never a 0 for that
/// rubric (which would train on the judge's outage).
#[tokio::test]
async fn a_failed_rubric_call_leaves_the_trajectory_unscored_not_zero() {
    use orchestrator::domain::judge::score::ScoreSource;
    let (addr, _state) = fake_judge().await;
    let judge = llm_judge(addr);
    let cfg = StepOptions::for_recipe(Recipe::Drtulu, Lambda::default(), false).group;
    let specs = json!([
        {"title": "core", "description": "names the alpha pathway", "weight": 2.0},
        {"title": "odd", "description": "is judged by a flaky judge", "weight": 1.0},
    ]);
    let rubrics = persistent_rubrics_as(AnswerScore::SignedPoints, &specs);
    let mut buf = RubricBuffer::with_persistent(rubrics, 0);
    let mut dr = cfg;
    dr.generate = false;
    let out = judge_group(
        &judge,
        &mut buf,
        dr,
        "Q?",
        &group(&[Some("the alpha pathway"), Some("nothing")]),
        0,
    )
    .await;
    for t in &out.trajectories {
        assert_eq!(t.source, ScoreSource::Failed);
        assert!(
            t.scores.is_empty(),
            "no score stands in for the failed call"
        );
        assert_eq!(t.rubric_score, 0.0);
    }
    let failed = out.calls.iter().filter(|c| c.error.is_some()).count();
    assert_eq!(failed, 2, "one failed call per trajectory, recorded");
}
