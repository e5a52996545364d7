//! `--max-body-bytes` checked from a request's `Content-Length` before its body is read: a body
//! declared too large is a 413 at once (a client that sent `Expect: 100-continue` never sends
//! it). A body without a length is cut off by the router's body limit as it is read.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::errors::ApiError;
use super::state::AppState;

/// The error of a body past the limit.
pub fn too_large() -> ApiError {
    ApiError::status(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "The request body is larger than this server takes (--max-body-bytes).",
    )
}

/// Refuses a request whose `Content-Length` is past the limit.
pub async fn refuse_large_bodies(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.options.max_body_bytes as u64) {
        return too_large().into_response();
    }
    next.run(request).await
}
