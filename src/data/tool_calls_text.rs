//! Tool calls read back from a generated assistant reply, for the template families lora-ft
//! renders tool calls with:
//!
//! - Hermes / Qwen2.5 / Qwen3 (and `configs/templates/chatml-tools.jinja`): one or more
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, text before them allowed;
//! - Llama 3.1 / 3.2 / 3.3: the reply is a JSON object `{"name": ..., "parameters": {...}}`
//!   (optionally after `<|python_tag|>`; several separated by `;` are all read);
//! - Mistral v0.3 / Nemo: `[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}, ...]`, and
//!   the newer `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` form.
//!
//! A call is its function's name and its arguments as a JSON value (an `arguments` string holding
//! JSON is parsed, as the data reader does). Text that holds no well-formed call yields none: a
//! reply is never an error.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::Message;

/// The special tokens that carry a tool call: a reply is decoded with these kept.
pub const TOOL_CALL_TOKENS: [&str; 4] = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>"];

/// One call: the function's name and its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Json,
}

impl std::fmt::Display for ToolCall {
    /// `lookup_order {"order_id":"FH-1234567"}`
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} {}", self.name, self.arguments)
    }
}

/// The tool calls in a generated reply, in order; none where it holds none.
pub fn parse_tool_calls(text: &str) -> Vec<ToolCall> {
    if text.contains("<tool_call>") {
        return hermes(text);
    }
    if let Some(at) = text.find("[TOOL_CALLS]") {
        return mistral(&text[at..]);
    }
    llama(text)
}

/// The calls of a reference assistant message (its `tool_calls`), as the parser gives them.
pub fn message_tool_calls(message: &Message) -> Vec<ToolCall> {
    let calls = message.tool_calls.as_deref().unwrap_or_default();
    calls.iter().filter_map(|c| serde_json::to_value(c).ok()).filter_map(|c| call_of(&c)).collect()
}

fn hermes(text: &str) -> Vec<ToolCall> {
    let bodies = text.split("<tool_call>").skip(1);
    bodies
        .filter_map(|b| first_json(b.split("</tool_call>").next().unwrap_or(b)))
        .filter_map(|v| call_of(&v))
        .collect()
}

fn mistral(text: &str) -> Vec<ToolCall> {
    let mut out = Vec::new();
    for piece in text.split("[TOOL_CALLS]").skip(1) {
        match first_json(piece) {
            Some(Json::Array(items)) => out.extend(items.iter().filter_map(call_of)),
            Some(v) => out.extend(call_of(&v)),
            // `name[CALL_ID]id[ARGS]{...}` or `name[ARGS]{...}`
            None => {
                let Some((head, args)) = piece.split_once("[ARGS]") else { continue };
                let name = head.split("[CALL_ID]").next().unwrap_or(head).trim();
                if let (false, Some(arguments)) = (name.is_empty(), first_json(args)) {
                    out.push(ToolCall { name: name.to_string(), arguments: parsed_arguments(arguments) });
                }
            }
        }
    }
    out
}

fn llama(text: &str) -> Vec<ToolCall> {
    let text = text.trim_start();
    let mut rest = text.strip_prefix("<|python_tag|>").unwrap_or(text).trim_start();
    let mut out = Vec::new();
    while rest.starts_with('{') {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Json>();
        let Some(call) = values.next().and_then(Result::ok).as_ref().and_then(call_of) else { break };
        out.push(call);
        rest = rest[values.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    out
}

/// The JSON value at the start of `text` (after whitespace), whatever follows it.
fn first_json(text: &str) -> Option<Json> {
    serde_json::Deserializer::from_str(text.trim_start()).into_iter::<Json>().next()?.ok()
}

/// `{"name", "arguments" | "parameters"}`, or OpenAI's `{"function": {...}}` around it.
fn call_of(value: &Json) -> Option<ToolCall> {
    let object = value.as_object()?;
    let object = match object.get("function") {
        Some(Json::Object(function)) => function,
        _ => object,
    };
    let name = object.get("name")?.as_str()?.to_string();
    let arguments = object.get("arguments").or_else(|| object.get("parameters"));
    let arguments = arguments.cloned().unwrap_or_else(|| Json::Object(Default::default()));
    Some(ToolCall { name, arguments: parsed_arguments(arguments) })
}

fn parsed_arguments(arguments: Json) -> Json {
    match arguments {
        Json::String(text) => serde_json::from_str(&text).unwrap_or(Json::String(text)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(name: &str, arguments: Json) -> ToolCall {
        ToolCall { name: name.into(), arguments }
    }

    #[test]
    fn reads_each_familys_form() {
        let hermes = "Checking both.\n<tool_call>\n{\"name\": \"lookup_order\", \"arguments\": {\"order_id\": \"1\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|im_end|>";
        assert_eq!(
            parse_tool_calls(hermes),
            [call("lookup_order", json!({"order_id": "1"})), call("f", json!({}))]
        );
        let llama = "<|python_tag|>{\"name\": \"track\", \"parameters\": {\"n\": 2}}; {\"name\": \"g\", \"parameters\": {}}";
        assert_eq!(parse_tool_calls(llama), [call("track", json!({"n": 2})), call("g", json!({}))]);
        let mistral = "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": [1]}\", \"id\": \"abcdefghi\"}]</s>";
        assert_eq!(parse_tool_calls(mistral), [call("a", json!({"x": [1]}))]);
        let v11 = "[TOOL_CALLS]lookup_order[CALL_ID]k8L7m6N5b[ARGS]{\"order_id\": \"7\"}";
        assert_eq!(parse_tool_calls(v11), [call("lookup_order", json!({"order_id": "7"}))]);
    }

    #[test]
    fn text_without_a_well_formed_call_has_none() {
        for text in [
            "Your order has shipped.",
            "{not json",
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "[TOOL_CALLS] oops",
            "",
        ] {
            assert_eq!(parse_tool_calls(text), [], "{text:?}");
        }
        // a truncated reply keeps the calls that closed
        let cut = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"argu";
        assert_eq!(parse_tool_calls(cut), [call("a", json!({}))]);
    }
}
