//! `orchestrator dashboard`: a read-only web view of runs as they learn. One axum router serves
//! the single-page front end (bundled into the binary at build time: `web/` and the chart
//! library `build.rs` installs from npm) and a JSON API over `infra::db::dashboard`.
//!
//! Access: bound to a loopback address by default; any other address requires a token
//! (`ORCH_DASHBOARD_TOKEN`, 16..=4096 printable ASCII characters), then every route except
//! `/healthz` asks for it as `Authorization: Bearer`, a `rubricem_token` cookie, or once as
//! `?token=` (answered with the cookie so the browser's next requests carry it). Only the
//! token's SHA-256 digest is kept and compared in constant time. Every API reply carries a
//! `Server-Timing` header with the time spent in Postgres.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use wire::token::{MAX_TOKEN_BYTES, MIN_TOKEN_BYTES, TokenDigest, TokenError};

use crate::infra::db::{self, DbError};

/// The environment variable holding the dashboard's access token.
pub const TOKEN_ENV: &str = "ORCH_DASHBOARD_TOKEN";
/// The default address: loopback only.
pub const DEFAULT_BIND: &str = "127.0.0.1:8300";
const COOKIE: &str = "rubricem_token";
/// Most rows a list endpoint returns.
const MAX_ROWS: i64 = 500;

#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("{TOKEN_ENV} is {len} bytes; allowed: {MIN_TOKEN_BYTES}..={MAX_TOKEN_BYTES}")]
    TokenLength { len: usize },
    #[error(
        "{TOKEN_ENV} holds byte {byte:#04x} at offset {at}; allowed: printable ASCII without spaces"
    )]
    TokenByte { at: usize, byte: u8 },
    #[error(
        "--bind = {bind} is not a loopback address and {TOKEN_ENV} is not set: export a token of \
         at least {MIN_TOKEN_BYTES} characters, or bind to 127.0.0.1"
    )]
    Unprotected { bind: SocketAddr },
    #[error("cannot listen on {bind}: {message}")]
    Listen { bind: SocketAddr, message: String },
    #[error("dashboard server failed: {0}")]
    Serve(String),
}

/// The access token, kept only as its SHA-256 digest (`wire::token`); `Debug` prints no part
/// of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(TokenDigest);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

impl Token {
    /// The token of the environment's value (`None` when unset or empty).
    pub fn from_value(value: Option<&str>) -> Result<Option<Self>, DashboardError> {
        let Some(raw) = value.filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        match TokenDigest::new(raw) {
            Ok(d) => Ok(Some(Self(d))),
            Err(TokenError::Length { len }) => Err(DashboardError::TokenLength { len }),
            Err(TokenError::Byte { at, byte }) => Err(DashboardError::TokenByte { at, byte }),
        }
    }

    fn matches(&self, presented: &[u8]) -> bool {
        self.0.matches(presented)
    }
}

/// A dashboard may listen on `bind`: loopback always, any other address only with a token.
pub fn check_bind(bind: SocketAddr, token: Option<&Token>) -> Result<(), DashboardError> {
    if bind.ip().is_loopback() || token.is_some() {
        Ok(())
    } else {
        Err(DashboardError::Unprotected { bind })
    }
}

struct AppState {
    pool: PgPool,
    token: Option<Token>,
}

/// The dashboard's routes over `pool`.
pub fn router(pool: PgPool, token: Option<Token>) -> Router {
    let state = Arc::new(AppState { pool, token });
    Router::new()
        .route("/", get(index))
        .route("/assets/{name}", get(asset))
        .route("/api/runs", get(runs))
        .route("/api/runs/{id}", get(run))
        .route("/api/runs/{id}/metrics", get(metrics))
        .route("/api/runs/{id}/evaluations", get(evaluations))
        .route("/api/runs/{id}/steps/{step}", get(step))
        .route("/api/runs/{id}/buffers", get(buffer_tasks))
        .route("/api/runs/{id}/buffers/{task}", get(buffer))
        .route("/api/runs/{id}/reflections", get(reflections))
        .route("/api/runs/{id}/bank", get(bank))
        .route("/api/experiments/{id}/metric", get(experiment_metric))
        .route("/api/trajectories/{id}", get(trajectory))
        .route("/healthz", get(|| async { "ok" }))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
        .with_state(state)
}

