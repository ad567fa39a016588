//! Rollouts end to end against the loopback fake (scripted multi-turn outputs with tool calls)
//! and real Postgres: token ids exact, stage spans and masks exact, tool cache hit on rerun, and
//! the documented finish reasons for models that never close a tag, stop early, or overuse tools;
//! a replayed demonstration (off-policy guidance) is the trajectory of the same turns.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_openai::{FakeServer, Scripted, ToyCodec, toy_tokenize};
use orchestrator::domain::config::RolloutConfig;
use orchestrator::domain::trajectory::{SegmentKind, Stage};
use orchestrator::infra::db;
use orchestrator::infra::llm::Role;
use orchestrator::infra::tools::local_search::LocalIndex;
use orchestrator::infra::tools::runner::{ToolCache, ToolLimits, ToolRunner};
use orchestrator::infra::tools::search_apis::LocalSearch;
use orchestrator::pipeline::rollout::{RolloutCtx, RolloutSlot, RolloutTask};
use uuid::Uuid;

const T1: &str = "<think>Plan it.</think><structured_plan><deep_analysis>two hops</deep_analysis><rubric>Knowledge checklist:\n- protein\n- compound</rubric><research_plan>gene then protein</research_plan></structured_plan><call_tool name=\"google_search\">GENE</call_tool>";
const T2: &str = "<think>Found the protein.</think><state_evaluation>need compound</state_evaluation><call_tool name=\"snippet_search\" year=\"2000-2020\">PROTEIN binds</call_tool>";
const T3: &str = "<think>Done.</think><state_evaluation>all covered</state_evaluation><review><rubric_review>ok</rubric_review><writing_plan>one line</writing_plan></review><answer>It binds <cite id=\"CITE\">COMPOUND</cite>. \\boxed{COMPOUND}</answer>";

struct Setup {
    server: FakeServer,
    ctx: RolloutCtx,
    world: orchestrator::domain::data::world::World,
}

async fn setup(cache: Option<Arc<dyn ToolCache>>, max_tool_calls: u32, max_tokens: u32) -> Setup {
    let server = FakeServer::start().await;
    let client = server.client(Role::Policy, "policy");
    let world = orchestrator::domain::data::world::generate(11, 80, 3);
    let idx = Arc::new(LocalIndex::build(&world.docs, None).unwrap());
    let mut tools = ToolRunner::new(cache);
    for name in ["google_search", "snippet_search"] {
        tools.register(
            name,
            Arc::new(LocalSearch {
                index: idx.clone(),
                description: "search.".into(),
                default_k: 2,
            }),
            ToolLimits::default(),
        );
    }
    let ctx = RolloutCtx {
        client,
        codec: Arc::new(ToyCodec),
        tools: Arc::new(tools),
        cfg: RolloutConfig {
            n: 1,
            tasks_per_step: 1,
            max_tool_calls,
            max_tokens,
            forced_answer_tokens: Some(200),
            max_prompt_tokens: None,
            repetition_detection: None,
            answer_after_loop: false,
            temperature: 1.0,
            top_p: 1.0,
        },
        seed: None,
        scaffold: orchestrator::domain::scaffold::Scaffold::Rubricem,
    };
    Setup { server, ctx, world }
}

fn texts(w: &orchestrator::domain::data::world::World) -> (String, String, String, String) {
    // Queries that hit real documents of the generated world.
    let t = &w.tasks[0];
    let gene_doc = w
        .docs
        .iter()
        .find(|d| d.id == t.rubrics[0].evidence[0])
        .unwrap();
    let gene = gene_doc.title.replace("The ", "").replace(" gene", "");
    let protein = t.rubrics[0].key_terms[0].clone();
    (gene, protein, t.answer.clone(), gene_doc.id.clone())
}

