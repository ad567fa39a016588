//! DeepRubric end to end against a scripted loopback LLM on the real SciFact corpus (a BM25
//! index built here, searched through the project's tool runner): evidence trees grown depth
//! first with the per-depth limits, a candidate composed per tree (a malformed reply retried),
//! KEEP / REVISE / DROP with a negative weight removed, statistics, a task file the project's
//! task loader reads; a stage run alone; and a build killed mid-tree with SIGKILL continuing
//! without duplicate nodes or items.
#![allow(clippy::disallowed_methods)] // reads Postgres directly to check what the product stored
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code fails loudly"
)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::fake_deeprubric::FakeDr;
use orchestrator::domain::deeprubric::TreeLimits;
use orchestrator::infra::llm::{EndpointPool, LlmClient, RetryPolicy, Role};
use orchestrator::pipeline::deeprubric::{self as dr, DrSpec, Stage};
use tokio_util::sync::CancellationToken;

fn scifact() -> PathBuf {
    std::env::var("SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data"))
        .join("scifact/corpus.jsonl")
}

/// The SciFact BM25 index, built once per test process.
fn index_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let docs = orchestrator::infra::tools::read_corpus(&scifact()).unwrap();
        orchestrator::infra::tools::LocalIndex::build(&docs, Some(&dir.path().join("idx")))
            .unwrap();
        dir
    })
    .path()
    .join("idx")
}

const SEEDS: [&str; 3] = [
    "aspirin and cardiovascular disease",
    "vitamin D supplementation and bone fractures",
    "smoking and lung cancer risk",
];

