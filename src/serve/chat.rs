//! `POST /v1/chat/completions`: OpenAI's messages (content a string or a list of text parts,
//! assistant `tool_calls`, `tool` results), `tools` and `tool_choice` made into a prompt with the
//! model's chat template, and the whole response (`chat.completion`) built from the choices.
//! `tool_choice` "required" or a named function constrains the reply to calls of the tools (in
//! the model's tool-call syntax, their arguments of their `parameters` schemas).

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::body::typed;
use super::errors::ApiError;
use super::events::Choice;
use super::logprobs;
use super::params::{Generation, GenerationFields, MAX_TOP_LOGPROBS};
use super::state::{now, AppState};
use super::tool_calls::{call_json, split_reply};
use crate::data::Conversation;
use crate::generate::constrained::tool_choice::{tool_call_grammar, CallSyntax, ToolChoice};
use crate::generate::engine::Request;

/// Chat's own fields (the shared ones are `GenerationFields`).
#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Vec<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<usize>,
    /// false: a "required" reply is one call (with "auto" the model decides alone).
    parallel_tool_calls: Option<bool>,
}

/// What a checked chat request's response says of it.
pub struct ChatJob {
    pub generation: Generation,
    /// Whether the reply is read for tool calls (tools given, `tool_choice` not "none").
    pub tools: bool,
    pub model: String,
    pub prompt_tokens: usize,
}

/// The request body checked and rendered into the engine's request.
pub fn prepare(state: &AppState, body: &Value) -> Result<(Request, ChatJob), ApiError> {
    let chat: ChatBody = typed(body)?;
    let fields: GenerationFields = typed(body)?;
    let adapter = state.adapter_for(fields.model.as_deref())?;
    let (use_tools, constrained) = tool_choice(chat.tool_choice.as_ref(), chat.parallel_tool_calls)?;
    let top = match (chat.logprobs, chat.top_logprobs) {
        (Some(true), top) => Some(top.unwrap_or(0)),
        (_, Some(_)) => return Err(ApiError::field("top_logprobs", "top_logprobs needs logprobs: true")),
        _ => None,
    };
    if top.is_some_and(|t| t > MAX_TOP_LOGPROBS) {
        return Err(ApiError::field(
            "top_logprobs",
            format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]"),
        ));
    }
    let generation = fields.generation(top, state.options.max_tokens)?;
    let messages = chat
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| normalize_message(m).map_err(|e| ApiError::field(&format!("messages[{i}]"), e)))
        .collect::<Result<Vec<_>, _>>()?;
    // with "none" the tools stay in the prompt (as vLLM keeps them) and the reply is not read for calls
    let tools = chat.tools.unwrap_or(Value::Null);
    let constraint = match constrained {
        None => None,
        Some(choice) => {
            let list = tools.as_array().map_or(&[][..], Vec::as_slice);
            let syntax = CallSyntax::of_template(state.tokenizer.template().source());
            let grammar =
                tool_call_grammar(list, &choice, syntax).map_err(|e| ApiError::field(e.param, e.message))?;
            Some(Arc::new(grammar))
        }
    };
    let row = json!({"messages": messages, "tools": tools}).to_string();
    let conversation = Conversation::parse_prompt(&row).map_err(|e| {
        let param = if e.starts_with("tools") || e.starts_with("\"tools\"") { "tools" } else { "messages" };
        ApiError::field(param, e)
    })?;
    let text = state
        .tokenizer
        .template()
        .render_tools(&conversation.messages, conversation.tools.as_deref(), true)
        .map_err(|e| ApiError::field("messages", format!("{e:#}")))?;
    let prompt = state
        .tokenizer
        .tokenizer()
        .encode(text.as_str(), false)
        .map_err(|e| ApiError::field("messages", format!("tokenizing the prompt: {e}")))?
        .get_ids()
        .to_vec();
    let max_new_tokens =
        generation.budget(prompt.len(), state.engine.max_context(), state.options.max_tokens, "messages")?;
    let model = state.model_name(&adapter);
    let prompt_tokens = prompt.len();
    let request = Request {
        prompt,
        params: generation.params.clone(),
        seeds: generation.seeds.clone(),
        max_new_tokens,
        stop_strings: generation.stop.clone(),
        adapter,
        constraint,
    };
    let tools = use_tools && conversation.tools.is_some();
    Ok((request, ChatJob { generation, tools, model, prompt_tokens }))
}