/// Serve `router` on `bind` until `cancel` fires.
pub async fn serve(
    bind: SocketAddr,
    app: Router,
    cancel: CancellationToken,
) -> Result<(), DashboardError> {
    let listener =
        tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| DashboardError::Listen {
                bind,
                message: e.to_string(),
            })?;
    let local = listener.local_addr().unwrap_or(bind);
    tracing::info!(address = %local, "dashboard listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
        .map_err(|e| DashboardError::Serve(e.to_string()))
}

/// The presented token: bearer header, then cookie, then `token=` in the query.
fn presented(req: &Request) -> (Option<Vec<u8>>, bool) {
    if let Some(v) = req.headers().get(header::AUTHORIZATION)
        && let Some(rest) = v.as_bytes().strip_prefix(b"Bearer ")
    {
        return (Some(rest.to_vec()), false);
    }
    for v in req.headers().get_all(header::COOKIE) {
        for part in v.to_str().unwrap_or_default().split(';') {
            if let Some(t) = part.trim().strip_prefix(&format!("{COOKIE}=")) {
                return (Some(t.as_bytes().to_vec()), false);
            }
        }
    }
    let query = req.uri().query().unwrap_or_default();
    for pair in query.split('&') {
        if let Some(t) = pair.strip_prefix("token=") {
            return (Some(t.as_bytes().to_vec()), true);
        }
    }
    (None, false)
}

async fn require_token(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(token) = &s.token else {
        return next.run(req).await;
    };
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    match presented(&req) {
        (Some(t), from_query) if token.matches(&t) => {
            let mut resp = next.run(req).await;
            if from_query {
                // The token travels once in the URL; the cookie carries it from then on.
                let cookie = format!(
                    "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
                    String::from_utf8_lossy(&t)
                );
                if let Ok(v) = HeaderValue::from_str(&cookie) {
                    resp.headers_mut().append(header::SET_COOKIE, v);
                }
            }
            resp
        }
        (Some(_), _) => (
            StatusCode::UNAUTHORIZED,
            "the token is not this dashboard's",
        )
            .into_response(),
        (None, _) => (
            StatusCode::UNAUTHORIZED,
            format!("this dashboard needs its token ({TOKEN_ENV}): open it with ?token=..."),
        )
            .into_response(),
    }
}

/// An API failure: the status and a message, never a panic.
enum ApiError {
    NotFound(String),
    BadRequest(String),
    Db(DbError),
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        Self::Db(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            Self::NotFound(m) => (StatusCode::NOT_FOUND, m),
            Self::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            Self::Db(e) => {
                tracing::warn!(error = %e, "dashboard query failed");
                (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        };
        (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
    }
}

/// A JSON document built by Postgres, sent as is with the time it took.
fn json(body: String, t0: Instant) -> Response {
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut resp = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("db;dur={ms:.2}")) {
        resp.headers_mut().insert("server-timing", v);
    }
    resp
}

fn found(body: Option<String>, what: &str, id: Uuid, t0: Instant) -> Result<Response, ApiError> {
    body.map(|b| json(b, t0))
        .ok_or_else(|| ApiError::NotFound(format!("no {what} {id}")))
}

fn uuid(raw: &str, what: &str) -> Result<Uuid, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::BadRequest(format!("{what} `{raw}` is not a UUID")))
}

async fn runs(State(s): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    Ok(json(db::dashboard::runs(&s.pool).await?, t0))
}

async fn run(State(s): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "run")?;
    found(db::dashboard::run(&s.pool, id).await?, "run", id, t0)
}

#[derive(Debug, Deserialize)]
struct Since {
    #[serde(default)]
    since: Option<i32>,
}

async fn metrics(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<Since>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "run")?;
    let since = q.since.unwrap_or(0);
    if since < 0 {
        return Err(ApiError::BadRequest(format!(
            "since = {since}; allowed: a step >= 0"
        )));
    }
    Ok(json(db::dashboard::metrics(&s.pool, id, since).await?, t0))
}

