//! Errors as OpenAI's API answers them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`, which the `openai` client turns into
//! `BadRequestError`, `AuthenticationError`, `NotFoundError`, ... with `param` and `code` kept.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// One failed request: what the client is told.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault (`temperature`, `messages[2].content`), where one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: a field with a wrong type or a value out of range (`param` names it).
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// 400 naming `param`.
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(Some(param), message)
    }

    /// 404 for a `model` that is neither the base nor a loaded adapter.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist (GET /v1/models lists the models served)."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 401: a missing or wrong `Authorization: Bearer` key.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect or missing API key: send `Authorization: Bearer KEY` with the server's \
                      --api-key."
                .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// Another status with a message, no field.
    pub fn status(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None }
    }

    /// 500: the engine failed; the request's fault is not known.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The error object, as the body and as a streamed event carry it.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!("{}: {}", self.status, self.message);
        }
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_has_openais_shape() {
        let e = ApiError::field("temperature", "temperature must be >= 0");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body(),
            json!({"error": {"message": "temperature must be >= 0", "type": "invalid_request_error",
                             "param": "temperature", "code": null}})
        );
        let e = ApiError::model_not_found("nope");
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.body()["error"]["code"], "model_not_found");
        assert_eq!(ApiError::unauthorized().status, StatusCode::UNAUTHORIZED);
    }
}