/// `tool_choice` read: whether the reply is read for calls, and the calls it must make
/// ("required", or `{"type": "function", "function": {"name": ...}}`), if any.
fn tool_choice(
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<(bool, Option<ToolChoice>), ApiError> {
    let parallel = parallel.unwrap_or(true);
    Ok(match choice {
        None | Some(Value::Null) => (true, None),
        Some(Value::String(s)) if s == "auto" => (true, None),
        Some(Value::String(s)) if s == "none" => (false, None),
        Some(Value::String(s)) if s == "required" => (true, Some(ToolChoice::Required { parallel })),
        Some(Value::Object(o)) if o.get("type") == Some(&json!("function")) => {
            match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                Some(name) => (true, Some(ToolChoice::Function(name.to_string()))),
                None => {
                    return Err(ApiError::field(
                        "tool_choice",
                        "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            }
        }
        Some(other) => {
            return Err(ApiError::field(
                "tool_choice",
                format!(
                    "tool_choice must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \
                     \"function\": {{\"name\": ...}}}}, got {other}"
                ),
            ))
        }
    })
}

/// One OpenAI message as the data module reads it: content parts joined into one string, the
/// `developer` role as `system`, fields a template does not take (`name` outside a tool message,
/// `refusal`, ...) left out.
fn normalize_message(message: &Value) -> Result<Value, String> {
    let Value::Object(map) = message else {
        return Err("a message must be an object with \"role\" and \"content\"".into());
    };
    let mut out = Map::new();
    let role = match map.get("role") {
        Some(Value::String(r)) if r == "developer" => json!("system"),
        Some(r) => r.clone(),
        None => return Err("missing \"role\"".into()),
    };
    out.insert("content".into(), content_text(map.get("content"))?);
    for key in ["tool_calls", "tool_call_id"] {
        if let Some(v) = map.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    if role == "tool" {
        if let Some(name) = map.get("name").filter(|v| !v.is_null()) {
            out.insert("name".into(), name.clone());
        }
    }
    out.insert("role".into(), role);
    Ok(Value::Object(out))
}

/// `content` as a string: a string as it is, a list of `{"type": "text", "text"}` parts joined.
fn content_text(content: Option<&Value>) -> Result<Value, String> {
    match content {
        None => Ok(Value::Null),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(format!(
                            "content[{i}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are \
                             supported, got type {}",
                            kind.unwrap_or("none")
                        ))
                    }
                }
            }
            Ok(Value::String(text))
        }
        Some(other) => Ok(other.clone()),
    }
}

/// The message and finish reason of one choice (its tool calls parsed where `tools`).
pub fn choice_message(choice: &Choice, tools: bool) -> (Value, String) {
    let finish = choice.finish.map_or("stop", |f| f.as_str()).to_string();
    if tools {
        let (content, calls) = split_reply(&choice.text);
        if !calls.is_empty() {
            let calls: Vec<Value> = calls.iter().map(|c| call_json(c, None)).collect();
            return (
                json!({"role": "assistant", "content": content, "tool_calls": calls}),
                "tool_calls".into(),
            );
        }
    }
    (json!({"role": "assistant", "content": choice.text}), finish)
}

/// The whole `chat.completion` response.
pub fn response(state: &AppState, job: &ChatJob, id: &str, choices: &[Choice]) -> Value {
    let tokenizer = state.tokenizer.tokenizer();
    let items: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (message, finish) = choice_message(c, job.tools);
            let lp = match job.generation.params.logprobs {
                Some(_) => logprobs::chat(tokenizer, &c.tokens),
                None => Value::Null,
            };
            json!({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
        })
        .collect();
    let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
    json!({
        "id": id,
        "object": "chat.completion",
        "created": now(),
        "model": job.model,
        "choices": items,
        "usage": usage(job.prompt_tokens, completion),
    })
}

/// `usage`.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::stop::FinishReason;

    #[test]
    fn messages_are_normalized_for_the_template() {
        let m = normalize_message(&json!({"role": "user", "name": "ann", "content": [
            {"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}))
        .unwrap();
        assert_eq!(m, json!({"role": "user", "content": "Hello there"}));
        let m = normalize_message(&json!({"role": "developer", "content": "be brief"})).unwrap();
        assert_eq!(m["role"], "system");
        let m = normalize_message(&json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}))
        .unwrap();
        assert_eq!(m["content"], Value::Null);
        assert_eq!(m["tool_calls"][0]["id"], "call_1");
        let m = normalize_message(
            &json!({"role": "tool", "tool_call_id": "call_1", "name": "f", "content": "ok"}),
        )
        .unwrap();
        assert_eq!(m["name"], "f");
        assert!(normalize_message(&json!({"role": "user", "content": [{"type": "image_url"}]})).is_err());
        assert!(normalize_message(&json!("hi")).is_err());
    }

    #[test]
    fn a_reply_with_a_call_has_no_content_and_finishes_with_tool_calls() {
        let choice = Choice {
            text: "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>".into(),
            finish: Some(FinishReason::Stop),
            ..Choice::default()
        };
        let (message, finish) = choice_message(&choice, true);
        assert_eq!(finish, "tool_calls");
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["tool_calls"][0]["function"]["arguments"], "{\"x\":1}");
        let (message, finish) = choice_message(&choice, false);
        assert_eq!(finish, "stop");
        assert!(message["content"].as_str().unwrap().starts_with("<tool_call>"));
        assert!(message.get("tool_calls").is_none());
    }
}
