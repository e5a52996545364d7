//! The `messages` JSONL format of OpenAI and Hugging Face: one conversation per line,
//! `{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}`, and for
//! tool calling a `tools` list beside `messages`, assistant `tool_calls` and `tool` results
//! (src/data/tools.rs). Every malformed line is an error naming `file:line`, never a silently
//! skipped row.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::Context;
use minijinja::value::ValueKind;
use minijinja::Value;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::tools;

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];
const KEYS: [&str; 5] = ["role", "content", "tool_calls", "tool_call_id", "name"];

/// One message as the chat template sees it; the tool fields are absent (not null) when unset,
/// as templates test `'tool_calls' in message` or `message.tool_calls is defined`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// A tool-call turn's null or missing content is "".
    pub content: String,
    /// An assistant's calls as the row has them (key order kept), each with `function.arguments`
    /// an object (a JSON string in the row is parsed); never empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the name of the function that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None, name: None }
    }
}

/// One conversation and the (1-based) line it came from, so later errors can name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    /// The row's `tools`, passed to the template as `apply_chat_template(..., tools=tools)` does;
    /// `None` where the row has none (or `[]`).
    pub tools: Option<Vec<Value>>,
    pub line: usize,
}

impl Conversation {
    /// Parses one line of a `messages` file; the error says what is wrong, without `file:line`.
    pub fn parse(text: &str, line: usize) -> Result<Self, String> {
        let (messages, tools) = parse_line(text)?;
        Ok(Self { messages, tools, line })
    }

    /// Parses one prompt (a row as `read_prompts_jsonl` reads it: ending in the user or tool turn
    /// the model answers, no assistant turn needed); the error says what is wrong.
    pub fn parse_prompt(text: &str) -> Result<Self, String> {
        let (messages, tools) = parse_row(text, Row::Prompt)?;
        Ok(Self { messages, tools, line: 1 })
    }
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
    read_rows(path, |line| parse_row(line, Row::Dialogue))
}

/// Reads a prompts file (`data.eval_prompts`): rows as `read_messages_jsonl` reads them, each
/// ending in a user (or tool) message, the turn the model answers; no assistant turn needed.
pub fn read_prompts_jsonl(path: &Path) -> anyhow::Result<Vec<Conversation>> {
    read_rows(path, |line| parse_row(line, Row::Prompt))
}

fn read_rows(
    path: &Path,
    parse: impl Fn(&str) -> Result<(Vec<Message>, Option<Vec<Value>>), String>,
) -> anyhow::Result<Vec<Conversation>> {
    let file = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut conversations = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let (messages, tools) =
            parse(&line).map_err(|message| LineError { file: path.to_path_buf(), line: i + 1, message })?;
        conversations.push(Conversation { messages, tools, line: i + 1 });
    }
    anyhow::ensure!(!conversations.is_empty(), "{}: no conversations", path.display());
    Ok(conversations)
}

/// What a row is for: a dialogue to train on, or a prompt for the model to answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    Dialogue,
    Prompt,
}

fn parse_line(line: &str) -> Result<(Vec<Message>, Option<Vec<Value>>), String> {
    parse_row(line, Row::Dialogue)
}

