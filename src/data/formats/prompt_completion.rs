//! Prompt/completion, as TRL's `SFTTrainer` takes it: `{"prompt": "...", "completion": "..."}`
//! becomes one user turn and one assistant turn; TRL's conversational form, where both are lists
//! of `{"role", "content"}` messages, becomes the prompt's messages followed by the completion's.
//!
//! TRL trains only the completion. lora-ft trains every assistant turn, so an assistant turn in
//! the prompt is refused (it would be trained): write such rows as `messages`. The completion
//! holds the assistant's turns only.

use serde_json::{Map, Value};

use super::{type_name, Message};
use crate::data::messages::parse_message;

pub(super) fn parse(row: &Map<String, Value>) -> Result<Vec<Message>, String> {
    let field = |key: &str| match row.get(key) {
        None | Some(Value::Null) => Err(format!("missing {key:?}")),
        Some(value) => Ok(value),
    };
    match (field("prompt")?, field("completion")?) {
        (Value::String(prompt), Value::String(completion)) => {
            Ok(vec![Message::new("user", prompt), Message::new("assistant", completion)])
        }
        (Value::Array(prompt), Value::Array(completion)) => {
            let mut messages = turns("prompt", prompt, &["system", "user"])?;
            if completion.is_empty() {
                return Err(r#""completion" is empty"#.into());
            }
            messages.extend(turns("completion", completion, &["assistant"])?);
            Ok(messages)
        }
        (prompt, completion) => Err(format!(
            r#""prompt" is {} and "completion" {}: both must be strings, or both lists of messages"#,
            type_name(prompt),
            type_name(completion)
        )),
    }
}

/// The messages of `key`, each of a role in `allowed`.
fn turns(key: &str, items: &[Value], allowed: &[&str]) -> Result<Vec<Message>, String> {
    let mut messages = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let message = parse_message(item).map_err(|e| format!("{key}[{i}]: {e}"))?;
        if !allowed.contains(&message.role.as_str()) {
            let why = match key {
                "prompt" => "lora-ft trains every assistant turn, and TRL only the completion: write this row as messages",
                _ => "the completion is what the model says",
            };
            return Err(format!("{key}[{i}]: a {:?} turn in the {key} ({why})", message.role));
        }
        messages.push(message);
    }
    Ok(messages)
}
