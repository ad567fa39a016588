//! The loopback HTTP server every test fake runs on: bound to an ephemeral 127.0.0.1 port,
//! served on the test's runtime, shut down gracefully when dropped. Tests only.
#![allow(dead_code)]

use std::net::SocketAddr;

pub struct Loopback {
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Loopback {
    pub async fn serve(app: axum::Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Loopback {
            addr,
            shutdown: Some(tx),
        }
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// The prompt a chat-completions request ends with (its last message's content).
pub fn last_message(body: &serde_json::Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Count one call of `kind` in a fake's per-kind tally.
pub fn tally(by_kind: &std::sync::Mutex<std::collections::BTreeMap<String, u64>>, kind: &str) {
    *by_kind.lock().unwrap().entry(kind.to_string()).or_insert(0) += 1;
}

/// An OpenAI chat-completions reply with `content` and the given token usage.
pub fn completion(
    body: &serde_json::Value,
    content: &str,
    prompt_tokens: usize,
    completion_tokens: usize,
) -> serde_json::Value {
    serde_json::json!({
        "id": "x", "object": "chat.completion", "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    })
}
