//! `sft-data` with a teacher endpoint (method.md A.3): the fake OpenAI server plays the teacher
//! through `/v1/chat/completions`, tool calls hit a real local BM25 index over a generated
//! research world. Checks the round prompts (first vs later, stops, the trajectory so far), the
//! post-processing, every rejection rule the loop can meet, and the written row's shape.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::time::Duration;

use common::fake_openai::{FakeServer, Fault};
use orchestrator::domain::scaffold::{AnswerFormat, Scaffold};
use orchestrator::infra::llm::{
    ApiKey, EndpointPool, LlmClient, LlmError, RetryPolicy, Role, build_http,
};
use orchestrator::infra::prompts::{system_prompt, user_message};
use orchestrator::infra::tools::setup::{ToolSetup, build};
use orchestrator::pipeline::sft::teacher::{Teacher, TeacherSettings, TeacherTask};

const END: &str = "<review><rubric_review>- the protein: supported</rubric_review><writing_plan>One sentence.</writing_plan></review><answer>";
const PLAN: &str = "<scratchpad>The question links a gene to a protein.</scratchpad>\n<structured_plan><deep_analysis>Two linked facts.</deep_analysis><rubric>Knowledge checklist:\n- the protein\nAnalytical criteria:\n- link them\nNegative constraints:\n- no guessing</rubric><research_plan>Search the gene, then the protein.</research_plan></structured_plan>\n";

fn task(i: usize) -> TeacherTask {
    TeacherTask {
        id: format!("t{i}"),
        query: format!("Which protein does gene {i} encode?"),
        format: AnswerFormat::Short,
    }
}

/// A client for the fake as the teacher endpoint, without retries.
fn teacher_client(server: &FakeServer) -> LlmClient {
    let pool = EndpointPool::new(
        Role::Teacher,
        "teacher",
        &[server.url()],
        1,
        Duration::from_secs(10),
        100,
    );
    LlmClient::new(
        build_http(Duration::from_secs(5)).unwrap(),
        std::sync::Arc::new(pool),
        RetryPolicy::none(),
    )
}