impl Setup {
    /// Script the three turns that research the world's first task (search the gene, then
    /// the protein, answer citing the gene's document) and return them.
    async fn script_research(&self) -> [String; 3] {
        let (gene, protein, compound, gene_doc) = texts(&self.world);
        let turns = [
            T1.replace("GENE", &format!("the {gene} gene")),
            T2.replace("PROTEIN", &protein),
            T3.replace("COMPOUND", &compound).replace("CITE", &gene_doc),
        ];
        for t in &turns {
            self.server.push_scripted(Scripted::reply(t, "stop")).await;
        }
        turns
    }

    /// One trajectory of a new task in a new run, through the scripted server.
    async fn roll(&self) -> orchestrator::domain::rollout::Rollout {
        self.ctx
            .run(&task(Uuid::now_v7()), slot(Uuid::now_v7()))
            .await
            .unwrap()
    }
}

fn task(task_id: Uuid) -> RolloutTask {
    RolloutTask {
        task_id,
        key: orchestrator::domain::util::task_key("world", "w17-h00000"),
        system: "SYS".into(),
        user: "Which compound?".into(),
    }
}

fn slot(run_id: Uuid) -> RolloutSlot {
    RolloutSlot {
        run_id,
        step: 0,
        sample_index: 0,
        policy_version: 7,
    }
}

#[tokio::test]
async fn three_turn_rollout_has_exact_tokens_stages_and_masks() {
    let s = setup(None, 10, 4000).await;
    let (_, _, compound, gene_doc) = texts(&s.world);
    let [t1, t2, t3] = s.script_research().await;
    let r = s.roll().await;
    let traj = &r.trajectory;
    assert_eq!(traj.finish_reason, "answer");
    assert!(r.error.is_none());
    assert_eq!(
        traj.prompt_token_ids,
        toy_tokenize("<|system|>SYS<|user|>Which compound?<|assistant|>")
    );

    // Model tokens are exactly the server's, in order; tool outputs sit between turns.
    let model: Vec<u32> = traj
        .segments
        .iter()
        .filter(|x| x.kind == SegmentKind::Model)
        .flat_map(|x| x.token_ids.clone())
        .collect();
    let expected: Vec<u32> = [t1.as_str(), t2.as_str(), t3.as_str()]
        .iter()
        .flat_map(|t| toy_tokenize(t))
        .collect();
    assert_eq!(model, expected);
    let kinds: Vec<SegmentKind> = traj.segments.iter().map(|x| x.kind).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == SegmentKind::ToolOutput)
            .count(),
        2
    );
    for seg in &traj.segments {
        match seg.kind {
            SegmentKind::Model => {
                assert_eq!(seg.logprobs.as_ref().unwrap().len(), seg.token_ids.len());
                assert!(seg.stage.is_some());
            }
            _ => assert!(seg.stage.is_none() && seg.logprobs.is_none()),
        }
    }
    // Each model token's stage follows the text boundaries of A.2.4.
    let full = format!("{t1}{t2}{t3}");
    let plan_end = full.find("</structured_plan>").unwrap() + "</structured_plan>".len();
    let review = full.rfind("<think>Done.").unwrap();
    let answer = full.find("<answer>").unwrap();
    let mut pos = 0usize;
    for seg in traj
        .segments
        .iter()
        .filter(|x| x.kind == SegmentKind::Model)
    {
        for _ in &seg.token_ids {
            let want = if pos < plan_end {
                Stage::Plan
            } else if pos < review {
                Stage::Research
            } else if pos < answer {
                Stage::Review
            } else {
                Stage::Answer
            };
            assert_eq!(seg.stage, Some(want), "byte {pos}");
            pos += 1; // one byte per token in the toy codec
        }
    }
    assert_eq!(r.calls.len(), 2);
    assert!(
        r.calls.iter().all(|c| c.stage == Stage::Research),
        "the first call_tool belongs to Research"
    );
    assert_eq!(
        r.calls[1].result.args.attrs.get("year").map(String::as_str),
        Some("2000-2020")
    );
    assert!(
        r.calls[0].result.snippets.iter().any(|x| x.id == gene_doc),
        "search found the gene doc"
    );
    assert_eq!(r.parsed.citations.len(), 1);
    assert!(
        r.parsed.citations[0].known,
        "cited id came from a tool output"
    );
    assert_eq!(r.parsed.boxed.as_deref(), Some(compound.as_str()));
    // The tool output the model saw is exactly what the next request's prompt contained.
    let tool_seg = traj
        .segments
        .iter()
        .find(|x| x.kind == SegmentKind::ToolOutput)
        .unwrap();
    assert!(tool_seg.text.contains("<tool_output><snippet id="));
    assert_eq!(tool_seg.token_ids, toy_tokenize(&tool_seg.text));
}

