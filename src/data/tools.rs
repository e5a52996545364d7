//! Tool calling in the OpenAI / Hugging Face chat format: a row's `tools` (JSON schemas,
//! `{"type": "function", "function": {"name", "description", "parameters"}}`), an assistant's
//! `tool_calls` (`[{"type": "function", "id"?, "function": {"name", "arguments"}}]`) and `tool`
//! messages carrying the results (`content`, `tool_call_id`, `name`).
//!
//! Templates print tools and calls with `tojson`, so what they are handed keeps the row's key
//! order: the ordered copy of the row (a minijinja value) is what is stored, and the serde_json
//! copy is only read to check it. An `arguments` string is parsed into the object HF's templates
//! expect (they print a string as a quoted string).

use std::path::Path;

use anyhow::Context;
use minijinja::Value;
use serde_json::Value as Json;

/// A `--tools` file: a JSON list of tool schemas, checked as a row's `tools` are.
pub fn read_tools_file(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let json: Json =
        serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
    let ordered: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
    let tools = parse_tools(Some(&json), ordered).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    tools.with_context(|| format!("{}: no tools (expected a list of tool schemas)", path.display()))
}

/// A row's `tools`: null, missing or `[]` is no tools (templates would print an empty list).
pub(super) fn parse_tools(json: Option<&Json>, ordered: Value) -> Result<Option<Vec<Value>>, String> {
    let items = match json {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Array(items)) if items.is_empty() => return Ok(None),
        Some(Json::Array(items)) => items,
        Some(other) => {
            return Err(format!(
                r#""tools" must be a list of {{"type": "function", "function": {{...}}}} (got {})"#,
                kind(other)
            ))
        }
    };
    for (i, tool) in items.iter().enumerate() {
        check_tool(tool).map_err(|e| format!("tools[{i}]{e}"))?;
    }
    Ok(Some(ordered.try_iter().map_err(|e| e.to_string())?.collect()))
}

fn check_tool(tool: &Json) -> Result<(), String> {
    const SHAPE: &str =
        r#"{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}"#;
    let Json::Object(map) = tool else {
        return Err(format!(": expected {SHAPE}"));
    };
    if map.get("type") != Some(&Json::from("function")) {
        return Err(format!(r#".type: expected "function" (a tool is {SHAPE})"#));
    }
    let Some(Json::Object(function)) = map.get("function") else {
        return Err(format!(r#".function: expected an object (a tool is {SHAPE})"#));
    };
    match function.get("name") {
        Some(Json::String(name)) if !name.is_empty() => {}
        Some(_) => return Err(r#".function.name: must be a non-empty string"#.into()),
        None => return Err(r#".function: missing "name""#.into()),
    }
    match function.get("parameters") {
        None | Some(Json::Object(_)) => Ok(()),
        Some(other) => {
            Err(format!(".function.parameters: must be a JSON schema object (got {})", kind(other)))
        }
    }
}

/// An assistant's `tool_calls`: null or `[]` is none. Errors start with the field's path.
pub(super) fn parse_tool_calls(json: &Json, ordered: Value) -> Result<Option<Vec<Value>>, String> {
    let calls = match json {
        Json::Null => return Ok(None),
        Json::Array(calls) if calls.is_empty() => return Ok(None),
        Json::Array(calls) => calls,
        other => return Err(format!(r#""tool_calls" must be a list (got {})"#, kind(other))),
    };
    let mut out = Vec::with_capacity(calls.len());
    for (j, call) in calls.iter().enumerate() {
        let ordered_call = ordered.get_item_by_index(j).map_err(|e| e.to_string())?;
        let call = parse_tool_call(call, ordered_call).map_err(|e| format!("tool_calls[{j}]{e}"))?;
        out.push(call);
    }
    Ok(Some(out))
}

fn parse_tool_call(call: &Json, ordered: Value) -> Result<Value, String> {
    const SHAPE: &str = r#"{"type": "function", "id": ..., "function": {"name": ..., "arguments": {...}}}"#;
    let Json::Object(map) = call else {
        return Err(format!(": expected {SHAPE}"));
    };
    if let Some(key) = map.keys().find(|k| !["type", "id", "function"].contains(&k.as_str())) {
        return Err(format!(r#": unsupported key {key:?} (a tool call is {SHAPE})"#));
    }
    match map.get("type") {
        None => {}
        Some(Json::String(t)) if t == "function" => {}
        Some(_) => return Err(r#".type: expected "function""#.into()),
    }
    match map.get("id") {
        None | Some(Json::Null) | Some(Json::String(_)) => {}
        Some(other) => return Err(format!(".id: must be a string (got {})", kind(other))),
    }
    let Some(Json::Object(function)) = map.get("function") else {
        return Err(format!(
            r#".function: expected {{"name": ..., "arguments": {{...}}}} (a tool call is {SHAPE})"#
        ));
    };
    if let Some(key) = function.keys().find(|k| *k != "name" && *k != "arguments") {
        return Err(format!(
            r#".function: unsupported key {key:?} (a function call has "name" and "arguments")"#
        ));
    }
    match function.get("name") {
        Some(Json::String(name)) if !name.is_empty() => {}
        Some(_) => return Err(".function.name: must be a non-empty string".into()),
        None => return Err(r#".function: missing "name""#.into()),
    }
    let bad_arguments =
        |got: &str| format!(".function.arguments: must be a JSON object or a string holding one (got {got})");
    match function.get("arguments") {
        Some(Json::Object(_)) => Ok(ordered),
        Some(Json::String(text)) => {
            let parsed: Value = match serde_json::from_str::<Json>(text) {
                Ok(Json::Object(_)) => serde_json::from_str(text).map_err(|e| e.to_string())?,
                Ok(other) => return Err(bad_arguments(&format!("a string holding {}", kind(&other)))),
                Err(e) => return Err(bad_arguments(&format!("a string that is not JSON: {e}"))),
            };
            Ok(replace_arguments(&ordered, parsed)?)
        }
        Some(other) => Err(bad_arguments(kind(other))),
        None => Err(r#".function: missing "arguments" (an object, {} for none)"#.into()),
    }
}

/// The call with `function.arguments` replaced, every key where it was.
fn replace_arguments(call: &Value, arguments: Value) -> Result<Value, String> {
    let function = call.get_attr("function").map_err(|e| e.to_string())?;
    let function = map_with(&function, "arguments", arguments)?;
    map_with(call, "function", function)
}

/// A copy of the map `map` with `key`'s value replaced, in the same key order.
pub(super) fn map_with(map: &Value, key: &str, value: Value) -> Result<Value, String> {
    let keys: Vec<Value> = map.try_iter().map_err(|e| e.to_string())?.collect();
    let mut pairs = Vec::with_capacity(keys.len());
    for k in keys {
        let v = match k.as_str() == Some(key) {
            true => value.clone(),
            false => map.get_item(&k).map_err(|e| e.to_string())?,
        };
        pairs.push((k, v));
    }
    Ok(pairs.into_iter().collect())
}

/// "a string", "an object", ... for error messages.
pub(super) fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}
