//! Alpaca: `{"instruction", "input", "output", "system"}` (Stanford Alpaca's alpaca_data fields;
//! `system` as LLaMA-Factory's alpaca format has it). One exchange, rendered by the model's own
//! chat template rather than Alpaca's "### Instruction:" prompt:
//!
//! - system: `system`, when present and not empty;
//! - user: `instruction`, then a blank line and `input` when `input` is present and not empty
//!   (`"{instruction}\n\n{input}"`: Stanford Alpaca's prompt separates its instruction and input
//!   sections by a blank line; LLaMA-Factory joins them with a single "\n"); an empty
//!   `instruction` leaves `input` alone;
//! - assistant: `output`.
//!
//! LLaMA-Factory's `history` (earlier `[instruction, output]` pairs) is refused rather than
//! dropped: write such rows as `messages` or `sharegpt`.

use serde_json::{Map, Value};

use super::fields::{optional_str, required_str};
use crate::data::Message;

pub(super) fn parse(row: &Map<String, Value>) -> Result<Vec<Message>, String> {
    let instruction = required_str(row, "instruction")?;
    let input = optional_str(row, "input")?;
    let output = required_str(row, "output")?;
    let system = optional_str(row, "system")?;
    match row.get("history") {
        None | Some(Value::Null) => {}
        Some(Value::Array(h)) if h.is_empty() => {}
        Some(_) => {
            return Err(r#""history" (earlier turns) is not supported in alpaca rows: write multi-turn rows as messages or sharegpt"#.into())
        }
    }
    if instruction.is_empty() && input.is_none() {
        return Err(r#""instruction" is empty and there is no "input": the user turn would be empty"#.into());
    }
    let user = match input {
        Some(input) if instruction.is_empty() => input.to_string(),
        Some(input) => format!("{instruction}\n\n{input}"),
        None => instruction.to_string(),
    };
    let mut messages = Vec::with_capacity(3);
    if let Some(system) = system {
        messages.push(Message::new("system", system));
    }
    messages.push(Message::new("user", &user));
    messages.push(Message::new("assistant", output));
    Ok(messages)
}
