//! Dataset formats (`[data] format`) and file kinds, each row turned into the `Conversation` that
//! the chat template renders. One file per format, one per file kind:
//!
//! | format | a row | becomes |
//! |---|---|---|
//! | `messages` | `{"messages": [{"role", "content"}, ...]}` | itself (`super::messages`) |
//! | `sharegpt` | `{"conversations": [{"from", "value"}, ...], "system"?}` | `sharegpt.rs` |
//! | `alpaca` | `{"instruction", "input"?, "output", "system"?}` | `alpaca.rs` |
//! | `prompt_completion` | `{"prompt", "completion"}`, strings or message lists (TRL) | `prompt_completion.rs` |
//! | `auto` | any of the above, told apart by the first row's keys | |
//!
//! A file ending in `.parquet` is read as Parquet (`parquet.rs`: one row per record, the same keys
//! as columns, lists of structs for message lists); any other as JSON Lines (`jsonl.rs`: one
//! object per line, blank lines skipped). A malformed row is an error naming `file:line`
//! (Parquet: `file:row_group:row`, both from 0 as pyarrow counts them) and what is wrong with it.

mod alpaca;
mod jsonl;
mod parquet;
mod prompt_completion;
mod sharegpt;

use std::path::Path;

use serde_json::{Map, Value};

use super::{Conversation, Message};
use crate::config::DataFormat;

/// Reads every conversation of `path` in `format`; the file kind comes from the extension.
pub fn read_conversations(path: &Path, format: DataFormat) -> anyhow::Result<Vec<Conversation>> {
    let mut rows = RowParser { format };
    let conversations =
        if is_parquet(path) { parquet::read(path, &mut rows)? } else { jsonl::read(path, &mut rows)? };
    anyhow::ensure!(!conversations.is_empty(), "{}: no conversations", path.display());
    Ok(conversations)
}

/// Whether `path` is read as Parquet (`.parquet`, any case); everything else is JSON Lines.
pub fn is_parquet(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// How a row is named once read: `file:line` for JSON Lines; for Parquet, where `line` counts
/// the file's rows from 1, `file:row N` with N from 0 (as the read errors and pyarrow count).
pub fn row_name(path: &Path, line: usize) -> String {
    if is_parquet(path) {
        format!("{}:row {}", path.display(), line.saturating_sub(1))
    } else {
        format!("{}:{line}", path.display())
    }
}

/// A conversation of plain turns (no tools).
fn conversation(messages: Vec<Message>, line: usize) -> Result<Conversation, String> {
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err("conversation has no assistant turn to train on".into());
    }
    Ok(Conversation { messages, tools: None, line })
}

/// Turns rows into conversations; `auto` settles on a format at the first row.
struct RowParser {
    format: DataFormat,
}

impl RowParser {
    /// `row` parsed from `text`, its JSON with the keys in file (or schema) order, which is what
    /// the `messages` reader reads: templates print tool arguments in that order.
    fn parse(&mut self, row: &Value, text: &str, line: usize) -> Result<Conversation, String> {
        if self.format == DataFormat::Auto {
            self.format = detect(row)?;
        }
        match self.format {
            DataFormat::Messages => Conversation::parse(text, line),
            DataFormat::ShareGpt => conversation(sharegpt::parse(object(row, "a ShareGPT row")?)?, line),
            DataFormat::Alpaca => conversation(alpaca::parse(object(row, "an alpaca row")?)?, line),
            DataFormat::PromptCompletion => {
                prompt_completion::parse(object(row, "a prompt/completion row")?, line)
            }
            DataFormat::Auto => unreachable!("settled above"),
        }
    }
}

/// The format of `format = "auto"`, from the keys of the first row.
fn detect(row: &Value) -> Result<DataFormat, String> {
    let has = |key: &str| row.get(key).is_some_and(|v| !v.is_null());
    let found: Vec<(DataFormat, &str)> = [
        (DataFormat::Messages, has("messages"), r#""messages""#),
        (DataFormat::ShareGpt, has("conversations"), r#""conversations""#),
        (DataFormat::Alpaca, has("instruction") && has("output"), r#""instruction" and "output""#),
        (DataFormat::PromptCompletion, has("prompt") && has("completion"), r#""prompt" and "completion""#),
    ]
    .into_iter()
    .filter_map(|(format, present, keys)| present.then_some((format, keys)))
    .collect();
    match found.as_slice() {
        [(format, _)] => Ok(*format),
        [] => Err(r#"format = "auto" found none of "messages" (messages), "conversations" (sharegpt), "instruction" and "output" (alpaca), "prompt" and "completion" (prompt_completion) in the first row"#.into()),
        many => {
            let keys: Vec<&str> = many.iter().map(|(_, k)| *k).collect();
            Err(format!(r#"format = "auto" cannot tell the format: the first row has {}; set data.format"#, keys.join(" and also ")))
        }
    }
}

fn object<'a>(row: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    row.as_object().ok_or_else(|| format!("expected {what}: a JSON object"))
}

/// An optional string field: absent, null or "" are all `None`.
fn optional_str<'a>(row: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    match row.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!("{key:?} must be a string, not {}", type_name(other))),
    }
}

/// A required string field (may be empty).
fn required_str<'a>(row: &'a Map<String, Value>, key: &str) -> Result<&'a str, String> {
    match row.get(key) {
        None | Some(Value::Null) => Err(format!("missing {key:?}")),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("{key:?} must be a string, not {}", type_name(other))),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
