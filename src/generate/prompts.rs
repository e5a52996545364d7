//! `lora-ft generate`'s prompts file: JSON Lines, each a chat prompt (`messages`, with `tools`
//! where the row has them, as `data.eval_prompts`) or a raw text prompt (`prompt`, as the
//! completions `prompt` of vLLM and OpenAI). A row is one or the other; every bad line is an
//! error naming `file:line` and the field.

use std::io::BufRead;
use std::path::Path;

use anyhow::Context;
use serde_json::Value as Json;

use crate::data::{Conversation, LineError};

/// One prompt of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Rendered with the chat template; tool calls are parsed out of its replies.
    Chat(Conversation),
    /// Tokenized as it is (`text_prompt_ids`) and continued without the chat template.
    Text { text: String, line: usize },
}

impl Prompt {
    /// The (1-based) line of the prompts file it came from.
    pub fn line(&self) -> usize {
        match self {
            Prompt::Chat(c) => c.line,
            Prompt::Text { line, .. } => *line,
        }
    }

    /// Parses one row; the error names the field, without `file:line`.
    pub fn parse(row: &str, line: usize) -> Result<Self, String> {
        let json: Json = serde_json::from_str(row).map_err(|e| format!("invalid JSON: {e}"))?;
        let Json::Object(map) = &json else {
            return Err(
                r#"expected an object with "messages" (a chat prompt) or "prompt" (a text prompt)"#.into()
            );
        };
        match (map.get("messages"), map.get("prompt")) {
            (Some(_), Some(_)) => Err(
                r#""messages" and "prompt" in one row: a row is a chat prompt ("messages") or a text prompt ("prompt"), not both"#
                    .into(),
            ),
            (None, None) => Err(
                r#"no "messages" or "prompt": a row is a chat prompt ("messages") or a text prompt ("prompt")"#.into(),
            ),
            (Some(_), None) => {
                let conversation = Conversation::parse_prompt(row)?;
                Ok(Prompt::Chat(Conversation { line, ..conversation }))
            }
            (None, Some(Json::String(text))) if text.is_empty() => Err(r#""prompt" is empty"#.into()),
            (None, Some(Json::String(text))) => match map.get("tools") {
                Some(_) => Err(r#""tools" on a text prompt: tools go with "messages" (the chat template renders them)"#
                    .into()),
                None => Ok(Prompt::Text { text: text.clone(), line }),
            },
            (None, Some(other)) => Err(format!(r#""prompt" must be a string (got {})"#, kind(other))),
        }
    }
}

/// A JSON value's kind, for errors.
fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// Reads every prompt of a prompts file. Blank lines are skipped; any other line that is not a
/// chat or text prompt is an error naming `file:line`.
pub fn read_prompts(path: &Path) -> anyhow::Result<Vec<Prompt>> {
    let file = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut prompts = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let prompt = Prompt::parse(&line, i + 1).map_err(|message| LineError {
            file: path.to_path_buf(),
            line: i + 1,
            message,
        })?;
        prompts.push(prompt);
    }
    anyhow::ensure!(!prompts.is_empty(), "{}: no prompts", path.display());
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, rows: &[&str]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("lora-ft-prompts-{}-{name}.jsonl", std::process::id()));
        std::fs::write(&path, rows.join("\n") + "\n").unwrap();
        path
    }

    /// Chat and text rows in one file, each with its line; blank lines skipped.
    #[test]
    fn chat_and_text_rows_are_read_with_their_lines() {
        let chat = r#"{"messages": [{"role": "user", "content": "Where is my order?"}], "id": "a"}"#;
        let text = r#"{"prompt": "Once upon a time", "id": "b"}"#;
        let path = file("mixed", &[chat, "", text]);
        let prompts = read_prompts(&path).unwrap();
        assert_eq!(prompts.len(), 2);
        match &prompts[0] {
            Prompt::Chat(c) => {
                assert_eq!((c.line, c.messages[0].content.as_str()), (1, "Where is my order?"))
            }
            other => panic!("a chat prompt expected: {other:?}"),
        }
        assert_eq!(prompts[1], Prompt::Text { text: "Once upon a time".into(), line: 3 });
        assert_eq!(prompts[1].line(), 3);
        std::fs::remove_file(&path).ok();
    }

    /// Each bad row is refused naming `file:line` and the field.
    #[test]
    fn bad_rows_name_their_line_and_field() {
        let good = r#"{"prompt": "hi"}"#;
        let cases = [
            (
                r#"{"prompt": "hi", "messages": [{"role": "user", "content": "u"}]}"#,
                r#""messages" and "prompt" in one row: a row is a chat prompt ("messages") or a text prompt ("prompt"), not both"#,
            ),
            (
                r#"{"id": 3}"#,
                r#"no "messages" or "prompt": a row is a chat prompt ("messages") or a text prompt ("prompt")"#,
            ),
            (r#"{"prompt": ["a", "b"]}"#, r#""prompt" must be a string (got an array)"#),
            (r#"{"prompt": 7}"#, r#""prompt" must be a string (got a number)"#),
            (r#"{"prompt": ""}"#, r#""prompt" is empty"#),
            (
                r#"{"prompt": "hi", "tools": []}"#,
                r#""tools" on a text prompt: tools go with "messages" (the chat template renders them)"#,
            ),
            (r#"{"messages": 3}"#, r#"expected a "messages" array"#),
            (
                r#"["prompt"]"#,
                r#"expected an object with "messages" (a chat prompt) or "prompt" (a text prompt)"#,
            ),
        ];
        for (i, (row, message)) in cases.iter().enumerate() {
            let path = file(&format!("bad{i}"), &[good, row]);
            let err = format!("{:#}", read_prompts(&path).unwrap_err());
            assert_eq!(err, format!("{}:2: {message}", path.display()));
            std::fs::remove_file(&path).ok();
        }
    }
}