async fn evaluations(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "run")?;
    Ok(json(db::dashboard::evaluations(&s.pool, id).await?, t0))
}

async fn step(
    State(s): State<Arc<AppState>>,
    Path((id, step)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "run")?;
    let step: i32 =
        step.parse().ok().filter(|s: &i32| *s >= 0).ok_or_else(|| {
            ApiError::BadRequest(format!("step `{step}`; allowed: an integer >= 0"))
        })?;
    Ok(json(db::dashboard::step(&s.pool, id, step).await?, t0))
}

async fn buffer_tasks(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "run")?;
    Ok(json(db::dashboard::buffer_tasks(&s.pool, id).await?, t0))
}

async fn buffer(
    State(s): State<Arc<AppState>>,
    Path((id, task)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "run")?;
    let task = uuid(&task, "task")?;
    Ok(json(db::dashboard::buffer(&s.pool, id, task).await?, t0))
}

async fn reflections(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "run")?;
    Ok(json(
        db::dashboard::reflections(&s.pool, id, MAX_ROWS).await?,
        t0,
    ))
}

#[derive(Debug, Deserialize)]
struct Search {
    #[serde(default)]
    q: String,
}

async fn bank(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<Search>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "run")?;
    if q.q.len() > 500 {
        return Err(ApiError::BadRequest(format!(
            "q is {} bytes; allowed: at most 500",
            q.q.len()
        )));
    }
    Ok(json(
        db::dashboard::bank(&s.pool, id, &q.q, MAX_ROWS).await?,
        t0,
    ))
}

#[derive(Debug, Deserialize)]
struct MetricName {
    #[serde(default)]
    name: Option<String>,
}

async fn experiment_metric(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<MetricName>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "experiment")?;
    let name = q.name.unwrap_or_else(|| "reward/mean".into());
    found(
        db::dashboard::experiment_metric(&s.pool, id, &name).await?,
        "experiment",
        id,
        t0,
    )
}

async fn trajectory(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let id = uuid(&id, "trajectory")?;
    found(
        db::dashboard::trajectory(&s.pool, id).await?,
        "trajectory",
        id,
        t0,
    )
}

/// The front end: our own files from `web/`, the chart library from the npm install
/// `build.rs` made. Nothing is fetched at run time.
const INDEX: &str = include_str!("../../web/index.html");
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../web/app.css"),
    ),
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!(concat!(env!("OUT_DIR"), "/web-vendor/uPlot.iife.min.js")),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!(concat!(env!("OUT_DIR"), "/web-vendor/uPlot.min.css")),
    ),
];

async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'",
            ),
        ],
        INDEX,
    )
        .into_response()
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, mime, body)) => (
            [
                (header::CONTENT_TYPE, *mime),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, format!("no asset {name}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_never_printed() {
        assert!(Token::from_value(None).unwrap().is_none());
        assert!(matches!(
            Token::from_value(Some("short")),
            Err(DashboardError::TokenLength { len: 5 })
        ));
        assert!(matches!(
            Token::from_value(Some("0123456789abcdef ")),
            Err(DashboardError::TokenByte { at: 16, .. })
        ));
        let t = Token::from_value(Some("0123456789abcdef"))
            .unwrap()
            .unwrap();
        assert_eq!(format!("{t:?}"), "Token(***)");
        assert!(t.matches(b"0123456789abcdef") && !t.matches(b"0123456789abcdeF"));
    }

    #[test]
    fn only_loopback_binds_without_a_token() {
        let open: SocketAddr = "0.0.0.0:8300".parse().unwrap();
        let local: SocketAddr = DEFAULT_BIND.parse().unwrap();
        assert!(check_bind(local, None).is_ok());
        let err = check_bind(open, None).unwrap_err().to_string();
        assert!(
            err.contains("0.0.0.0:8300") && err.contains(TOKEN_ENV),
            "{err}"
        );
        let tok = Token::from_value(Some("0123456789abcdef")).unwrap();
        assert!(check_bind(open, tok.as_ref()).is_ok());
    }
}
