//! `ApiError`: the one error type of `trainer serve`'s handlers. Each variant is an HTTP status;
//! the reply is that status with the JSON body `wire::ErrorBody`,
//! `{"error": {"message": ..., "code": STATUS}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::TrainerError;

/// A request the service refuses or could not serve, with the message the client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or out of range.
    #[error("{0}")]
    BadRequest(String),
    /// 401: the server requires a bearer token and the request has none or another.
    #[error("{0}")]
    Unauthorized(String),
    /// 404: the named model, adapter or checkpoint does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 409: a train step is running, or the policy is not at the expected version.
    #[error("{0}")]
    Conflict(String),
    /// 500: the trainer failed.
    #[error("{0}")]
    Internal(String),
    /// 501: this server was started without what the request needs.
    #[error("{0}")]
    NotImplemented(String),
    /// 503: the server is unhealthy (a step that could not be undone, a stopped generation
    /// worker), so it refuses work until it is restored or restarted.
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::BadRequest(message.into())
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::NotFound(message.into())
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::Conflict(message.into())
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal(message.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The policy mutex was poisoned by a panic while held.
    pub fn poisoned() -> Self {
        Self::internal("policy lock poisoned")
    }
}

/// A trainer failure: a rejected batch is the client's (400), a request that contradicts the
/// held settings a conflict (409), anything else the trainer's (500).
impl From<TrainerError> for ApiError {
    fn from(e: TrainerError) -> Self {
        match e {
            TrainerError::Batch(_) => Self::BadRequest(e.to_string()),
            TrainerError::Mismatch(_) => Self::Conflict(e.to_string()),
            e => Self::Internal(e.to_string()),
        }
    }
}

/// A blocking task that panicked or was cancelled.
impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        Self::Internal(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = wire::ErrorBody::new(status.as_u16(), self.to_string());
        let mut r = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

/// What a handler returns: a typed reply, or a refusal.
pub type ApiResult<T> = std::result::Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_the_trainer_error_mapping() {
        assert_eq!(ApiError::conflict("busy").status(), StatusCode::CONFLICT);
        assert_eq!(
            ApiError::from(TrainerError::Batch("sequence 0: empty".into())),
            ApiError::BadRequest("batch: sequence 0: empty".into())
        );
        assert_eq!(
            ApiError::from(TrainerError::Config("x".into())),
            ApiError::Internal("config: x".into())
        );
        let r = ApiError::NotImplemented("no".into()).into_response();
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
    }

    #[tokio::test]
    async fn the_reply_is_the_status_and_the_json_error_body() {
        let r = ApiError::conflict("a train step is running").into_response();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"error":{"message":"a train step is running","code":409}}"#
        );
    }
}