fn parse_row(line: &str, kind: Row) -> Result<(Vec<Message>, Option<Vec<Value>>), String> {
    let row: Json = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(Json::Array(items)) = row.get("messages") else {
        return Err(r#"expected a "messages" array"#.into());
    };
    if items.is_empty() {
        return Err(r#""messages" is empty"#.into());
    }
    // The same row with its objects' keys in file order, for what templates print as JSON.
    let ordered: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let attr = |v: &Value, key: &str| v.get_attr(key).map_err(|e| e.to_string());
    let tools = tools::parse_tools(row.get("tools"), attr(&ordered, "tools")?)?;
    let ordered_messages = attr(&ordered, "messages")?;
    let mut messages = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let ordered = ordered_messages.get_item_by_index(i).map_err(|e| e.to_string())?;
        messages.push(parse_message(m, &ordered).map_err(|e| format!("messages[{i}]: {e}"))?);
    }
    check_tool_turns(&messages)?;
    check_call_names(&messages, tools.as_deref())?;
    match kind {
        Row::Dialogue if !messages.iter().any(|m| m.role == "assistant") => {
            return Err("conversation has no assistant turn to train on".into())
        }
        Row::Prompt if !matches!(messages.last(), Some(m) if m.role == "user" || m.role == "tool") => {
            return Err("a prompt must end with a user (or tool) message, the turn the model answers".into())
        }
        _ => {}
    }
    Ok((messages, tools))
}

fn parse_message(value: &Json, ordered: &Value) -> Result<Message, String> {
    let Json::Object(map) = value else {
        return Err(r#"expected an object with "role" and "content""#.into());
    };
    // Keys such as OpenAI's "weight" would change what is trained; rejecting them beats silently
    // ignoring them.
    if let Some(key) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!(
            r#"unsupported key {key:?} (a message has "role" and "content", and for tool calling "tool_calls", "tool_call_id" and "name")"#
        ));
    }
    let role = match map.get("role") {
        Some(Json::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
        Some(Json::String(r)) => {
            return Err(format!("unknown role {r:?} (expected system, user, assistant or tool)"))
        }
        Some(_) => return Err(r#""role" must be a string"#.into()),
        None => return Err(r#"missing "role""#.into()),
    };
    let tool_calls = match map.get("tool_calls") {
        None | Some(Json::Null) => None,
        Some(_) if role != "assistant" => {
            return Err(format!(
                r#""tool_calls" on a {role} message (only an assistant message calls tools)"#
            ))
        }
        Some(calls) => {
            tools::parse_tool_calls(calls, ordered.get_attr("tool_calls").map_err(|e| e.to_string())?)?
        }
    };
    let tool_field = |key: &str| match map.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(_) if role != "tool" => {
            Err(format!(r#""{key}" on a {role} message (only a "tool" message has it)"#))
        }
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(r#""{key}" must be a string (got {})"#, tools::kind(other))),
    };
    let tool_call_id = tool_field("tool_call_id")?;
    let name = tool_field("name")?;
    let content = match map.get("content") {
        Some(Json::String(c)) => c.clone(),
        None | Some(Json::Null) if tool_calls.is_some() => String::new(),
        Some(Json::Null) => {
            return Err(
                r#""content" must be a string (null only on an assistant message with "tool_calls")"#.into()
            )
        }
        Some(_) => return Err(r#""content" must be a string"#.into()),
        None => return Err(r#"missing "content""#.into()),
    };
    Ok(Message { role, content, tool_calls, tool_call_id, name })
}

/// Every `tool` message answers a call of the assistant turn just before it (or before the tool
/// messages answering that turn's other calls), and names one of its ids if it names one.
fn check_tool_turns(messages: &[Message]) -> Result<(), String> {
    // The assistant turn whose calls are being answered, and how many results it has had.
    let mut open: Option<(usize, usize)> = None;
    for (i, m) in messages.iter().enumerate() {
        if let Some(calls) = &m.tool_calls {
            debug_assert!(!calls.is_empty());
            open = Some((i, 0));
            continue;
        }
        if m.role != "tool" {
            open = None;
            continue;
        }
        let Some((turn, answered)) = open.as_mut() else {
            return Err(format!(
                r#"messages[{i}]: a "tool" message must follow an assistant message with "tool_calls" (the result answers a call)"#
            ));
        };
        let calls = messages[*turn].tool_calls.as_deref().unwrap_or_default();
        *answered += 1;
        if *answered > calls.len() {
            return Err(format!(
                "messages[{i}]: more tool results than the {} tool call(s) of messages[{turn}]",
                calls.len()
            ));
        }
        let ids: Vec<String> = calls.iter().filter_map(call_id).collect();
        if let Some(id) = &m.tool_call_id {
            if !ids.is_empty() && !ids.contains(id) {
                return Err(format!(
                    r#"messages[{i}]: "tool_call_id" {id:?} is not the id of a call of messages[{turn}] ({})"#,
                    ids.iter().map(|id| format!("{id:?}")).collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// Every call names one of the row's tools; a row with calls and no `tools` is refused (the
/// model would be trained to call functions it was never shown).
fn check_call_names(messages: &[Message], tools: Option<&[Value]>) -> Result<(), String> {
    let name_of =
        |v: &Value| v.get_attr("function").and_then(|f| f.get_attr("name")).ok().map(|n| n.to_string());
    let names: Vec<String> = tools.unwrap_or_default().iter().filter_map(name_of).collect();
    for (i, m) in messages.iter().enumerate() {
        for (j, call) in m.tool_calls.iter().flatten().enumerate() {
            let name = name_of(call).unwrap_or_default();
            if tools.is_none() {
                return Err(format!(
                    r#"messages[{i}].tool_calls[{j}]: the row has no "tools": a row with tool calls needs "tools", the schemas of the functions it calls (here {name:?})"#
                ));
            }
            if !names.contains(&name) {
                return Err(format!(
                    "messages[{i}].tool_calls[{j}].function.name: {name:?} is not one of the row's tools ({})",
                    names.join(", ")
                ));
            }
        }
    }
    Ok(())
}

fn call_id(call: &Value) -> Option<String> {
    call.get_attr("id").ok().filter(|v| v.kind() == ValueKind::String).map(|v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(line: &str) -> String {
        parse_line(line).unwrap_err()
    }

    fn messages_of(line: &str) -> Vec<Message> {
        parse_line(&line.replace('\n', " ")).unwrap().0
    }

    #[test]
    fn parses_multi_turn_conversation() {
        let line = r#"{"id": 7, "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi 👋"}]}"#;
        let m = messages_of(line);
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
            r#"messages[1]: unknown role "bot" (expected system, user, assistant or tool)"#
        );
        assert_eq!(
            error_of(r#"{"messages": [{"role": "assistant", "content": ["a"]}]}"#),
            r#"messages[0]: "content" must be a string"#
        );
        assert_eq!(error_of(r#"{"messages": [{"role": "assistant"}]}"#), r#"messages[0]: missing "content""#);
        assert_eq!(
            error_of(r#"{"messages": [{"role": "assistant", "content": "a", "weight": 0}]}"#),
            r#"messages[0]: unsupported key "weight" (a message has "role" and "content", and for tool calling "tool_calls", "tool_call_id" and "name")"#
        );
        assert_eq!(
            error_of(r#"{"messages": [{"role": "user", "content": "a"}]}"#),
            "conversation has no assistant turn to train on"
        );
    }

    #[test]
    fn reads_tool_rows_as_transformers_expects_them() {
        let line = r#"{"tools": [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}],
            "messages": [{"role": "user", "content": "Status of 1234?"},
            {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "id": "a1", "function": {"name": "lookup_order", "arguments": "{\"order_id\": \"1234\", \"a\": 1.0}"}}]},
            {"role": "tool", "tool_call_id": "a1", "name": "lookup_order", "content": "shipped"},
            {"role": "assistant", "content": "It has shipped.", "tool_calls": null}]}"#;
        let (m, tools) = parse_line(&line.replace('\n', " ")).unwrap();
        // Keys stay in file order (templates print them with tojson); arguments become an object.
        let json = |v: &Value| serde_json::to_string(v).unwrap();
        assert_eq!(
            json(&tools.unwrap()[0]),
            r#"{"type":"function","function":{"name":"lookup_order","parameters":{"type":"object","properties":{"order_id":{"type":"string"}}}}}"#
        );
        assert_eq!(m[1].content, "");
        assert_eq!(
            json(&m[1].tool_calls.as_ref().unwrap()[0]),
            r#"{"type":"function","id":"a1","function":{"name":"lookup_order","arguments":{"order_id":"1234","a":1.0}}}"#
        );
        assert_eq!((m[2].tool_call_id.as_deref(), m[2].name.as_deref()), (Some("a1"), Some("lookup_order")));
        assert_eq!(m[3], Message::new("assistant", "It has shipped."));
        // A plain message serializes without the tool keys: templates test whether they exist.
        assert_eq!(
            serde_json::to_string(&m[3]).unwrap(),
            r#"{"role":"assistant","content":"It has shipped."}"#
        );
        let no_tools = r#"{"tools": [], "messages": [{"role": "assistant", "content": "a"}]}"#;
        assert_eq!(parse_line(no_tools).unwrap().1, None);
    }

    #[test]
    fn malformed_tool_fields_say_what_is_wrong() {
        let call = |f: &str| format!(r#"{{"messages": [{{"role": "assistant", "tool_calls": [{f}]}}]}}"#);
        assert_eq!(
            error_of(&call(r#"{"type": "function", "function": {"name": "f", "arguments": "[1]"}}"#)),
            "messages[0]: tool_calls[0].function.arguments: must be a JSON object or a string holding one (got a string holding a list)"
        );
        assert_eq!(
            error_of(&call(r#"{"type": "function", "function": {"name": "", "arguments": {}}}"#)),
            "messages[0]: tool_calls[0].function.name: must be a non-empty string"
        );
        assert_eq!(
            error_of(&call(r#"{"type": "code", "function": {"name": "f", "arguments": {}}}"#)),
            r#"messages[0]: tool_calls[0].type: expected "function""#
        );
        assert_eq!(
            error_of(r#"{"messages": [{"role": "assistant", "content": null}]}"#),
            r#"messages[0]: "content" must be a string (null only on an assistant message with "tool_calls")"#
        );
        assert_eq!(
            error_of(r#"{"messages": [{"role": "user", "content": "a", "tool_call_id": "x"}]}"#),
            r#"messages[0]: "tool_call_id" on a user message (only a "tool" message has it)"#
        );
        let two_results = r#"{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}]}"#;
        assert_eq!(
            error_of(&two_results.replace('\n', " ")),
            "messages[2]: more tool results than the 1 tool call(s) of messages[0]"
        );
        assert_eq!(
            error_of(r#"{"tools": [{"name": "f"}], "messages": [{"role": "assistant", "content": "a"}]}"#),
            r#"tools[0].type: expected "function" (a tool is {"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}})"#
        );
    }

    fn temp_file(name: &str, lines: &[String]) -> PathBuf {
        let path = std::env::temp_dir().join(format!("lora-ft-{name}-{}.jsonl", std::process::id()));
        std::fs::write(&path, lines.join("\n")).unwrap();
        path
    }

    /// A call of a function the row does not offer, or a row with calls and no `tools`, is an
    /// error naming the file, the line and the field.
    #[test]
    fn a_tool_call_must_name_one_of_the_rows_tools() {
        let tool = |n: &str| format!(r#"{{"type": "function", "function": {{"name": "{n}"}}}}"#);
        let tools = format!("[{}, {}]", tool("lookup_order"), tool("track_parcel"));
        let messages = r#"[{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "refund", "arguments": {}}}]}]"#
            .replace('\n', " ");
        let good =
            r#"{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}"#;
        let unknown = format!(r#"{{"tools": {tools}, "messages": {messages}}}"#);
        let path = temp_file("unknown-tool", &[good.into(), unknown]);
        let err = format!("{:#}", read_messages_jsonl(&path).unwrap_err());
        assert_eq!(
            err,
            format!(
                r#"{}:2: messages[2].tool_calls[0].function.name: "refund" is not one of the row's tools (lookup_order, track_parcel)"#,
                path.display()
            )
        );
        let no_tools = format!(r#"{{"messages": {messages}}}"#);
        std::fs::write(&path, no_tools).unwrap();
        let err = format!("{:#}", read_messages_jsonl(&path).unwrap_err());
        assert_eq!(
            err,
            format!(
                r#"{}:1: messages[2].tool_calls[0]: the row has no "tools": a row with tool calls needs "tools", the schemas of the functions it calls (here "refund")"#,
                path.display()
            )
        );
        std::fs::remove_file(&path).ok();
    }

    /// Prompts end with the turn the model answers and need no assistant turn.
    #[test]
    fn prompts_end_with_a_user_turn() {
        let prompt = r#"{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Where is my order?"}]}"#;
        let reply =
            r#"{"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}"#;
        let path = temp_file("prompts", &[prompt.into(), String::new(), reply.into()]);
        let err = format!("{:#}", read_prompts_jsonl(&path).unwrap_err());
        assert_eq!(
            err,
            format!(
                "{}:3: a prompt must end with a user (or tool) message, the turn the model answers",
                path.display()
            )
        );
        std::fs::write(&path, prompt).unwrap();
        let prompts = read_prompts_jsonl(&path).unwrap();
        assert_eq!(prompts.len(), 1);
        assert_eq!(prompts[0].messages[1], Message::new("user", "Where is my order?"));
        std::fs::remove_file(&path).ok();
    }
}
