//! The inference client against the loopback fake: token-in/token-out, retries, failover,
//! timeouts, health and feature detection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test and benchmark code fails loudly"
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fake_openai::{FakeServer, Fault, Features, Scripted, toy_tokenize};
use orchestrator::infra::llm::{
    ChatMessage, ChatRequest, CompletionRequest, EndpointPool, FinishReason, LlmClient, LlmError,
    ResponseFormat, RetryPolicy, Role, build_http, detect,
};

fn fast_retry(n: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries: n,
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        jitter: true,
    }
}

fn client(urls: &[String], role: Role, timeout: Duration, retries: u32) -> LlmClient {
    let pool = EndpointPool::new(role, "policy", urls, 64, timeout, 2);
    LlmClient::new(
        build_http(Duration::from_secs(2)).unwrap(),
        Arc::new(pool),
        fast_retry(retries),
    )
}

fn one(server: &FakeServer) -> LlmClient {
    client(&[server.url()], Role::Policy, Duration::from_secs(5), 4)
}

#[tokio::test]
async fn token_ids_in_and_out_with_logprobs() {
    let server = FakeServer::start().await;
    server.record_bodies();
    let c = one(&server);
    let mut req = CompletionRequest::new("policy", vec![100, 200, 300], 5);
    req.stop = vec!["</call_tool>".into()];
    let (comp, timing) = c.complete("traj-1", &req).await.unwrap();
    let ch = &comp.choices[0];
    assert_eq!(ch.token_ids, vec![311, 312, 313, 314, 315]);
    assert_eq!(ch.logprobs.len(), 5);
    assert!((ch.logprobs[2] + 0.03).abs() < 1e-6);
    assert_eq!(ch.finish_reason, FinishReason::Length);
    assert_eq!(comp.endpoint, server.url());
    assert_eq!(timing.attempts, 1);
    let body = server.state.last_bodies.lock().await[0].clone();
    assert_eq!(body["prompt"], serde_json::json!([100, 200, 300]));
    assert_eq!(body["return_token_ids"], true);
    assert_eq!(body["logprobs"], 0);
    assert_eq!(body["include_stop_str_in_output"], true);
    assert_eq!(body["stop"], serde_json::json!(["</call_tool>"]));
}

#[tokio::test]
async fn stop_string_tokens_are_kept() {
    let server = FakeServer::start().await;
    let text = "<call_tool name=\"google_search\">x</call_tool>";
    server
        .push_scripted(Scripted {
            text: text.into(),
            token_ids: toy_tokenize(text),
            finish_reason: "stop".into(),
            stop_reason: Some("</call_tool>".into()),
        })
        .await;
    let (comp, _) = one(&server)
        .complete("t", &CompletionRequest::new("policy", vec![1], 64))
        .await
        .unwrap();
    let ch = &comp.choices[0];
    assert_eq!(
        ch.token_ids,
        toy_tokenize(text),
        "ids include the stop string's tokens"
    );
    assert!(ch.text.ends_with("</call_tool>"));
    assert_eq!(ch.finish_reason, FinishReason::Stop);
    assert_eq!(ch.stop_reason.as_deref(), Some("</call_tool>"));
}

#[tokio::test]
async fn n_choices_come_back_in_order() {
    let server = FakeServer::start().await;
    let mut req = CompletionRequest::new("policy", vec![7], 3);
    req.n = 4;
    let (comp, _) = one(&server).complete("t", &req).await.unwrap();
    assert_eq!(comp.choices.len(), 4);
}

#[tokio::test]
async fn retries_429_500_truncated_and_garbage_then_succeeds() {
    let server = FakeServer::start().await;
    for f in [
        Fault::Status(429),
        Fault::Status(500),
        Fault::Truncated,
        Fault::Garbage,
    ] {
        server.push_fault(f).await;
    }
    let (comp, timing) = one(&server)
        .complete("t", &CompletionRequest::new("policy", vec![1], 2))
        .await
        .unwrap();
    assert_eq!(comp.choices[0].token_ids.len(), 2);
    assert_eq!(timing.attempts, 5);
    assert_eq!(server.completions(), 5);
}

#[tokio::test]
async fn gives_up_with_endpoint_and_body_excerpt() {
    let server = FakeServer::start().await;
    for _ in 0..10 {
        server.push_fault(Fault::Garbage).await;
    }
    let c = client(&[server.url()], Role::Policy, Duration::from_secs(5), 2);
    let err = c
        .complete("t", &CompletionRequest::new("policy", vec![1], 2))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&server.url()), "{msg}");
    assert!(msg.contains("upstream exploded"), "{msg}");
    assert_eq!(server.completions(), 3, "first try + 2 retries");
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let server = FakeServer::start().await;
    server.push_fault(Fault::Status(400)).await;
    let err = one(&server)
        .complete("t", &CompletionRequest::new("policy", vec![1], 2))
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Status { status: 400, .. }), "{err}");
    assert_eq!(server.completions(), 1);
}