/// A demonstration replayed (off-policy guidance) is the trajectory the policy would have made
/// had it written the same turns: same tokens, stages, tool calls and parse, without a request
/// to the policy server; its model tokens carry behaviour log-prob 0 ("not recorded") and its
/// server is `teacher`. A recorded tool output that differs from the tool's is counted, and a
/// demonstration that ends without an answer finishes as `length`.
#[tokio::test]
async fn a_replayed_demonstration_is_the_trajectory_of_the_same_turns() {
    use orchestrator::domain::data::demos::{Demo, DemoTurn};
    let s = setup(None, 10, 4000).await;
    let [t1, t2, t3] = s.script_research().await;
    let task = task(Uuid::now_v7());
    let sampled = s.ctx.run(&task, slot(Uuid::now_v7())).await.unwrap();
    let outputs: Vec<String> = sampled
        .trajectory
        .segments
        .iter()
        .filter(|x| x.kind == SegmentKind::ToolOutput)
        .map(|x| x.text.clone())
        .collect();
    assert_eq!(outputs.len(), 2);
    let demo = Demo {
        turns: vec![
            DemoTurn {
                model: t1.clone(),
                tool_output: Some(outputs[0].clone()),
            },
            DemoTurn {
                model: t2.clone(),
                tool_output: Some(outputs[1].clone()),
            },
            DemoTurn {
                model: t3.clone(),
                tool_output: None,
            },
        ],
    };
    let before = s.server.requests();
    let mut guide = slot(Uuid::now_v7());
    guide.sample_index = 4;
    let r = s.ctx.replay(&task, guide, &demo).await.unwrap();
    assert_eq!(
        s.server.requests(),
        before,
        "no request to the policy server"
    );
    let (a, b) = (&sampled.trajectory, &r.trajectory);
    assert_eq!(b.server, "teacher");
    assert_eq!((b.sample_index, b.task_id), (4, task.task_id));
    assert_eq!(b.finish_reason, "answer");
    assert_eq!(b.prompt_token_ids, a.prompt_token_ids);
    assert_eq!(a.segments.len(), b.segments.len());
    for (x, y) in a.segments.iter().zip(&b.segments) {
        assert_eq!(
            (x.kind, x.stage, &x.token_ids, &x.text),
            (y.kind, y.stage, &y.token_ids, &y.text)
        );
        if y.kind == SegmentKind::Model {
            assert!(y.logprobs.as_ref().unwrap().iter().all(|&l| l == 0.0));
        }
    }
    b.validate().unwrap();
    let stages = |r: &orchestrator::domain::rollout::Rollout| -> Vec<(Stage, Vec<String>)> {
        r.calls
            .iter()
            .map(|c| {
                (
                    c.stage,
                    c.result.snippets.iter().map(|x| x.id.clone()).collect(),
                )
            })
            .collect()
    };
    assert_eq!(stages(&r), stages(&sampled));
    assert_eq!(r.parsed.boxed, sampled.parsed.boxed);
    assert!(r.parsed.citations.iter().all(|c| c.known));
    assert_eq!(b.parsed["guidance"]["tool_output_mismatch"], 0);

    // A recorded output that is not the tool's is counted (the tool's stands).
    let mut other = demo.clone();
    other.turns[1].tool_output = Some("\n<tool_output>stale</tool_output>\n".into());
    let r2 = s.ctx.replay(&task, guide, &other).await.unwrap();
    assert_eq!(r2.trajectory.parsed["guidance"]["tool_output_mismatch"], 1);
    assert_eq!(r2.trajectory.segments, r.trajectory.segments);

    // Without its answer turn the demonstration ends as a budget cut would.
    let mut cut = demo.clone();
    cut.turns.truncate(2);
    cut.turns[1].tool_output = None;
    let r3 = s.ctx.replay(&task, guide, &cut).await.unwrap();
    assert_eq!(r3.trajectory.finish_reason, "length");
}

