//! The service suite of tests/serve.rs against `trainer serve --nproc-per-node 2`: the
//! launcher starts two ranks of this binary (gloo on CPU, one thread each), rank 0 serves HTTP
//! and leads, rank 1 follows. Every test reads the servers through HTTP only, so what passes
//! here is what a client of a two-rank trainer sees: generation, train steps and their 409,
//! LoRA publishing, checkpoint + restart, full-weight publishing and restore, settings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod serve_suite;

use serve_suite::Launch;

serve_suite::suite_tests!(Launch::Ranks(2));

/// Routes that replace the weights of the process they reach (vLLM's adapter load and disk
/// weight update) would change rank 0 alone and leave the ranks training different models:
/// on a group they are refused, naming the ranks and the route that does reach every rank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_weight_replacements_are_refused_on_a_group() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::model_dir(tmp.path());
    let s = serve_suite::start(Launch::Ranks(2), &dir, serve_suite::Opts::default()).await;
    let before = serve_suite::forward_logprobs(&s.url, &[5, 9, 14, 20]).await;
    let (code, e) = serve_suite::post_json(
        &format!("{}/v1/load_lora_adapter", s.url),
        serde_json::json!({"lora_name": "x",
                           "lora_path": tmp.path().join("adapter").display().to_string()}),
    )
    .await;
    assert_eq!(code, 409, "{e}");
    assert!(e.to_string().contains("rank 0 of 2 ranks"), "{e}");
    assert!(e.to_string().contains("/v1/restore"), "{e}");
    let (code, _) = serve_suite::post_json(
        &format!("{}/start_weight_update", s.url),
        serde_json::json!({}),
    )
    .await;
    assert_eq!(code, 200);
    let model = std::fs::canonicalize(&dir).unwrap().display().to_string();
    let (code, e) = serve_suite::post_json(
        &format!("{}/update_weights", s.url),
        serde_json::json!({"update_info": {"path": model}}),
    )
    .await;
    assert_eq!(code, 400, "{e}");
    assert!(e.to_string().contains("rank 0 of 2 ranks"), "{e}");
    assert_eq!(
        serve_suite::forward_logprobs(&s.url, &[5, 9, 14, 20]).await,
        before,
        "a refused replacement changed nothing"
    );
}

/// A batch is validated whole on rank 0 before any rank sees a share of it: batches with a
/// bad part (a token outside the vocabulary; a counted token of a stage without an advantage)
/// are refused, by the dry run with the same message, and leave every rank as it was. The
/// group then trains two good steps (a rank left holding a share would hang the next
/// collective) and ends with the adapter one process gets from the same good steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_reaches_no_rank_and_the_group_trains_on_in_step() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = common::model_dir(tmp.path());
    let opts = |ck: &str| serve_suite::Opts {
        lora: true,
        checkpoint_dir: Some(tmp.path().join(ck)),
        ..serve_suite::Opts::default()
    };
    let group = serve_suite::start(Launch::Ranks(2), &dir, opts("group")).await;
    let one = serve_suite::start(Launch::InProcess, &dir, opts("one")).await;
    let xs = serve_suite::seqs(4, 20);
    let good = serve_suite::batch(&group.url, &xs, &[1.0, -1.0, 0.5, -0.5]).await;
    let mut bad_token = good.clone();
    bad_token.seqs[3].tokens[3] = 100_000;
    // Two stage advantages (stages 0 and 1) where the counted tokens are stage 3's.
    let mut bad_stage = good.clone();
    bad_stage.seqs[2].advantages = vec![0.5, -0.5];
    for (bad, what) in [(bad_token, "100000"), (bad_stage, "stage 3")] {
        let (dry, e1) = serve_suite::post_batch_query(&group.url, "dry_run=true", &bad).await;
        let (real, e2) = serve_suite::post_batch_query(&group.url, "expect_version=0", &bad).await;
        assert_eq!((dry, real), (400, 400), "{what}: {e1} / {e2}");
        assert_eq!(e1["error"]["message"], e2["error"]["message"]);
        assert!(e2.to_string().contains(what), "{e2}");
    }
    for v in 0..2 {
        for s in [&group, &one] {
            let (code, r) =
                serve_suite::post_batch_query(&s.url, &format!("expect_version={v}"), &good).await;
            assert_eq!(code, 200, "{r}");
        }
    }
    let a = serve_suite::adapter(&serve_suite::checkpoint(&group.url).await);
    let b = serve_suite::adapter(&serve_suite::checkpoint(&one.url).await);
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let d = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(d < 1e-5, "{name}: two ranks and one process differ by {d}");
    }
}