#[tokio::test]
async fn timeout_is_retried_then_succeeds() {
    let server = FakeServer::start().await;
    server
        .push_fault(Fault::Delay(Duration::from_millis(800)))
        .await;
    let c = client(&[server.url()], Role::Policy, Duration::from_millis(200), 3);
    let (comp, timing) = c
        .complete("t", &CompletionRequest::new("policy", vec![1], 2))
        .await
        .unwrap();
    assert_eq!(comp.choices.len(), 1);
    assert_eq!(timing.attempts, 2);
}

#[tokio::test]
async fn timeout_error_names_endpoint_and_limit() {
    let server = FakeServer::start().await;
    server.set_latency(Duration::from_millis(500));
    let c = client(&[server.url()], Role::Policy, Duration::from_millis(100), 1);
    let err = c
        .complete("t", &CompletionRequest::new("policy", vec![1], 2))
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains(&server.url()));
}

#[tokio::test]
async fn failover_to_second_endpoint_when_first_is_down() {
    let good = FakeServer::start().await;
    // A port nobody listens on: bind, read the port, drop the listener.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let c = client(
        &[dead.clone(), good.url()],
        Role::Policy,
        Duration::from_secs(2),
        3,
    );
    for i in 0..20 {
        let (comp, _) = c
            .complete(
                &format!("s{i}"),
                &CompletionRequest::new("policy", vec![1], 1),
            )
            .await
            .unwrap();
        assert_eq!(comp.endpoint, good.url());
    }
    let stats = c.pool().stats();
    let dead_stats = stats.iter().find(|s| s.url == dead).unwrap();
    assert!(
        !dead_stats.healthy,
        "the dead endpoint is taken out of rotation: {stats:?}"
    );
    assert!(
        dead_stats.failed <= 3,
        "after it is marked down it is not tried first: {stats:?}"
    );
}

#[tokio::test]
async fn failover_on_5xx_and_sticky_routing() {
    let a = FakeServer::start().await;
    let b = FakeServer::start().await;
    let c = client(&[a.url(), b.url()], Role::Policy, Duration::from_secs(2), 3);
    // Sticky: every turn of one session goes to one server.
    let mut first = None;
    for _ in 0..10 {
        let (comp, _) = c
            .complete("session-x", &CompletionRequest::new("policy", vec![1], 1))
            .await
            .unwrap();
        let ep = first.get_or_insert(comp.endpoint.clone());
        assert_eq!(*ep, comp.endpoint);
    }
    let sticky = first.unwrap();
    let (sticky_srv, other) = if sticky == a.url() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let before = other.completions();
    sticky_srv.push_fault(Fault::Status(503)).await;
    let (comp, timing) = c
        .complete("session-x", &CompletionRequest::new("policy", vec![1], 1))
        .await
        .unwrap();
    assert_eq!(
        comp.endpoint,
        other.url(),
        "retry fails over to the other server"
    );
    assert_eq!(timing.attempts, 2);
    assert_eq!(other.completions(), before + 1);
}

#[tokio::test]
async fn health_probe_marks_down_and_up() {
    let server = FakeServer::start().await;
    let c = one(&server);
    server.state.features.write().unwrap().health = false;
    c.probe_health().await;
    assert!(!c.pool().stats()[0].healthy);
    server.state.features.write().unwrap().health = true;
    c.probe_health().await;
    assert!(c.pool().stats()[0].healthy);
}

