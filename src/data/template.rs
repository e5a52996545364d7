//! The model's own chat template, rendered the way `transformers`' `apply_chat_template` does:
//! Jinja with `trim_blocks` and `lstrip_blocks`, loop controls, Python string/dict methods
//! (minijinja-contrib pycompat), `raise_exception`, `strftime_now`, Python-style `tojson`, and
//! the special tokens (`bos_token`, `eos_token`, ...) as variables, and `tools` (a row's tool
//! schemas, or none) as `apply_chat_template(messages, tools=tools)` passes them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{bail, Context};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

use super::jinja_compat;
use super::Message;

const NAME: &str = "chat_template";

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's text (constrained decoding reads which tool-call syntax it renders).
    source: String,
    /// `bos_token`, `eos_token`, `pad_token`, `unk_token` as the template sees them.
    special_tokens: BTreeMap<&'static str, String>,
    /// Further variables, as `apply_chat_template(..., name=value)` passes them.
    variables: BTreeMap<String, Value>,
    /// The file the template was read from, for messages.
    origin: Option<String>,
    /// Whether the template renders tools, tool calls and tool results (checked once, on the
    /// first row that has any).
    tool_support: OnceLock<Result<(), String>>,
}

impl ChatTemplate {
    /// Reads `chat_template` and the special tokens from a `tokenizer_config.json`. As in
    /// transformers, a `chat_template.jinja` next to it takes precedence over the JSON key.
    pub fn from_tokenizer_config(path: &Path) -> anyhow::Result<Self> {
        Self::from_tokenizer_config_with(path, None)
    }

    /// As `from_tokenizer_config`, with `template_file` (a Jinja file: `model.chat_template`,
    /// `--chat-template`) in place of the model's template; the special tokens stay the config's.
    pub fn from_tokenizer_config_with(path: &Path, template_file: Option<&Path>) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
        let config: Json =
            serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?;
        let jinja_file = path.with_file_name("chat_template.jinja");
        let jinja_file = template_file.map_or(jinja_file, Path::to_path_buf);
        let (source, origin) = if template_file.is_some() || jinja_file.is_file() {
            let source = std::fs::read_to_string(&jinja_file)
                .with_context(|| format!("{}: cannot read the chat template", jinja_file.display()))?;
            (source, jinja_file.display().to_string())
        } else {
            let source =
                template_source(&config).with_context(|| format!("{}: chat_template", path.display()))?;
            (source, path.display().to_string())
        };
        let mut special_tokens = BTreeMap::new();
        for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            if let Some(token) =
                token_content(&config[key]).with_context(|| format!("{}: {key}", path.display()))?
            {
                special_tokens.insert(key, token);
            }
        }
        let mut template = Self::new(source, special_tokens).with_context(|| match template_file {
            Some(file) => file.display().to_string(),
            None => format!("{}: chat_template", path.display()),
        })?;
        template.origin = Some(origin);
        Ok(template)
    }

    /// Compiles a template; `special_tokens` maps names such as `"eos_token"` to their text.
    pub fn new(source: String, special_tokens: BTreeMap<&'static str, String>) -> anyhow::Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", jinja_compat::tojson);
        env.add_function("strftime_now", jinja_compat::strftime_now);
        env.add_test("iterable", jinja_compat::is_iterable);
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(NAME, source.clone()).map_err(|e| anyhow::anyhow!("cannot compile: {e:#}"))?;
        Ok(Self {
            env,
            source,
            special_tokens,
            variables: BTreeMap::new(),
            origin: None,
            tool_support: OnceLock::new(),
        })
    }

    /// Sets a variable the template reads, as transformers' `apply_chat_template(..., name=value)`
    /// does: Llama 3.2 prints `date_string` (else today's date from `strftime_now`), Qwen3 reads
    /// `enable_thinking`.
    pub fn set_variable(&mut self, name: &str, value: Value) {
        self.variables.insert(name.to_string(), value);
        self.tool_support = OnceLock::new();
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the assistant's
    /// next reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> anyhow::Result<String> {
        self.render_tools(messages, None, add_generation_prompt)
    }

    /// Renders a conversation with the row's `tools` (`None`: the template sees `tools = none`,
    /// as in transformers). A conversation with tools, tool calls or tool results is refused where
    /// the template renders none of them (Gemma 2 and 3), rather than trained without them.
    pub fn render_tools(
        &self,
        messages: &[Message],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> anyhow::Result<String> {
        let uses_tools =
            tools.is_some() || messages.iter().any(|m| m.tool_calls.is_some() || m.role == "tool");
        if uses_tools {
            if let Err(why) = self.tool_support.get_or_init(|| self.check_tool_support()) {
                let of = self.origin.as_deref().map(|o| format!(" of {o}")).unwrap_or_default();
                bail!(
                    "the chat template{of} does not take tools ({why}); rows with \"tools\", \"tool_calls\" \
                     or \"tool\" messages need a model whose template renders them"
                );
            }
        }
        self.render_raw(messages, tools, add_generation_prompt)
    }

    fn render_raw(
        &self,
        messages: &[Message],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> anyhow::Result<String> {
        let mut ctx: BTreeMap<&str, Value> =
            self.special_tokens.iter().map(|(k, v)| (*k, Value::from(v.as_str()))).collect();
        ctx.extend(self.variables.iter().map(|(k, v)| (k.as_str(), v.clone())));
        ctx.insert("messages", Value::from_serialize(messages));
        // transformers passes both, None when not given.
        ctx.insert("tools", tools.map_or(Value::from(()), |t| Value::from(t.to_vec())));
        ctx.insert("documents", Value::from(()));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        let template = self.env.get_template(NAME).expect("compiled in new()");
        template.render(ctx).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => {
                anyhow::anyhow!("chat template: {}", e.detail().unwrap_or("error"))
            }
            _ => anyhow::anyhow!("chat template: {e:#}"),
        })
    }

    /// Renders a small tool dialogue: a template takes tools if the tool's name, the call's name
    /// and the result all show in the text.
    fn check_tool_support(&self) -> Result<(), String> {
        let tools = [Value::from_serialize(serde_json::json!({"type": "function", "function": {
            "name": "lora_ft_probe_tool", "description": "d", "parameters": {"type": "object", "properties": {}}}}))];
        let call = Value::from_serialize(serde_json::json!({"type": "function", "id": "probe0001",
            "function": {"name": "lora_ft_probe_call", "arguments": {}}}));
        let messages = [
            Message::new("user", "u"),
            Message { tool_calls: Some(vec![call]), ..Message::new("assistant", "") },
            Message {
                tool_call_id: Some("probe0001".into()),
                ..Message::new("tool", "lora_ft_probe_result")
            },
            Message::new("assistant", "a"),
        ];
        // Hermes templates require the result's `name`; others are probed without it, so that
        // the call's name shows only where the call is rendered.
        let named = |mut m: Vec<Message>| {
            m[2].name = Some("lora_ft_probe_name".into());
            m
        };
        let text = self
            .render_raw(&messages, Some(&tools), false)
            .or_else(|_| self.render_raw(&named(messages.to_vec()), Some(&tools), false))
            .map_err(|e| format!("rendering a tool call and its result fails: {e:#}"))?;
        let shown = [
            ("lora_ft_probe_tool", "tool list"),
            ("lora_ft_probe_call", "tool call"),
            ("lora_ft_probe_result", "tool result"),
        ];
        let missing: Vec<&str> =
            shown.into_iter().filter(|(probe, _)| !text.contains(probe)).map(|(_, what)| what).collect();
        match missing.is_empty() {
            true => Ok(()),
            false => Err(format!("it renders no {}", missing.join(", no "))),
        }
    }

    /// The text of a special token (`"eos_token"`, `"pad_token"`, ...), if the config names one.
    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special_tokens.get(name).map(String::as_str)
    }
}

