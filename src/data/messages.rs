//! The `messages` JSONL format of OpenAI and Hugging Face: one conversation per line,
//! `{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}`.
//! Every malformed line is an error naming `file:line`, never a silently skipped row.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;

const ROLES: [&str; 3] = ["system", "user", "assistant"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// One conversation and the (1-based) line it came from, so later errors can name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub line: usize,
}

/// A problem with one line of a data file.
#[derive(Debug, thiserror::Error)]
#[error("{}:{line}: {message}", file.display())]
pub struct LineError {
    pub file: PathBuf,
    pub line: usize,
    pub message: String,
}

/// Reads every conversation of a `messages` JSONL file. Blank lines are skipped; anything else
/// that is not a valid conversation with at least one assistant turn is an error.
pub fn read_messages_jsonl(path: &Path) -> anyhow::Result<Vec<Conversation>> {
    let file = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut conversations = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let messages = parse_line(&line).map_err(|message| LineError {
            file: path.to_path_buf(),
            line: i + 1,
            message,
        })?;
        conversations.push(Conversation { messages, line: i + 1 });
    }
    anyhow::ensure!(!conversations.is_empty(), "{}: no conversations", path.display());
    Ok(conversations)
}

pub(super) fn parse_line(line: &str) -> Result<Vec<Message>, String> {
    let row: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(Value::Array(items)) = row.get("messages") else {
        return Err(r#"expected a "messages" array"#.into());
    };
    if items.is_empty() {
        return Err(r#""messages" is empty"#.into());
    }
    let messages =
        items.iter().enumerate().map(|(i, m)| parse_message(m).map_err(|e| format!("messages[{i}]: {e}")));
    let messages = messages.collect::<Result<Vec<_>, _>>()?;
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err("conversation has no assistant turn to train on".into());
    }
    Ok(messages)
}

pub(super) fn parse_message(value: &Value) -> Result<Message, String> {
    let Value::Object(map) = value else {
        return Err(r#"expected an object with "role" and "content""#.into());
    };
    // Keys such as OpenAI's "weight" or "tool_calls" would change what is trained; rejecting
    // them beats silently ignoring them.
    if let Some(key) = map.keys().find(|k| *k != "role" && *k != "content") {
        return Err(format!(r#"unsupported key {key:?} (a message has only "role" and "content")"#));
    }
    let role = match map.get("role") {
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
        Some(Value::String(r)) => {
            return Err(format!("unknown role {r:?} (expected system, user or assistant)"))
        }
        Some(_) => return Err(r#""role" must be a string"#.into()),
        None => return Err(r#"missing "role""#.into()),
    };
    let content = match map.get("content") {
        Some(Value::String(c)) => c.clone(),
        Some(_) => return Err(r#""content" must be a string"#.into()),
        None => return Err(r#"missing "content""#.into()),
    };
    Ok(Message { role, content })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(line: &str) -> String {
        parse_line(line).unwrap_err()
    }

    #[test]
    fn parses_multi_turn_conversation() {
        let line = r#"{"id": 7, "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi 👋"}]}"#;
        let m = parse_line(&line.replace('\n', " ")).unwrap();
        assert_eq!(
            m,
            vec![
                Message::new("system", "s"),
                Message::new("user", "héllo"),
                Message::new("assistant", "hi 👋")
            ]
        );
    }

    #[test]
    fn a_missing_data_file_is_named() {
        let err = format!("{:#}", read_messages_jsonl(Path::new("datasets/no-such.jsonl")).unwrap_err());
        assert!(err.starts_with("datasets/no-such.jsonl: cannot open: No such file"), "{err}");
    }

    #[test]
    fn malformed_rows_say_what_is_wrong() {
        assert!(error_of("{not json").starts_with("invalid JSON:"));
        assert_eq!(error_of(r#"{"conversation": []}"#), r#"expected a "messages" array"#);
        assert_eq!(error_of(r#"[1, 2]"#), r#"expected a "messages" array"#);
        assert_eq!(error_of(r#"{"messages": []}"#), r#""messages" is empty"#);
        assert_eq!(
            error_of(r#"{"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]}"#),
            r#"messages[1]: unknown role "bot" (expected system, user or assistant)"#
        );
        assert_eq!(
            error_of(r#"{"messages": [{"role": "assistant", "content": ["a"]}]}"#),
            r#"messages[0]: "content" must be a string"#
        );
        assert_eq!(error_of(r#"{"messages": [{"role": "assistant"}]}"#), r#"messages[0]: missing "content""#);
        assert_eq!(
            error_of(r#"{"messages": [{"role": "assistant", "content": "a", "weight": 0}]}"#),
            r#"messages[0]: unsupported key "weight" (a message has only "role" and "content")"#
        );
        assert_eq!(
            error_of(r#"{"messages": [{"role": "user", "content": "a"}]}"#),
            "conversation has no assistant turn to train on"
        );
    }
}
