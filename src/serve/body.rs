//! A request body read as JSON into a typed request: invalid JSON, a field of the wrong type and
//! a body past `--max-body-bytes` are 400 / 413 errors naming what is wrong, never a panic.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::errors::ApiError;
use super::limits::too_large;

/// The body as JSON (an object), or the error for a body too large or unreadable.
pub fn json_object(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => too_large(),
        status => ApiError::status(status, "invalid_request_error", rejection.body_text()),
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(None, format!("The body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid(None, "The body must be a JSON object."));
    }
    Ok(value)
}

/// `value` as `T`; a field of the wrong type is an error naming it (its path, `messages[1].role`).
pub fn typed<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let inner = e.into_inner().to_string();
        let message = match &param {
            Some(p) => format!("{p}: {inner}"),
            None => inner,
        };
        ApiError { param, ..ApiError::invalid(None, message) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Body {
        temperature: Option<f64>,
        messages: Option<Vec<Inner>>,
    }
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        role: String,
    }

    #[test]
    fn a_wrong_type_names_its_field() {
        let e = typed::<Body>(&serde_json::json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = typed::<Body>(&serde_json::json!({"messages": [{"role": 3}]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
    }

    #[test]
    fn bad_json_and_non_objects_are_400() {
        let e = json_object(Ok(Bytes::from_static(b"{\"model\": "))).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param, None);
        assert!(json_object(Ok(Bytes::from_static(b"[1]"))).is_err());
        assert!(json_object(Ok(Bytes::from_static(b"{}"))).is_ok());
    }
}