#[tokio::test]
async fn never_closing_a_tag_ends_with_length() {
    let s = setup(None, 10, 400).await;
    // 300 tokens of an unclosed think, cut by the budget; then the forced answer is cut too.
    let long = format!("<think>{}", "x".repeat(293));
    s.server
        .push_scripted(Scripted::reply(&long, "length"))
        .await;
    s.server
        .push_scripted(Scripted::reply(&"y".repeat(150), "length"))
        .await;
    let r = s.roll().await;
    assert_eq!(r.trajectory.finish_reason, "length");
    let injected = r
        .trajectory
        .segments
        .iter()
        .filter(|x| x.kind == SegmentKind::Injected)
        .count();
    assert_eq!(injected, 1, "one forced-answer prefix");
    let all: usize = r
        .trajectory
        .segments
        .iter()
        .map(|x| x.token_ids.len())
        .sum();
    assert!(all <= 400, "budget respected: {all}");
    assert_eq!(
        r.trajectory.segments[0].stage,
        Some(Stage::Plan),
        "unrecognised text stays in Plan"
    );
}

/// `rollout.repetition_detection` goes to the server as vLLM's request field on every turn,
/// and a turn the server ends with `repetition` ends the trajectory there (finish reason
/// `repetition`, no forced answer), whatever budget is left. Unset, the field is not sent.
#[tokio::test]
async fn a_loop_the_server_stops_ends_the_trajectory_without_a_forced_answer() {
    let mut s = setup(None, 10, 2000).await;
    s.ctx.cfg.repetition_detection = Some(orchestrator::domain::config::RepetitionDetection {
        max_pattern_size: 32,
        min_pattern_size: 1,
        min_count: 16,
    });
    s.server.record_bodies();
    s.server.push_scripted(Scripted::reply(T1, "stop")).await;
    let looping = format!("<think>{}", "ab ".repeat(40));
    s.server
        .push_scripted(Scripted::reply(&looping, "repetition"))
        .await;
    let r = s.roll().await;
    assert_eq!(r.trajectory.finish_reason, "repetition");
    assert!(
        r.trajectory
            .segments
            .iter()
            .all(|x| x.kind != SegmentKind::Injected),
        "no forced-answer prefix after a loop stop"
    );
    assert_eq!(r.calls.len(), 1, "the first turn's search ran");
    assert!(!r.parsed.answer_closed);
    let bodies = s.server.state.last_bodies.lock().await.clone();
    assert_eq!(bodies.len(), 2, "two turns, nothing after the stop");
    for b in &bodies {
        assert_eq!(
            b["repetition_detection"],
            serde_json::json!({"max_pattern_size": 32, "min_pattern_size": 1, "min_count": 16})
        );
    }

    let plain = setup(None, 10, 2000).await;
    plain.server.record_bodies();
    plain
        .server
        .push_scripted(Scripted::reply(T3, "stop"))
        .await;
    let r = plain.roll().await;
    assert_eq!(r.trajectory.finish_reason, "answer");
    let body = plain.server.state.last_bodies.lock().await[0].clone();
    assert!(body.get("repetition_detection").is_none(), "{body}");
}

