//! The grammar of `tool_choice` "required" (one or more calls to the request's tools) or a named
//! function (one call to it), written in the model's own tool-call syntax, the one its chat
//! template renders calls in and the tool-call parser reads back (`data::parse_tool_calls`).

use std::sync::Arc;

use serde_json::Value;

use super::matcher::{Grammar, Item};
use super::schema::Node;

/// Which calls the reply must make.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// One or more calls (one only where `parallel` is false) to any of the tools.
    Required { parallel: bool },
    /// One call to the function of this name.
    Function(String),
}

/// How a template family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CallSyntax {
    /// Hermes, Qwen2.5, Qwen3: `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`.
    Hermes,
    /// Mistral v0.3, Nemo: `[TOOL_CALLS][{"name": ..., "arguments": ...}, ...]`.
    Mistral,
    /// Newer Mistral templates: `[TOOL_CALLS]name[ARGS]{...}`.
    MistralArgs,
    /// Llama 3.1-3.3: the reply a JSON object `{"name": ..., "parameters": ...}` (`; ` between
    /// calls); templates of no known family too, with `"arguments"`.
    Json { arguments: &'static str },
}

impl CallSyntax {
    /// The syntax a chat template's source renders calls in.
    pub fn of_template(source: &str) -> Self {
        if source.contains("[ARGS]") {
            CallSyntax::MistralArgs
        } else if source.contains("[TOOL_CALLS]") {
            CallSyntax::Mistral
        } else if source.contains("<tool_call>") {
            CallSyntax::Hermes
        } else if source.contains("<|python_tag|>") || source.contains("\"parameters\"") {
            CallSyntax::Json { arguments: "parameters" }
        } else {
            CallSyntax::Json { arguments: "arguments" }
        }
    }

    /// (open, the text before a call's arguments, after them, between calls, close).
    fn texts(self, name: &str) -> [String; 5] {
        let name_json = Value::String(name.to_string()).to_string();
        let call = |arguments: &str| format!("{{\"name\": {name_json}, \"{arguments}\": ");
        let strings =
            |a: &str, b: String, c: &str, d: &str, e: &str| [a.into(), b, c.into(), d.into(), e.into()];
        match self {
            CallSyntax::Hermes => {
                strings("", format!("<tool_call>\n{}", call("arguments")), "}\n</tool_call>", "\n", "")
            }
            CallSyntax::Mistral => strings("[TOOL_CALLS][", call("arguments"), "}", ", ", "]"),
            CallSyntax::MistralArgs => strings("", format!("[TOOL_CALLS]{name}[ARGS]"), "", "", ""),
            CallSyntax::Json { arguments } => strings("", call(arguments), "}", "; ", ""),
        }
    }
}

/// What is wrong with a constrained tool choice, and the request field it is in.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolChoiceError {
    pub param: &'static str,
    pub message: String,
}

fn error(param: &'static str, message: String) -> ToolChoiceError {
    ToolChoiceError { param, message }
}

/// The grammar of `choice` over `tools` (OpenAI's `tools` list) in `syntax`.
pub fn tool_call_grammar(
    tools: &[Value],
    choice: &ToolChoice,
    syntax: CallSyntax,
) -> Result<Grammar, ToolChoiceError> {
    let mut functions = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let function = tool.get("function").unwrap_or(tool);
        let name = function.get("name").and_then(Value::as_str);
        let name = name.ok_or_else(|| error("tools", format!("tools[{i}] has no function name")))?;
        let arguments = match function.get("parameters") {
            None | Some(Value::Null) => Node::Object(Some(Vec::new())),
            Some(schema) => Node::of(schema)
                .map_err(|e| error("tools", format!("tools[{i}] ({name}): parameters: {e}")))?,
        };
        functions.push((name, Arc::new(arguments)));
    }
    if functions.is_empty() {
        return Err(error("tools", "a tool_choice of \"required\" or a function needs \"tools\"".into()));
    }
    let many = match choice {
        ToolChoice::Required { parallel } => *parallel,
        ToolChoice::Function(wanted) => {
            functions.retain(|(name, _)| name == wanted);
            if functions.is_empty() {
                let message = format!("tool_choice names function {wanted:?}, which is not in \"tools\"");
                return Err(error("tool_choice", message));
            }
            functions.truncate(1);
            false
        }
    };
    let [open, _, _, sep, close] = syntax.texts("");
    let calls: Vec<Vec<Item>> = functions
        .iter()
        .map(|(name, arguments)| {
            let [_, before, after, _, _] = syntax.texts(name);
            vec![Item::Text(before), Item::Value(arguments.clone()), Item::Text(after)]
        })
        .collect();
    Ok(Grammar::calls(&open, &calls, &sep, &close, many))
}
