//! browse_webpage against a local server: the SSRF guard refuses 127.0.0.1, 10.0.0.0/8,
//! 169.254.169.254 and redirects into them (before any packet is sent to a refused address);
//! an allow-listed server is fetched with size and time limits and HTML turned into text.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::time::Duration;

use axum::Router;
use axum::response::{Html, IntoResponse, Redirect};
use axum::routing::get;
use orchestrator::infra::tools::browse::{BrowseError, Browser};
use orchestrator::infra::tools::ssrf::AddressGuard;

/// A server on 127.0.0.2 (loopback, but a different address from 127.0.0.1).
async fn server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new()
        .route("/page", get(|| async { Html("<html><head><title>Tn5</title></head><body><p>Tn5 inserts adapters.</p></body></html>") }))
        .route("/redir-ok", get(move || async move { Redirect::temporary(&format!("http://127.0.0.2:{port}/page")) }))
        .route("/redir-loopback", get(move || async move { Redirect::temporary(&format!("http://127.0.0.1:{port}/page")) }))
        .route("/redir-localhost", get(move || async move { Redirect::temporary(&format!("http://localhost:{port}/page")) }))
        .route("/redir-metadata", get(|| async { Redirect::temporary("http://169.254.169.254/latest/meta-data/") }))
        .route("/redir-private", get(|| async { Redirect::temporary("http://10.0.0.1/admin") }))
        .route("/loop", get(|| async { Redirect::temporary("/loop") }))
        .route("/big", get(|| async { "x".repeat(3_000_000).into_response() }))
        .route("/slow", get(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            "late"
        }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

fn allowed() -> Browser {
    Browser::new(
        AddressGuard::new(vec!["127.0.0.2/32".parse().unwrap()]),
        1_000_000,
        Duration::from_secs(2),
    )
    .unwrap()
}

fn refused(r: Result<orchestrator::infra::tools::browse::Page, BrowseError>) -> String {
    match r {
        Err(BrowseError::Guard(e)) => e.to_string(),
        other => panic!("expected a guard refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn default_guard_refuses_loopback_private_and_metadata() {
    let port = server().await;
    let b = Browser::new(AddressGuard::new(vec![]), 1_000_000, Duration::from_secs(2)).unwrap();
    let e = refused(
        b.fetch(&format!("http://127.0.0.1:{port}/page"), None)
            .await,
    );
    assert!(e.contains("127.0.0.1") && e.contains("loopback"), "{e}");
    refused(
        b.fetch(&format!("http://127.0.0.2:{port}/page"), None)
            .await,
    );
    let e = refused(b.fetch("http://10.0.0.1/", None).await);
    assert!(e.contains("private"), "{e}");
    let e = refused(
        b.fetch("http://169.254.169.254/latest/meta-data/", None)
            .await,
    );
    assert!(e.contains("link-local"), "{e}");
    refused(
        b.fetch(&format!("http://localhost:{port}/page"), None)
            .await,
    );
    refused(
        b.fetch(&format!("http://[::ffff:127.0.0.1]:{port}/page"), None)
            .await,
    );
    assert!(matches!(
        b.fetch("file:///etc/passwd", None).await,
        Err(BrowseError::Guard(_))
    ));
}

#[tokio::test]
async fn allow_listed_server_is_fetched_and_converted() {
    let port = server().await;
    let b = allowed();
    let page = b
        .fetch(&format!("http://127.0.0.2:{port}/page"), None)
        .await
        .unwrap();
    assert_eq!(page.title.as_deref(), Some("Tn5"));
    assert_eq!(
        page.text, "Tn5 inserts adapters.",
        "the head (title) is not body text"
    );
    let page = b
        .fetch(
            &format!("http://127.0.0.2:{port}/redir-ok"),
            Some("adapters"),
        )
        .await
        .unwrap();
    assert!(page.final_url.ends_with("/page"));
}

#[tokio::test]
async fn redirects_into_refused_addresses_are_refused() {
    let port = server().await;
    let b = allowed();
    for path in [
        "redir-loopback",
        "redir-localhost",
        "redir-metadata",
        "redir-private",
    ] {
        let r = b
            .fetch(&format!("http://127.0.0.2:{port}/{path}"), None)
            .await;
        assert!(matches!(r, Err(BrowseError::Guard(_))), "{path}: {r:?}");
    }
    let r = b
        .fetch(&format!("http://127.0.0.2:{port}/loop"), None)
        .await;
    assert!(
        matches!(r, Err(BrowseError::Fetch { .. })),
        "redirect loop is capped: {r:?}"
    );
}

#[tokio::test]
async fn size_and_time_limits() {
    let port = server().await;
    let b = allowed();
    let page = b
        .fetch(&format!("http://127.0.0.2:{port}/big"), None)
        .await
        .unwrap();
    assert!(page.truncated);
    let r = b
        .fetch(&format!("http://127.0.0.2:{port}/slow"), None)
        .await;
    assert!(matches!(r, Err(BrowseError::Timeout { .. })), "{r:?}");
    let r = b.fetch("not a url", None).await;
    assert!(matches!(r, Err(BrowseError::Url { .. })), "{r:?}");
}

#[tokio::test]
async fn as_a_tool_the_page_is_a_snippet_and_a_refusal_is_tool_output() {
    use orchestrator::infra::tools::runner::{ToolArgs, ToolLimits, ToolRunner};
    let port = server().await;
    let mut runner = ToolRunner::new(None);
    runner.register(
        "browse_webpage",
        std::sync::Arc::new(allowed()),
        ToolLimits::default(),
    );
    let call = |url: String| ToolArgs {
        query: url,
        attrs: Default::default(),
    };
    let ok = runner
        .run(
            "browse_webpage",
            call(format!("http://127.0.0.2:{port}/page")),
        )
        .await;
    assert_eq!(ok.error, None);
    assert_eq!(ok.snippets[0].title, "Tn5");
    assert_eq!(ok.snippets[0].text, "Tn5 inserts adapters.");
    let no = runner
        .run(
            "browse_webpage",
            call(format!("http://127.0.0.1:{port}/page")),
        )
        .await;
    assert!(no.snippets.is_empty());
    assert!(no.output_text.contains("127.0.0.1"), "{}", no.output_text);
}