/// `rollout.answer_after_loop`: a loop the server stops before the answer opened is cut back to
/// where its copies begin (neither kept nor trained) and the answer is forced, as when the
/// budget runs out; a loop inside the answer still ends the trajectory.
#[tokio::test]
async fn with_answer_after_loop_a_loop_before_the_answer_is_cut_and_the_answer_forced() {
    let rule = orchestrator::domain::config::RepetitionDetection {
        max_pattern_size: 8,
        min_pattern_size: 1,
        min_count: 4,
    };
    let mut s = setup(None, 10, 2000).await;
    s.ctx.cfg.repetition_detection = Some(rule);
    s.ctx.cfg.answer_after_loop = true;
    s.server.record_bodies();
    s.server.push_scripted(Scripted::reply(T1, "stop")).await;
    // The byte-level toy codec: "ab " is a 3-token block; four copies end the turn.
    let before = "<think>Found it. ";
    let looping = format!("{before}{}", "ab ".repeat(4));
    s.server
        .push_scripted(Scripted::reply(&looping, "repetition"))
        .await;
    let answer = "It binds <cite id=\"CITE\">COMPOUND</cite>.</answer>";
    s.server
        .push_scripted(Scripted::reply(answer, "stop"))
        .await;
    let r = s.roll().await;
    assert_eq!(r.trajectory.finish_reason, "forced_answer");
    let got = r.parsed.answer.clone().unwrap_or_default();
    assert!(got.contains("COMPOUND"), "{got}");
    let model: String = r
        .trajectory
        .segments
        .iter()
        .filter(|x| x.kind != SegmentKind::ToolOutput)
        .map(|x| x.text.as_str())
        .collect();
    assert!(model.contains(&format!("{before}\n<answer>\n")), "{model}");
    assert!(!model.contains("ab ab"), "the copies are cut: {model}");
    for x in &r.trajectory.segments {
        assert_eq!(
            x.token_ids,
            toy_tokenize(&x.text),
            "tokens and text agree after the cut"
        );
        if let Some(l) = &x.logprobs {
            assert_eq!(l.len(), x.token_ids.len());
        }
    }
    assert_eq!(
        r.trajectory.parsed["loop_cut_tokens"], 12,
        "4 copies of 3 tokens"
    );
    // The forced answer's request continues from the context without the copies.
    let bodies = s.server.state.last_bodies.lock().await.clone();
    assert_eq!(bodies.len(), 3);
    let prompt: Vec<u32> = serde_json::from_value(bodies[2]["prompt"].clone()).unwrap();
    let tail = toy_tokenize(&format!("{before}\n<answer>\n"));
    assert!(
        prompt.ends_with(&tail),
        "the third request ends with the kept text and <answer>"
    );

    // A loop inside the answer still ends the trajectory.
    let mut s = setup(None, 10, 2000).await;
    s.ctx.cfg.repetition_detection = Some(rule);
    s.ctx.cfg.answer_after_loop = true;
    let looping = format!("<answer>It binds {}", "ab ".repeat(4));
    s.server
        .push_scripted(Scripted::reply(&looping, "repetition"))
        .await;
    let r = s.roll().await;
    assert_eq!(r.trajectory.finish_reason, "repetition");
    assert!(r.trajectory.parsed.get("loop_cut_tokens").is_none());
}

#[tokio::test]
async fn stopping_without_answer_forces_one() {
    let s = setup(None, 10, 2000).await;
    s.server
        .push_scripted(Scripted::reply("<think>I will just stop.</think>", "stop"))
        .await;
    s.server
        .push_scripted(Scripted::reply("A guess.</answer>", "stop"))
        .await;
    let r = s.roll().await;
    assert_eq!(r.trajectory.finish_reason, "forced_answer");
    let last = r.trajectory.segments.last().unwrap();
    assert_eq!(
        last.stage,
        Some(Stage::Answer),
        "the forced answer's tokens are Answer-stage model tokens"
    );
    assert!(r.parsed.answer_closed);
}