#[tokio::test]
async fn teacher_rounds_are_prompted_postprocessed_checked_and_written() {
    let tmp = tempfile::tempdir().unwrap();
    let world = orchestrator::domain::data::world::generate(9, 60, 2);
    let idx = tmp.path().join("idx");
    orchestrator::infra::tools::local_search::LocalIndex::build(&world.docs, Some(&idx)).unwrap();
    let tools = build(
        &ToolSetup {
            index: Some(idx),
            index_tool: None,
            index_k: None,
            web: false,
            mcp_urls: vec![],
        },
        None,
    )
    .await
    .unwrap();

    let server = FakeServer::start().await;
    server.record_bodies();
    let replies = [
        // t0: kept. The server dropped the stop strings; the tool name is a variant.
        format!("{PLAN}<call_tool name=\"google_web_search\">gene protein"),
        "<scratchpad>One fact found.</scratchpad><state_evaluation>The gene is covered; the protein is missing.</state_evaluation><call_tool name=\"google_search\">protein function".to_string(),
        format!("<scratchpad>Enough.</scratchpad><state_evaluation>Both covered.</state_evaluation>{END}The gene encodes <cite id=\"x\">the protein</cite>."),
        // t1: answers from memory in round 1.
        format!("{PLAN}<answer>From memory: the protein.</answer>"),
        // t2: round 2 has no state evaluation (then it answers).
        format!("{PLAN}<call_tool name=\"google_search\">gene"),
        "<scratchpad>next</scratchpad><call_tool name=\"google_search\">protein".to_string(),
        format!("<scratchpad>done</scratchpad><state_evaluation>ok</state_evaluation>{END}x</answer>"),
        // t3: never answers within max_rounds = 3.
        format!("{PLAN}<call_tool name=\"google_search\">a"),
        "<scratchpad>more</scratchpad><state_evaluation>missing</state_evaluation><call_tool name=\"google_search\">b".to_string(),
        "<scratchpad>more</scratchpad><state_evaluation>missing</state_evaluation><call_tool name=\"google_search\">c".to_string(),
    ];
    for r in &replies {
        server.push_chat(r.clone()).await;
    }

    let client = teacher_client(&server);
    let system = system_prompt(Scaffold::Rubricem, &tools.specs(), 10).unwrap();
    let teacher = Teacher {
        client: &client,
        tools: &tools,
        system: system.clone(),
        settings: TeacherSettings {
            max_rounds: 3,
            max_tool_calls: 10,
            temperature: 0.7,
            max_tokens: 512,
            concurrency: 1, // the fake's replies are one queue
        },
    };
    let tasks: Vec<TeacherTask> = (0..4).map(task).collect();
    let (rows, mut stats) = teacher.run(&tasks, None).await.unwrap();
    // t4: the endpoint fails with a non-retryable status.
    server.push_fault(Fault::Status(400)).await;
    let failed = teacher.teach(&task(4)).await.unwrap();
    assert_eq!(failed.unwrap_err(), "teacher_error");
    *stats.rejected.entry("teacher_error".into()).or_default() += 1;

    assert_eq!(stats.tasks, 4);
    assert_eq!(stats.written, 1, "{stats:?}");
    let rejected: Vec<(&str, usize)> = stats
        .rejected
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(
        rejected,
        vec![
            ("missing_state_evaluation", 1),
            ("missing_tool_call", 1),
            ("no_answer", 1),
            ("teacher_error", 1),
        ]
    );

    // The kept row: agent system prompt, the user turn, the whole trace with tool spans apart.
    let row = &rows[0];
    assert_eq!(row.id, "t0");
    assert_eq!(row.messages[0].content, system);
    assert_eq!(
        row.messages[1].content,
        user_message(&tasks[0].query, AnswerFormat::Short)
    );
    let kinds: Vec<&str> = row.segments.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        ["model", "tool_output", "model", "tool_output", "model"]
    );
    let first = &row.segments[0].text;
    assert!(first.starts_with("<think>") && !first.contains("scratchpad"));
    assert!(first.ends_with("<call_tool name=\"google_search\">gene protein</call_tool>"));
    assert!(row.segments[1].text.contains("<tool_output>"));
    assert!(row.segments[1].text.contains("<snippet id="));
    assert!(row.segments[4].text.ends_with("</answer>"));
    let whole: String = row.segments.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(row.messages[2].content, whole);

    // The prompts: round 1 first-round prompt and the bare question; round 2 the later-round
    // prompt with the trajectory so far (post-processed text and the tool output).
    let bodies = server.state.last_bodies.lock().await.clone();
    assert_eq!(bodies.len(), 11, "3 + 1 + 3 + 3 rounds and the failed call");
    let sys0 = bodies[0]["messages"][0]["content"].as_str().unwrap();
    let user0 = bodies[0]["messages"][1]["content"].as_str().unwrap();
    assert!(sys0.contains("FIRST round"), "{sys0}");
    assert_eq!(user0, row.messages[1].content);
    assert_eq!(
        bodies[0]["stop"],
        serde_json::json!(["</call_tool>", "</answer>"])
    );
    assert_eq!(bodies[0]["model"], "teacher");
    let sys1 = bodies[1]["messages"][0]["content"].as_str().unwrap();
    let user1 = bodies[1]["messages"][1]["content"].as_str().unwrap();
    assert!(sys1.contains("NEXT round") && sys1.contains("Tool calls left: 9"));
    assert!(
        user1.contains(first.as_str()) && user1.contains(&row.segments[1].text.trim().to_string())
    );
    let sys2 = bodies[2]["messages"][0]["content"].as_str().unwrap();
    assert!(sys2.contains("Tool calls left: 8"));
    let user2 = bodies[2]["messages"][1]["content"].as_str().unwrap();
    assert!(user2.contains(&row.segments[3].text.trim().to_string()));
    // No key configured: no Authorization header.
    assert!(
        server
            .state
            .chat_auth
            .lock()
            .await
            .iter()
            .all(Option::is_none)
    );
}

#[tokio::test]
async fn api_key_comes_from_the_named_variable_and_is_never_printed() {
    let err = ApiKey::from_env("RUBRICEM_TEST_SURELY_UNSET_KEY").unwrap_err();
    assert!(matches!(err, LlmError::MissingApiKey { .. }));
    assert!(err.to_string().contains("RUBRICEM_TEST_SURELY_UNSET_KEY"));
    assert_eq!(ApiKey::from_setting(None).unwrap().map(|_| ()), None);

    // PATH is set in every test process; its value stands in for a key.
    let secret = std::env::var("PATH").unwrap();
    let key = ApiKey::from_env("PATH").unwrap();
    assert_eq!(format!("{key:?}"), "ApiKey(***)");
    let server = FakeServer::start().await;
    server.record_bodies();
    server.push_chat("hello").await;
    let client = teacher_client(&server).with_api_key(Some(key));
    assert!(!format!("{client:?}").contains(secret.trim()));
    let req = orchestrator::infra::llm::ChatRequest {
        model: "teacher".into(),
        messages: vec![orchestrator::infra::llm::ChatMessage::user("hi")],
        temperature: 0.0,
        max_tokens: 8,
        response_format: None,
        seed: None,
        stop: vec![],
    };
    let (c, _) = client.chat(&req).await.unwrap();
    assert_eq!(c.content, "hello");
    let auth = server.state.chat_auth.lock().await.clone();
    assert_eq!(auth, vec![Some(format!("Bearer {}", secret.trim()))]);
}