#[tokio::test]
async fn concurrency_limit_per_endpoint_is_respected() {
    let server = FakeServer::start().await;
    server.set_latency(Duration::from_millis(50));
    let pool = EndpointPool::new(
        Role::Policy,
        "policy",
        &[server.url()],
        4,
        Duration::from_secs(5),
        2,
    );
    let c = LlmClient::new(
        build_http(Duration::from_secs(2)).unwrap(),
        Arc::new(pool),
        fast_retry(0),
    );
    let start = std::time::Instant::now();
    let calls = (0..16).map(|i| {
        let c = c.clone();
        async move {
            c.complete(
                &format!("s{i}"),
                &CompletionRequest::new("policy", vec![1], 1),
            )
            .await
        }
    });
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().all(|r| r.is_ok()));
    // 16 requests, 4 at a time, 50 ms each: at least 4 waves.
    assert!(
        start.elapsed() >= Duration::from_millis(190),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn structured_chat_retries_bad_json_then_parses() {
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Verdict {
        score: u8,
        justification: String,
    }
    let server = FakeServer::start().await;
    server.push_chat("not json at all").await;
    server
        .push_chat("{\"score\": 7, \"justification\": \"out of range\"}")
        .await;
    server
        .push_chat("```json\n{\"score\": 2, \"justification\": \"covers it\"}\n```")
        .await;
    let c = client(&[server.url()], Role::Judge, Duration::from_secs(5), 5);
    let req = ChatRequest {
        model: "policy".into(),
        messages: vec![ChatMessage::user("score this")],
        temperature: 0.0,
        max_tokens: 64,
        response_format: Some(ResponseFormat::json_schema(
            "verdict",
            serde_json::json!({"type": "object"}),
        )),
        seed: None,
        stop: Vec::new(),
    };
    let (s, _) = c
        .chat_structured::<Verdict, _>(&req, |v| {
            if v.score <= 2 {
                Ok(())
            } else {
                Err(format!("score {} is outside 0..=2", v.score))
            }
        })
        .await
        .unwrap();
    assert_eq!(
        s.value,
        Verdict {
            score: 2,
            justification: "covers it".into()
        }
    );
    assert_eq!(s.attempts, 3);
}

#[tokio::test]
async fn embeddings_and_tokenizer_endpoints() {
    let server = FakeServer::start().await;
    let c = one(&server);
    let v = c.embed(&["a".into(), "bb".into()]).await.unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].len(), 8);
    let ids = c.tokenize(Some("s"), "hi").await.unwrap();
    assert_eq!(ids, toy_tokenize("hi"));
    assert_eq!(c.detokenize(&ids).await.unwrap(), "hi");
}

#[tokio::test]
async fn feature_detection_passes_on_a_complete_server() {
    let server = FakeServer::start().await;
    let c = one(&server);
    let f = detect(&c, &c.pool().endpoints()[0], Role::Policy)
        .await
        .unwrap();
    assert!(f.tokenize && f.return_token_ids && f.logprobs && f.token_id_prompts);
    assert_eq!(f.version.as_deref(), Some("fake-0.1"));
    let j = client(&[server.url()], Role::Judge, Duration::from_secs(5), 0);
    assert!(
        detect(&j, &j.pool().endpoints()[0], Role::Judge)
            .await
            .unwrap()
            .chat
    );
    let e = client(&[server.url()], Role::Embeddings, Duration::from_secs(5), 0);
    assert!(
        detect(&e, &e.pool().endpoints()[0], Role::Embeddings)
            .await
            .unwrap()
            .embeddings
    );
}

#[tokio::test]
async fn feature_detection_names_what_is_missing() {
    let server = FakeServer::start_with(Features {
        tokenize: false,
        token_ids: false,
        logprobs: false,
        ..Default::default()
    })
    .await;
    let c = one(&server);
    let err = detect(&c, &c.pool().endpoints()[0], Role::Policy)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("`/tokenize` (HTTP 404)"), "{err}");
    assert!(err.contains("return_token_ids"), "{err}");
    assert!(err.contains("logprobs"), "{err}");
    assert!(err.contains(&server.url()), "{err}");

    let server = FakeServer::start_with(Features {
        chat: false,
        embeddings: false,
        ..Default::default()
    })
    .await;
    let j = client(&[server.url()], Role::Judge, Duration::from_secs(5), 0);
    let err = detect(&j, &j.pool().endpoints()[0], Role::Judge)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("/v1/chat/completions"), "{err}");
    let e = client(&[server.url()], Role::Embeddings, Duration::from_secs(5), 0);
    let err = detect(&e, &e.pool().endpoints()[0], Role::Embeddings)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("/v1/embeddings"), "{err}");
}

#[tokio::test]
async fn feature_detection_names_a_wrong_model() {
    let server = FakeServer::start().await;
    let pool = EndpointPool::new(
        Role::Policy,
        "qwen3-8b",
        &[server.url()],
        4,
        Duration::from_secs(5),
        2,
    );
    let c = LlmClient::new(
        build_http(Duration::from_secs(2)).unwrap(),
        Arc::new(pool),
        fast_retry(0),
    );
    let err = detect(&c, &c.pool().endpoints()[0], Role::Policy)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model `qwen3-8b`") && err.contains("served: policy"),
        "{err}"
    );
}

#[tokio::test]
async fn unreachable_server_fails_detection_with_connect_error() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let c = client(
        std::slice::from_ref(&dead),
        Role::Policy,
        Duration::from_secs(2),
        0,
    );
    let err = detect(&c, &c.pool().endpoints()[0], Role::Policy)
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Connect { .. }), "{err}");
    assert!(err.to_string().contains(&dead));
}