#[tokio::test]
async fn tool_budget_is_enforced() {
    let s = setup(None, 1, 4000).await;
    let call = "<call_tool name=\"google_search\">q</call_tool>";
    s.server
        .push_scripted(Scripted::reply(
            &format!("<structured_plan></structured_plan>{call}"),
            "stop",
        ))
        .await;
    s.server.push_scripted(Scripted::reply(call, "stop")).await;
    s.server
        .push_scripted(Scripted::reply("<answer>done</answer>", "stop"))
        .await;
    let r = s.roll().await;
    assert_eq!(r.calls.len(), 1, "the second call is refused");
    let outputs: Vec<&str> = r
        .trajectory
        .segments
        .iter()
        .filter(|x| x.kind == SegmentKind::ToolOutput)
        .map(|x| x.text.as_str())
        .collect();
    assert!(outputs[1].contains("budget of 1 tool calls"), "{outputs:?}");
    assert_eq!(r.trajectory.finish_reason, "forced_answer");
}

#[tokio::test]
async fn a_server_returning_more_than_asked_is_cut_to_the_budget() {
    // Budget 300 with 200 held back for a forced answer: the first turn may have 100 tokens.
    let s = setup(None, 10, 300).await;
    s.server
        .state
        .ignore_max_tokens
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let long = format!("<think>{}</think>", "x".repeat(500));
    s.server.push_scripted(Scripted::reply(&long, "stop")).await;
    let r = s.roll().await;
    let model: Vec<u32> = r
        .trajectory
        .segments
        .iter()
        .filter(|x| x.kind == SegmentKind::Model)
        .flat_map(|x| x.token_ids.clone())
        .collect();
    assert!(
        model.len() <= 300,
        "{} model tokens past a budget of 300",
        model.len()
    );
    let first_turn = s.ctx.codec.decode(&model[..100]).unwrap();
    assert_eq!(
        first_turn,
        long[..100],
        "the first turn is the reply cut at 100 tokens"
    );
    assert!(
        !s.ctx
            .codec
            .decode(&model)
            .unwrap()
            .starts_with(&long[..101])
    );
    for seg in &r.trajectory.segments {
        if seg.kind == SegmentKind::Model {
            assert_eq!(
                seg.logprobs.as_ref().map(Vec::len),
                Some(seg.token_ids.len())
            );
        }
    }
    assert_eq!(r.trajectory.finish_reason, "length");
}