/// `chat_template` is a string, or a list of `{"name", "template"}` of which "default" is used.
fn template_source(config: &Json) -> anyhow::Result<String> {
    match &config["chat_template"] {
        Json::String(s) => Ok(s.clone()),
        Json::Array(named) => {
            let default = named.iter().find(|t| t["name"] == "default");
            match default.map(|t| &t["template"]) {
                Some(Json::String(s)) => Ok(s.clone()),
                _ => bail!("a list of templates needs one named \"default\" with a \"template\" string"),
            }
        }
        Json::Null => bail!("missing: this tokenizer has no chat template"),
        _ => bail!("expected a string or a list of named templates"),
    }
}

/// A special token is a string, an AddedToken dict `{"content": ...}`, or null.
fn token_content(value: &Json) -> anyhow::Result<Option<String>> {
    match value {
        Json::Null => Ok(None),
        Json::String(s) => Ok(Some(s.clone())),
        Json::Object(map) => match map.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => bail!("expected a string or an object with a \"content\" string"),
        },
        _ => bail!("expected a string or an object with a \"content\" string"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(source: &str) -> ChatTemplate {
        let tokens = BTreeMap::from([("bos_token", "<s>".to_string()), ("eos_token", "</s>".to_string())]);
        ChatTemplate::new(source.into(), tokens).unwrap()
    }

    fn conversation() -> Vec<Message> {
        vec![Message::new("user", "  Hi there "), Message::new("assistant", "Hello")]
    }

    // Mistral-Instruct-v0.1-style template: bos/eos variables, raise_exception, Python's strip().
    const MISTRAL: &str = "{{ bos_token }}{% for message in messages %}\
        {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
        {% if message['role'] == 'user' %}{{ '[INST] ' + message['content'].strip() + ' [/INST]' }}\
        {% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}";

    #[test]
    fn renders_mistral_style_template() {
        let t = template(MISTRAL);
        assert_eq!(t.render(&conversation(), false).unwrap(), "<s>[INST] Hi there [/INST]Hello</s>");
        let err = t.render(&[Message::new("assistant", "x")], false).unwrap_err().to_string();
        assert_eq!(err, "chat template: Conversation roles must alternate user/assistant/user/assistant/...");
    }

    #[test]
    fn trims_blocks_like_transformers() {
        // With trim_blocks and lstrip_blocks the newline after a block tag and the indentation
        // before it vanish, so this renders on one line per message.
        let t = template(
            "{% for m in messages %}\n  {% if m.role == 'user' %}\nU:{{ m.content }}|\n  {% else %}\nA:{{ m.content }}|\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}A:{% endif %}",
        );
        assert_eq!(t.render(&conversation(), true).unwrap(), "U:  Hi there |\nA:Hello|\nA:");
    }

    #[test]
    fn supports_loop_controls_and_python_methods() {
        let t = template(
            "{% for m in messages %}{% if m.role == 'assistant' %}{% break %}{% endif %}\
             {{ m.content.split()|join(',') }}{{ m.get('missing', '?') }}{% endfor %}",
        );
        assert_eq!(t.render(&conversation(), false).unwrap(), "Hi,there?");
    }

    #[test]
    fn reads_list_form_and_added_token_dicts() {
        let config = serde_json::json!({
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
            "eos_token": {"content": "<|eot|>", "lstrip": false},
        });
        assert_eq!(template_source(&config).unwrap(), "D");
        assert_eq!(token_content(&config["eos_token"]).unwrap().as_deref(), Some("<|eot|>"));
        let err = template_source(&serde_json::json!({})).unwrap_err().to_string();
        assert_eq!(err, "missing: this tokenizer has no chat template");
    }
}
