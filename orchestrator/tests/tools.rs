//! The tool layer: Serper and Semantic Scholar clients against loopback fakes (attributes
//! forwarded, keys from the environment), local search as a stand-in, the runner's limits,
//! timeouts and error output, and the Postgres result cache (hit on rerun).
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::Query;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::BoxFuture;
use orchestrator::infra::db::tool_cache::PgToolCache;
use orchestrator::infra::tools::runner::{
    MemoryCache, Snippet, Tool, ToolArgs, ToolError, ToolLimits, ToolRunner,
};
use orchestrator::infra::tools::search_apis::{GoogleSearch, LocalSearch, SnippetSearch};
use serde_json::{Value, json};

async fn serve(app: Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

fn args(q: &str, attrs: &[(&str, &str)]) -> ToolArgs {
    ToolArgs {
        query: q.into(),
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

// The key is read from an environment variable at call time. Setting variables is unsafe in
// Rust 2024, so the tests point the client at one every process has.
const KEY_ENV: &str = "PATH";

#[tokio::test]
async fn google_search_sends_key_and_attributes() {
    let app = Router::new().route(
        "/search",
        post(|headers: HeaderMap, Json(body): Json<Value>| async move {
            assert_eq!(headers["x-api-key"].to_str().unwrap(), std::env::var(KEY_ENV).unwrap());
            assert_eq!(body["gl"], "de");
            assert_eq!(body["num"], 3);
            Json(json!({"organic": [
                {"title": "T1", "link": "https://a.example/1", "snippet": format!("about {}", body["q"].as_str().unwrap())},
                {"title": "T2", "link": "https://a.example/2", "snippet": "second"}
            ]}))
        }),
    );
    let url = serve(app).await;
    let g = GoogleSearch::new(&url, KEY_ENV).unwrap();
    let out = g
        .call(&args("tn5 mechanism", &[("gl", "de"), ("num", "3")]))
        .await
        .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].text, "about tn5 mechanism");
    assert_eq!(out[0].url.as_deref(), Some("https://a.example/1"));
    let again = g
        .call(&args("tn5 mechanism", &[("gl", "de"), ("num", "3")]))
        .await
        .unwrap();
    assert_eq!(out[0].id, again[0].id, "content-hash ids are stable");
    assert_ne!(out[0].id, out[1].id);

    let missing = GoogleSearch::new(&url, "RUBRICEM_TEST_UNSET_KEY_9F2").unwrap();
    let err = missing.call(&args("q", &[])).await.unwrap_err().to_string();
    assert!(err.contains("RUBRICEM_TEST_UNSET_KEY_9F2"), "{err}");
}

#[tokio::test]
async fn snippet_search_forwards_year_and_fields_of_study() {
    let app = Router::new().route(
        "/graph/v1/snippet/search",
        get(|Query(q): Query<BTreeMap<String, String>>| async move {
            assert_eq!(q["query"], "transposon");
            assert_eq!(q["year"], "2015-2025");
            assert_eq!(q["fieldsOfStudy"], "Biology,Medicine");
            assert_eq!(q["limit"], "2");
            Json(json!({"data": [
                {"snippet": {"text": "Tn5 body", "snippetKind": "body"}, "paper": {"title": "P1", "corpusId": 42}},
                {"snippet": {"text": "P1", "snippetKind": "title"}, "paper": {"title": "P1", "corpusId": 42}}
            ]}))
        }),
    );
    let url = serve(app).await;
    let s = SnippetSearch::new(&url, "RUBRICEM_TEST_UNSET_KEY_9F2").unwrap();
    let out = s
        .call(&args(
            "transposon",
            &[
                ("year", "2015-2025"),
                ("fieldsOfStudy", "Biology,Medicine"),
                ("limit", "2"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(out.len(), 1, "title-kind snippets are dropped");
    assert_eq!(out[0].text, "Tn5 body");
    assert_eq!(
        out[0].url.as_deref(),
        Some("https://www.semanticscholar.org/c/42")
    );
}

struct Slow(Duration, AtomicUsize);
impl Tool for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn spec(&self) -> orchestrator::infra::chat::ToolSpec {
        orchestrator::infra::chat::ToolSpec {
            name: "slow".into(),
            description: "sleeps".into(),
            attributes: String::new(),
        }
    }
    fn call<'a>(&'a self, a: &'a ToolArgs) -> BoxFuture<'a, Result<Vec<Snippet>, ToolError>> {
        Box::pin(async move {
            self.1.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.0).await;
            Ok(vec![Snippet::new("slow", "t", None, a.query.clone())])
        })
    }
}

#[tokio::test]
async fn runner_limits_timeouts_cache_and_errors() {
    let slow = Arc::new(Slow(Duration::from_millis(50), AtomicUsize::new(0)));
    let mut r = ToolRunner::new(Some(Arc::new(MemoryCache::default())));
    r.register(
        "slow",
        slow.clone(),
        ToolLimits {
            max_concurrency: 2,
            min_interval: Duration::ZERO,
            timeout: Duration::from_secs(5),
        },
    );
    r.register(
        "tiny_timeout",
        slow.clone(),
        ToolLimits {
            timeout: Duration::from_millis(5),
            ..Default::default()
        },
    );
    r.register(
        "rate",
        slow.clone(),
        ToolLimits {
            min_interval: Duration::from_millis(40),
            ..Default::default()
        },
    );
    let r = Arc::new(r);

    // Concurrency 2, 6 distinct calls of 50 ms: at least 3 waves.
    let t0 = Instant::now();
    let calls = (0..6).map(|i| {
        let r = r.clone();
        async move { r.run("slow", args(&format!("q{i}"), &[])).await }
    });
    let out = futures::future::join_all(calls).await;
    assert!(out.iter().all(|o| o.error.is_none() && !o.cached));
    assert!(
        t0.elapsed() >= Duration::from_millis(145),
        "{:?}",
        t0.elapsed()
    );

    // Rerun: a cache hit, the tool is not called again; normalisation ignores spacing.
    let before = slow.1.load(Ordering::SeqCst);
    let hit = r.run("slow", args("  q1 ", &[])).await;
    assert!(hit.cached);
    assert_eq!(slow.1.load(Ordering::SeqCst), before);
    assert!(
        hit.output_text.starts_with("<tool_output><snippet id="),
        "{}",
        hit.output_text
    );

    let to = r.run("tiny_timeout", args("z", &[])).await;
    assert!(to.error.as_deref().unwrap().contains("timed out"), "{to:?}");
    assert!(to.output_text.contains("Error:"));

    let unknown = r.run("nope", args("z", &[])).await;
    assert!(
        unknown
            .error
            .as_deref()
            .unwrap()
            .contains("unknown tool `nope`")
    );
    let empty = r.run("slow", args("   ", &[])).await;
    assert!(empty.error.is_some());

    // Rate limit: 4 calls 40 ms apart take at least 120 ms even though each is 50 ms in parallel.
    let t0 = Instant::now();
    let calls = (0..4).map(|i| {
        let r = r.clone();
        async move { r.run("rate", args(&format!("r{i}"), &[])).await }
    });
    futures::future::join_all(calls).await;
    assert!(
        t0.elapsed() >= Duration::from_millis(165),
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test]
async fn local_search_stands_in_for_google_search() {
    let w = orchestrator::domain::data::world::generate(3, 120, 3);
    let idx = Arc::new(
        orchestrator::infra::tools::local_search::LocalIndex::build(&w.docs, None).unwrap(),
    );
    let mut r = ToolRunner::new(None);
    r.register(
        "google_search",
        Arc::new(LocalSearch {
            index: idx,
            description: "web search.".into(),
            default_k: 3,
        }),
        ToolLimits::default(),
    );
    assert_eq!(
        r.specs()[0].name,
        "google_search",
        "the model sees the production name"
    );
    let t = &w.tasks[0];
    let res = r.run("google_search", args(&t.query, &[])).await;
    assert!(res.error.is_none());
    assert!(
        res.snippets
            .iter()
            .any(|s| s.id == t.rubrics[0].evidence[0]),
        "doc ids are snippet ids"
    );
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn postgres_cache_hits_on_rerun(pool: sqlx::PgPool) {
    let slow = Arc::new(Slow(Duration::from_millis(1), AtomicUsize::new(0)));
    let cache = Arc::new(PgToolCache { pool: pool.clone() });
    let mut r = ToolRunner::new(Some(cache));
    r.register("slow", slow.clone(), ToolLimits::default());
    let a = r.run("slow", args("query one", &[("year", "2020")])).await;
    let b = r
        .run("slow", args("query   one", &[("year", "2020")]))
        .await;
    assert!(!a.cached && b.cached);
    assert_eq!(a.snippets, b.snippets);
    assert_eq!(slow.1.load(Ordering::SeqCst), 1);
    let c = r.run("slow", args("query one", &[("year", "2021")])).await;
    assert!(!c.cached, "different attributes, different key");
    let hits: i64 = sqlx::query_scalar("SELECT sum(hits)::bigint FROM tool_cache")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(hits, 1);
}