#[tokio::test]
async fn server_failure_keeps_what_was_generated() {
    let s = setup(None, 10, 2000).await;
    s.server
        .push_scripted(Scripted::reply(
            "<structured_plan></structured_plan><call_tool name=\"google_search\">q</call_tool>",
            "stop",
        ))
        .await;
    // Faults apply to requests in order: the first turn succeeds, the second gets a 400.
    s.server
        .push_fault(common::fake_openai::Fault::Delay(Duration::ZERO))
        .await;
    s.server
        .push_fault(common::fake_openai::Fault::Status(400))
        .await;
    let r = s.roll().await;
    assert_eq!(r.trajectory.finish_reason, "error");
    assert!(r.error.as_deref().unwrap().contains("400"));
    assert_eq!(r.calls.len(), 1, "the first turn's tool call ran");
    assert!(
        r.trajectory
            .segments
            .iter()
            .any(|x| x.kind == SegmentKind::Model),
        "first turn kept"
    );
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn persisted_and_tool_cache_hits_on_rerun(pool: sqlx::PgPool) {
    let cache: Arc<dyn ToolCache> = Arc::new(db::tool_cache::PgToolCache { pool: pool.clone() });
    let s = setup(Some(cache), 10, 4000).await;
    let (gene, protein, compound, gene_doc) = texts(&s.world);
    let t1 = T1.replace("GENE", &gene);
    let t2 = T2.replace("PROTEIN", &protein);
    let t3 = T3.replace("COMPOUND", &compound).replace("CITE", &gene_doc);
    let exp = db::runs::create_experiment(&pool, "e", "smoke", &serde_json::json!({}))
        .await
        .unwrap();
    let run_id = db::runs::create_run(&pool, exp, "r", "full", &serde_json::json!({}), 1)
        .await
        .unwrap();
    let task_id = db::tasks::upsert(
        &pool,
        &[db::tasks::NewTask {
            source: "t".into(),
            external_id: "1".into(),
            prompt: "Which compound?".into(),
            answer_format: "exact".into(),
            persistent_rubrics: serde_json::json!([]),
            metadata: serde_json::json!({}),
        }],
    )
    .await
    .unwrap()[0];
    db::runs::begin_step(&pool, run_id, 0, 7, &[task_id])
        .await
        .unwrap();
    let mut rollouts = Vec::new();
    for k in 0..2 {
        for t in [&t1, &t2, &t3] {
            s.server.push_scripted(Scripted::reply(t, "stop")).await;
        }
        let r = s
            .ctx
            .run(
                &task(task_id),
                RolloutSlot {
                    sample_index: k,
                    ..slot(run_id)
                },
            )
            .await
            .unwrap();
        assert_eq!(
            r.calls.iter().all(|c| c.result.cached),
            k == 1,
            "rerun is served from the cache"
        );
        rollouts.push(r);
    }
    db::rollouts::insert(&pool, &rollouts).await.unwrap();
    for r in &rollouts {
        let back = db::trajectories::get(&pool, r.trajectory.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back.segments, r.trajectory.segments);
        assert_eq!(back.prompt_token_ids, r.trajectory.prompt_token_ids);
        assert_eq!(back.finish_reason, "answer");
    }
    let rows: Vec<(i16, String, bool, Vec<String>)> = sqlx::query_as(
        "SELECT stage, tool, cached, snippet_ids FROM tool_calls ORDER BY created_at, ordinal",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r.0 == Stage::Research as i16));
    assert_eq!(rows.iter().filter(|r| r.2).count(), 2);
    assert!(rows[0].3.contains(&gene_doc));
    // Citations land where scripts/sql/citation_validity.sql reads them.
    let known: bool = sqlx::query_scalar(
        "SELECT (parsed->'citations'->0->>'known')::boolean FROM trajectories LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(known);
}

#[tokio::test]
async fn sampling_seeds_follow_the_task_file_identity_not_its_database_id_or_prompt() {
    // A task's database id is a fresh v7 uuid in every database; the seed must not move with it,
    // or the same experiment samples other answers at T > 0 in each new database. Nor may two
    // tasks that ask the same question share seeds, or they draw identical samples (the world's
    // held-out set asks one question as three tasks).
    let mut s = setup(None, 3, 400).await;
    s.ctx.seed = Some(17);
    s.server.record_bodies();
    let same_question = RolloutTask {
        key: orchestrator::domain::util::task_key("world", "w17-h00006"),
        ..task(Uuid::now_v7())
    };
    let run = Uuid::now_v7();
    for t in [task(Uuid::now_v7()), task(Uuid::now_v7()), same_question] {
        s.server.push_scripted(Scripted::reply(T3, "stop")).await;
        s.ctx.run(&t, slot(run)).await.unwrap();
    }
    let seeds: Vec<u64> = s
        .server
        .state
        .last_bodies
        .lock()
        .await
        .iter()
        .map(|b| b["seed"].as_u64().expect("a seeded request"))
        .collect();
    // Each trajectory makes the same number of requests (a seed per turn).
    assert!(
        !seeds.is_empty() && seeds.len().is_multiple_of(3),
        "{seeds:?}"
    );
    let per: Vec<&[u64]> = seeds.chunks(seeds.len() / 3).collect();
    assert_eq!(per[0], per[1], "same task, other database ids: {seeds:?}");
    assert!(
        per[2].iter().all(|x| !per[0].contains(x)),
        "same question, another task: {seeds:?}"
    );
}
