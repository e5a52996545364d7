//! ShareGPT: `{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}]}`, the
//! format of FastChat's ShareGPT dumps, axolotl's `sharegpt` and LLaMA-Factory's `sharegpt`.
//! `from` maps to the chat roles as axolotl's default role map does: system → system, human and
//! user → user, gpt and assistant → assistant. An optional top-level `system` string (LLaMA-
//! Factory's system column) is a leading system turn. Tool turns (LLaMA-Factory's `function_call`
//! and `observation`, axolotl's `tool`) are refused by name: tool calling is read from `messages`
//! rows (`tool_calls`, `tool` turns).

use serde_json::{Map, Value};

use super::fields::{optional_str, type_name};
use crate::data::Message;

const TOOL_FROMS: [&str; 4] = ["tool", "function_call", "observation", "function"];

pub(super) fn parse(row: &Map<String, Value>) -> Result<Vec<Message>, String> {
    let turns = match row.get("conversations") {
        Some(Value::Array(turns)) => turns,
        None | Some(Value::Null) => return Err(r#"expected a "conversations" array"#.into()),
        Some(other) => return Err(format!(r#""conversations" must be an array, not {}"#, type_name(other))),
    };
    if turns.is_empty() {
        return Err(r#""conversations" is empty"#.into());
    }
    let mut messages = Vec::with_capacity(turns.len() + 1);
    if let Some(system) = optional_str(row, "system")? {
        messages.push(Message::new("system", system));
    }
    for (i, turn) in turns.iter().enumerate() {
        let message = parse_turn(turn).map_err(|e| format!("conversations[{i}]: {e}"))?;
        if message.role == "system" && !messages.is_empty() && i == 0 {
            return Err(
                r#"conversations[0]: a system turn, and also a "system" key: give one of them"#.into()
            );
        }
        messages.push(message);
    }
    Ok(messages)
}

fn parse_turn(turn: &Value) -> Result<Message, String> {
    let Value::Object(map) = turn else {
        return Err(format!(r#"expected an object with "from" and "value", not {}"#, type_name(turn)));
    };
    // Keys such as axolotl's per-turn "weight" change what is trained; refusing them beats
    // silently ignoring them.
    if let Some((key, _)) = map.iter().find(|(k, v)| *k != "from" && *k != "value" && !v.is_null()) {
        return Err(format!(r#"unsupported key {key:?} (a ShareGPT turn has only "from" and "value")"#));
    }
    let role = match map.get("from") {
        Some(Value::String(from)) => match from.as_str() {
            "system" => "system",
            "human" | "user" => "user",
            "gpt" | "assistant" => "assistant",
            tool if TOOL_FROMS.contains(&tool) => {
                return Err(format!(
                    r#""from" {tool:?} is a tool turn, which lora-ft does not read from ShareGPT rows (write tool-calling rows as messages, with tool_calls and tool turns)"#
                ))
            }
            other => {
                return Err(format!(
                    r#"unknown "from" {other:?} (expected system, human, user, gpt or assistant)"#
                ))
            }
        },
        None | Some(Value::Null) => return Err(r#"missing "from""#.into()),
        Some(other) => return Err(format!(r#""from" must be a string, not {}"#, type_name(other))),
    };
    let value = match map.get("value") {
        Some(Value::String(value)) => value,
        None | Some(Value::Null) => return Err(r#"missing "value""#.into()),
        Some(other) => return Err(format!(r#""value" must be a string, not {}"#, type_name(other))),
    };
    Ok(Message::new(role, value))
}
