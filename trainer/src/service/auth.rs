//! Bearer-token authentication of `trainer serve`. On loopback no token is needed; bound to any
//! other address the server refuses to start unless `TRAINER_API_TOKEN` holds one
//! ([`check_bind`]). With a token every route except `GET /health` requires
//! `Authorization: Bearer <token>` and answers 401 otherwise. Only the token's SHA-256 digest
//! is kept, and a presented token is compared by digest in constant time, so neither the
//! comparison's timing nor a debug print reveals it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use wire::token::{TokenDigest, TokenError};

use super::{ApiError, AppState};

/// The environment variable that holds the token (the orchestrator's trainer client reads the
/// same one).
pub const TOKEN_ENV: &str = "TRAINER_API_TOKEN";
pub use wire::token::{MAX_TOKEN_BYTES, MIN_TOKEN_BYTES};
/// The one route answered without a token: supervisors probe it.
pub const OPEN_ROUTE: &str = "/health";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("{TOKEN_ENV} is {len} bytes; allowed: {MIN_TOKEN_BYTES}..={MAX_TOKEN_BYTES}")]
    Length { len: usize },
    #[error(
        "{TOKEN_ENV} holds byte {byte:#04x} at offset {at}; allowed: printable ASCII without \
         spaces (0x21..=0x7e)"
    )]
    Byte { at: usize, byte: u8 },
    #[error(
        "--bind = {bind} is not a loopback address, and {TOKEN_ENV} is not set: export a token \
         of at least {MIN_TOKEN_BYTES} characters there (clients send it as `Authorization: \
         Bearer`), or bind to 127.0.0.1"
    )]
    Unprotected { bind: SocketAddr },
}

/// The API token, kept only as its SHA-256 digest (`wire::token`); `Debug` prints no part of
/// it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken(TokenDigest);

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiToken(***)")
    }
}

impl ApiToken {
    /// A token of `MIN_TOKEN_BYTES..=MAX_TOKEN_BYTES` printable ASCII characters (no spaces).
    pub fn new(raw: &str) -> Result<Self, AuthError> {
        TokenDigest::new(raw).map(Self).map_err(|e| match e {
            TokenError::Length { len } => AuthError::Length { len },
            TokenError::Byte { at, byte } => AuthError::Byte { at, byte },
        })
    }

    /// The token of `TOKEN_ENV`'s value (`None` when unset or empty).
    pub fn from_value(value: Option<&str>) -> Result<Option<Self>, AuthError> {
        match value {
            None | Some("") => Ok(None),
            Some(v) => Self::new(v).map(Some),
        }
    }

    /// Whether `presented` is the token: digests compared in constant time.
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.matches(presented)
    }
}

/// A server on `bind` may start: loopback addresses always, any other only with a token.
pub fn check_bind(bind: SocketAddr, token: Option<&ApiToken>) -> Result<(), AuthError> {
    if bind.ip().is_loopback() || token.is_some() {
        Ok(())
    } else {
        Err(AuthError::Unprotected { bind })
    }
}

/// The credentials of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer(req: &Request) -> Option<&[u8]> {
    let value = req.headers().get(AUTHORIZATION)?.as_bytes();
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ')?;
    Some(&rest[start..])
}

/// The router's outermost layer: with a token configured, every request but `GET /health`
/// must carry it (401 otherwise, before its body is read).
pub(super) async fn require_token(
    State(s): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = &s.cfg.api_token else {
        return next.run(req).await;
    };
    if req.uri().path() == OPEN_ROUTE {
        return next.run(req).await;
    }
    match bearer(&req) {
        Some(presented) if token.matches(presented) => next.run(req).await,
        Some(_) => {
            ApiError::Unauthorized("the bearer token is not this server's".into()).into_response()
        }
        None => ApiError::Unauthorized(format!(
            "this server requires `Authorization: Bearer <token>` (the token in {TOKEN_ENV}) on \
             every route but {OPEN_ROUTE}"
        ))
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_are_checked_and_compared_by_digest() {
        let t = ApiToken::new("0123456789abcdef").unwrap();
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b"0123456789abcdef0"));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "ApiToken(***)");
        assert_eq!(
            ApiToken::new("short").unwrap_err(),
            AuthError::Length { len: 5 }
        );
        let e = ApiToken::new("0123456789 abcdef").unwrap_err().to_string();
        assert!(e.contains("0x20") && e.contains("offset 10"), "{e}");
        assert_eq!(ApiToken::from_value(None).unwrap(), None);
        assert_eq!(ApiToken::from_value(Some("")).unwrap(), None);
        assert!(ApiToken::from_value(Some("x")).is_err());
    }

    #[test]
    fn only_loopback_binds_go_without_a_token() {
        let t = ApiToken::new("0123456789abcdef").unwrap();
        for ok in ["127.0.0.1:8100", "[::1]:8100"] {
            assert!(check_bind(ok.parse().unwrap(), None).is_ok(), "{ok}");
        }
        for open in ["0.0.0.0:8100", "10.1.2.3:8100", "[::]:8100"] {
            let e = check_bind(open.parse().unwrap(), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(open) && e.contains(TOKEN_ENV), "{e}");
            assert!(check_bind(open.parse().unwrap(), Some(&t)).is_ok());
        }
    }
}
