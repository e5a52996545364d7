//! Prompt/completion, as TRL's `SFTTrainer` takes it: `{"prompt": "...", "completion": "..."}`
//! becomes one user turn and one assistant turn; TRL's conversational form, where both are lists
//! of messages, becomes the prompt's messages followed by the completion's, read as a `messages`
//! row (so a `tools` key and assistant `tool_calls` work as there).
//!
//! TRL trains only the completion. lora-ft trains every assistant turn, so an assistant turn in
//! the prompt is refused (it would be trained): write such rows as `messages`. The completion
//! holds assistant turns (and tool results between them, which are not trained).

use serde_json::{json, Map, Value};

use super::fields::{conversation, type_name};
use crate::data::{Conversation, Message};

pub(super) fn parse(row: &Map<String, Value>, line: usize) -> Result<Conversation, String> {
    let field = |key: &str| match row.get(key) {
        None | Some(Value::Null) => Err(format!("missing {key:?}")),
        Some(value) => Ok(value),
    };
    match (field("prompt")?, field("completion")?) {
        (Value::String(prompt), Value::String(completion)) => {
            conversation(vec![Message::new("user", prompt), Message::new("assistant", completion)], line)
        }
        (Value::Array(prompt), Value::Array(completion)) => {
            if completion.is_empty() {
                return Err(r#""completion" is empty"#.into());
            }
            check_roles("prompt", prompt, &["assistant"])?;
            check_roles("completion", completion, &["system", "user"])?;
            // Re-serialized, so objects' keys come sorted (serde_json's map), not in the row's order.
            let mut messages = json!({"messages": prompt.iter().chain(completion).collect::<Vec<_>>()});
            if let Some(tools) = row.get("tools").filter(|t| !t.is_null()) {
                messages["tools"] = tools.clone();
            }
            Conversation::parse(&messages.to_string(), line).map_err(|e| rename(e, prompt.len()))
        }
        (prompt, completion) => Err(format!(
            r#""prompt" is {} and "completion" {}: both must be strings, or both lists of messages"#,
            type_name(prompt),
            type_name(completion)
        )),
    }
}

/// Refuses a turn of a role in `refused` (only where the role is a string: anything else is the
/// `messages` reader's to name).
fn check_roles(key: &str, items: &[Value], refused: &[&str]) -> Result<(), String> {
    for (i, item) in items.iter().enumerate() {
        let Some(role) = item.get("role").and_then(Value::as_str).filter(|r| refused.contains(r)) else {
            continue;
        };
        let why = match key {
            "prompt" => {
                "lora-ft trains every assistant turn, and TRL only the completion: write this row as messages"
            }
            _ => "the completion is what the model says",
        };
        return Err(format!("{key}[{i}]: a {role:?} turn in the {key} ({why})"));
    }
    Ok(())
}

/// The `messages` reader's `messages[i]: ...` as `prompt[i]` or `completion[j]`.
fn rename(error: String, prompt_len: usize) -> String {
    let Some((index, rest)) = error.strip_prefix("messages[").and_then(|e| e.split_once(']')) else {
        return error;
    };
    match index.parse::<usize>() {
        Ok(i) if i < prompt_len => format!("prompt[{i}]{rest}"),
        Ok(i) => format!("completion[{}]{rest}", i - prompt_len),
        Err(_) => error,
    }
}
