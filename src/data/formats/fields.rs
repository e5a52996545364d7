//! Reading a row's fields, with errors that name the field and what it held.

use serde_json::{Map, Value};

use crate::data::{Conversation, Message};

/// A conversation of plain turns (no tools).
pub(super) fn conversation(messages: Vec<Message>, line: usize) -> Result<Conversation, String> {
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err("conversation has no assistant turn to train on".into());
    }
    Ok(Conversation { messages, tools: None, line })
}

pub(super) fn object<'a>(row: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    row.as_object().ok_or_else(|| format!("expected {what}: a JSON object"))
}

/// An optional string field: absent, null or "" are all `None`.
pub(super) fn optional_str<'a>(row: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    match row.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!("{key:?} must be a string, not {}", type_name(other))),
    }
}

/// A required string field (may be empty).
pub(super) fn required_str<'a>(row: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    match row.get(key) {
        None | Some(Value::Null) => Err(format!("missing {key:?}")),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("{key:?} must be a string, not {}", type_name(other))),
    }
}

/// "a string", "an array", ... for error messages.
pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