async fn spec(fake: &FakeDr, name: &str) -> DrSpec {
    let setup = orchestrator::infra::tools::setup::ToolSetup {
        index: Some(index_dir()),
        index_tool: None,
        index_k: None,
        web: false,
        mcp_urls: vec![],
    };
    let tools = orchestrator::infra::tools::setup::build(&setup, None)
        .await
        .unwrap();
    let pool = EndpointPool::new(
        Role::Judge,
        "dr",
        &[fake.url()],
        16,
        Duration::from_secs(30),
        1000,
    );
    let http = orchestrator::infra::llm::build_http(Duration::from_secs(5)).unwrap();
    let llm = LlmClient::new(http, Arc::new(pool), RetryPolicy::none());
    DrSpec {
        name: name.into(),
        seeds: SEEDS.iter().map(|s| s.to_string()).collect(),
        pages: vec![None; SEEDS.len()],
        limits: TreeLimits::default(),
        verifier: llm.clone(),
        llm,
        temperature: 0.4,
        max_tokens: 2048,
        attempts: 3,
        tools: Arc::new(tools),
        search_tool: "snippet_search".into(),
        trees_inflight: 2,
        progress: false,
        prices: orchestrator::domain::deeprubric::Prices {
            prompt: 2.0,
            completion: 8.0,
        },
    }
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn three_stages_on_scifact_keep_revise_drop_and_write_tasks(pool: sqlx::PgPool) {
    let fake = FakeDr::start().await;
    *fake.state.revise_marker.write().unwrap() = "vitamin".into();
    *fake.state.drop_marker.write().unwrap() = "smoking".into();
    fake.garbage_once("compose");
    let spec = spec(&fake, "b1").await;
    let cancel = CancellationToken::new();
    // The tree stage alone first: nothing composed yet.
    let (id, s) = dr::run(&pool, &spec, &[Stage::Tree], &cancel)
        .await
        .unwrap();
    assert_eq!((s.trees, s.trees_failed, s.items_composed), (3, 0, 0));
    // Root branches into 2, each into 2, then the gate stops at depth 2: 7 nodes, 4 leaves.
    assert_eq!(s.nodes_per_tree, 7.0);
    assert_eq!(s.leaf_depths.get(&2), Some(&12));
    let leaves: Vec<(String, serde_json::Value, String)> = sqlx::query_as(
        "SELECT node_id, statements, query FROM dr_nodes WHERE build_id = $1 AND status = 'leaf'",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        leaves
            .iter()
            .all(|(_, st, _)| st.as_array().is_some_and(|a| !a.is_empty()))
    );
    // Statements come from real retrieval: passages are SciFact documents.
    let passages: serde_json::Value = sqlx::query_scalar(
        "SELECT passages FROM dr_nodes WHERE build_id = $1 AND node_id = 'N1' AND seed_index = 0",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(passages.as_array().unwrap().len(), 5);

    // Then compose and verify (the same build continues).
    let (_, s) = dr::run(&pool, &spec, &[Stage::Compose, Stage::Verify], &cancel)
        .await
        .unwrap();
    assert_eq!(
        fake.calls("compose"),
        4,
        "3 trees + 1 retried malformed reply"
    );
    assert_eq!((s.items_composed, s.items_failed), (3, 0));
    assert_eq!((s.keep, s.revise, s.drop, s.verify_failed), (1, 1, 1, 0));
    assert_eq!(s.rubrics_per_item, 6.0);
    assert!((s.factual_share - 4.0 / 6.0).abs() < 1e-9);
    assert_eq!(s.reasons.get("question-rubric mismatch"), Some(&1));
    assert_eq!(s.reasons.get("scope/merge overreach"), Some(&1));
    assert_eq!(s.reasons.get("negative-weight removal"), Some(&1));
    assert!(s.llm_calls > 0 && s.prompt_tokens > 0);
    // Cost per stage at $2 / $8 per million tokens, summing to the total.
    let want = (s.prompt_tokens as f64 * 2.0 + s.completion_tokens as f64 * 8.0) / 1e6;
    assert!((s.cost_usd - want).abs() < 1e-9 && s.cost_usd > 0.0);
    let by_stage: f64 = s.per_stage.values().map(|c| c.cost_usd).sum();
    assert!((by_stage - s.cost_usd).abs() < 1e-9);
    assert_eq!(
        s.per_stage.keys().map(String::as_str).collect::<Vec<_>>(),
        ["compose", "tree", "verify"]
    );

    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("tasks.jsonl");
    assert_eq!(dr::write_tasks(&pool, id, &path).await.unwrap(), 2);
    let tasks = orchestrator::domain::data::tasks::load(&path).unwrap();
    assert_eq!(tasks.len(), 2);
    for t in &tasks {
        assert_eq!(t.rubrics.len(), 5, "{:?}", t.rubrics);
        assert!(t.rubrics.iter().all(|r| r.weight > 0.0));
        // Factual rubrics carry their evidence.
        assert!(
            t.rubrics
                .iter()
                .filter(|r| r.title.contains("factual"))
                .all(|r| !r.evidence.is_empty())
        );
    }
    assert!(
        tasks
            .iter()
            .any(|t| t.query.starts_with("Which mechanisms explain")),
        "the revised question"
    );

    // A rerun of a finished build asks nothing again.
    let before = fake
        .state
        .requests
        .load(std::sync::atomic::Ordering::SeqCst);
    dr::run(
        &pool,
        &spec,
        &[Stage::Tree, Stage::Compose, Stage::Verify],
        &cancel,
    )
    .await
    .unwrap();
    assert_eq!(
        fake.state
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        before
    );
    // Another build under the same name with other seeds is refused.
    let mut other = spec;
    other.seeds.pop();
    let err = dr::run(&pool, &other, &[Stage::Tree], &cancel)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("seeds_sha256"), "{err}");
}

#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn a_build_killed_mid_tree_continues_without_duplicates(pool: sqlx::PgPool) {
    let fake = FakeDr::start().await;
    *fake.state.latency.write().unwrap() = Duration::from_millis(150);
    let dir = tempfile::tempdir().unwrap();
    let seeds = dir.path().join("seeds.txt");
    std::fs::write(&seeds, SEEDS.join("\n")).unwrap();
    let url = common::database::db_url(&pool).await;
    let out = dir.path().join("tasks.jsonl");
    let command = || {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        c.args(["data", "deeprubric", "--name", "killed", "--json"])
            .arg("--seeds")
            .arg(&seeds)
            .arg("--out")
            .arg(&out)
            .arg("--index")
            .arg(index_dir())
            .args([
                "--database-url",
                &url,
                "--llm-url",
                &fake.url(),
                "--llm-model",
                "dr",
            ])
            .args(["--trees-in-flight", "1"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        c
    };
    let mut child = command().spawn().unwrap();
    common::kill::kill_once_stored(
        &mut child,
        &pool,
        "SELECT count(*) FROM dr_nodes WHERE status <> 'pending'",
        3,
        "no node processed",
    )
    .await;
    let items: i64 = sqlx::query_scalar("SELECT count(*) FROM dr_items")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(items, 0, "killed mid-tree, before composing");
    *fake.state.latency.write().unwrap() = Duration::ZERO;
    let mut again = command();
    let output = tokio::task::spawn_blocking(move || again.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stats: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(stats["trees"], 3);
    assert_eq!(stats["nodes_per_tree"], 7.0);
    assert_eq!(stats["items_composed"], 3);
    assert_eq!(stats["keep"], 3);
    // Every tree has exactly N1..N7, each child's parent exists, one item per tree.
    let rows: Vec<(i32, String, Option<String>)> = sqlx::query_as(
        "SELECT seed_index, node_id, parent FROM dr_nodes ORDER BY seed_index, ordinal",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for seed in 0..3 {
        let ids: Vec<&str> = rows
            .iter()
            .filter(|r| r.0 == seed)
            .map(|r| r.1.as_str())
            .collect();
        assert_eq!(
            ids,
            vec!["N1", "N2", "N3", "N4", "N5", "N6", "N7"],
            "seed {seed}"
        );
        for r in rows.iter().filter(|r| r.0 == seed) {
            if let Some(p) = &r.2 {
                assert!(ids.contains(&p.as_str()));
            }
        }
    }
    let items: i64 = sqlx::query_scalar("SELECT count(*) FROM dr_items")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(items, 3);
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 3);
}

/// Seeds drawn from the corpus carry their page: the root's statements are the page's summary
/// and information points (no retrieval at the root), and the tree grows on from there.
#[sqlx::test(migrator = "orchestrator::infra::db::MIGRATOR")]
async fn corpus_seeds_start_the_root_from_their_page(pool: sqlx::PgPool) {
    let fake = FakeDr::start().await;
    let docs = orchestrator::infra::tools::read_corpus(&scifact()).unwrap();
    let picked: Vec<_> = docs
        .iter()
        .filter(|d| d.text.split(". ").count() >= 4)
        .take(2)
        .collect();
    let mut spec = spec(&fake, "pages").await;
    spec.seeds = picked.iter().map(|d| d.title.clone()).collect();
    spec.pages = picked
        .iter()
        .map(|d| Some(format!("{}\n\n{}", d.title, d.text)))
        .collect();
    let (id, s) = dr::run(&pool, &spec, &[Stage::Tree], &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((s.trees, s.trees_failed), (2, 0));
    assert_eq!(fake.calls("root"), 2);
    assert_eq!(s.nodes_per_tree, 7.0);
    let (passages, statements): (serde_json::Value, serde_json::Value) = sqlx::query_as(
        "SELECT passages, statements FROM dr_nodes WHERE build_id = $1 AND seed_index = 0 AND node_id = 'N1'",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(passages[0]["id"], "seed-page");
    let first = statements[0].as_str().unwrap().trim_end_matches('.');
    assert!(
        picked[0].text.contains(first),
        "the summary comes from the page: {first}"
    );
}
