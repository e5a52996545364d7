//! The Ollama Modelfile `export-gguf` writes beside `OUT.gguf`, as `OUT.Modelfile`
//! (`ollama create NAME -f OUT.Modelfile`): `FROM ./OUT.gguf` (for `--adapter-only`, `FROM` the
//! base's GGUF and `ADAPTER ./OUT.gguf`), a `TEMPLATE` in Ollama's Go-template syntax for the
//! model's chat template, `SYSTEM` with the template's default system prompt, and one
//! `PARAMETER stop` per end-of-turn / end-of-sequence token.
//!
//! The template is recognised by the family markers of the model's Jinja template (ChatML's
//! `<|im_start|>`: SmolLM2, Qwen; Llama 3's `<|start_header_id|>`; Gemma's `<start_of_turn>`;
//! Mistral's `[INST]`) and written as Ollama's own template file for that family, verbatim from
//! ollama/ollama's `template/` folder (each constant names its file and commit). An unrecognised
//! template gets no `TEMPLATE` line, a comment and a warning: Ollama then uses the GGUF's own
//! `tokenizer.chat_template`.

use anyhow::{Context, Result};
use serde_json::Value as Json;
use std::path::Path;

/// The chat-template families a Modelfile's `TEMPLATE` is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    ChatMl,
    Llama3,
    Gemma,
    Mistral,
}

impl Family {
    /// The family of a Jinja chat template, by the special tokens it writes.
    pub fn recognise(template: &str) -> Option<Self> {
        [
            ("<|im_start|>", Self::ChatMl),
            ("<|start_header_id|>", Self::Llama3),
            ("<start_of_turn>", Self::Gemma),
            ("[INST]", Self::Mistral),
        ]
        .into_iter()
        .find(|(marker, _)| template.contains(marker))
        .map(|(_, family)| family)
    }

    fn label(self) -> &'static str {
        match self {
            Self::ChatMl => "ChatML",
            Self::Llama3 => "Llama 3",
            Self::Gemma => "Gemma",
            Self::Mistral => "Mistral [INST]",
        }
    }

    /// Ollama's template file for the family: (its name in ollama/ollama, the text).
    fn ollama_template(self) -> (&'static str, &'static str) {
        match self {
            Self::ChatMl => ("template/chatml.gotmpl @ 4a8e5e2", CHATML),
            Self::Llama3 => ("template/llama3-instruct.gotmpl @ 19753c1", LLAMA3),
            Self::Gemma => ("template/gemma3-instruct.gotmpl @ 6010351", GEMMA3),
            Self::Mistral => ("template/mistral-instruct.gotmpl @ 4574382", MISTRAL),
        }
    }

    /// The token that ends a turn in the family's format.
    fn end_of_turn(self) -> &'static str {
        match self {
            Self::ChatMl => "<|im_end|>",
            Self::Llama3 => "<|eot_id|>",
            Self::Gemma => "<end_of_turn>",
            Self::Mistral => "</s>",
        }
    }
}

const CHATML: &str = "{{- if .Messages }}\n{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}\n{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ else }}\n{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}<|im_end|>\n{{- end }}";
const LLAMA3: &str = "{{- if .Messages }}\n{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>\n{{- end }}\n{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>\n{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ else -}}\n{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>\n{{- end -}}";
const GEMMA3: &str = "{{- $system := .System }}\n{{- range $i, $_ := .Messages }}\n{{- $last := eq (len (slice $.Messages $i)) 1 }}\n{{- if eq .Role \"user\" }}<start_of_turn>user\n{{- if and (eq $i 1) $system }}\n{{ $system }}\n{{- end }}\n{{ .Content }}<end_of_turn>\n{{ else if eq .Role \"assistant\" }}<start_of_turn>model\n{{ .Content }}<end_of_turn>\n{{ end }}\n{{- if $last }}<start_of_turn>model\n{{ end }}\n{{- end }}\n";
const MISTRAL: &str = "{{- if .Messages }}\n{{- range $index, $_ := .Messages }}\n{{- if eq .Role \"user\" }}[INST] {{ if and $.System (eq (len (slice $.Messages $index)) 1) }}{{ $.System }}\n{{ end }}{{ .Content }}\n{{- else if eq .Role \"assistant\" }}[/INST] {{ .Content }}</s>\n{{- end }}\n{{- end }}[/INST]\n{{- else -}}\n[INST] {{ if .System }}{{ .System }} {{ end }}{{ .Prompt }}[/INST] {{ .Response }}</s>\n{{- end -}}";

/// A ChatML template's default system prompt: a literal `<|im_start|>system` turn with fixed text
/// (SmolLM2's "You are a helpful AI assistant named SmolLM…", Qwen2.5's "You are Qwen…").
pub fn default_system(template: &str) -> Option<String> {
    for start in ["<|im_start|>system\n", "<|im_start|>system\\n"] {
        for (at, _) in template.match_indices(start) {
            let rest = &template[at + start.len()..];
            let Some(end) = rest.find("<|im_end|>") else { continue };
            let text = &rest[..end];
            if !text.is_empty() && !text.contains(['\'', '"', '{', '}', '+', '<', '\n']) {
                return Some(text.to_string());
            }
        }
    }
    None
}

/// The model folder's chat template (`chat_template.jinja`, else tokenizer_config.json's
/// `chat_template`, a string or the one named "default") and its eos token; `None` for what it
/// does not have.
fn read_tokenizer_config(dir: &Path) -> Result<(Option<String>, Option<String>)> {
    let path = dir.join("tokenizer_config.json");
    let config: Json = match std::fs::read_to_string(&path) {
        Ok(text) => {
            serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))?
        }
        Err(_) => Json::Null,
    };
    let jinja = dir.join("chat_template.jinja");
    let template = if jinja.is_file() {
        Some(std::fs::read_to_string(&jinja).with_context(|| format!("reading {}", jinja.display()))?)
    } else {
        match &config["chat_template"] {
            Json::String(s) => Some(s.clone()),
            Json::Array(named) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(String::from),
            _ => None,
        }
    };
    let eos = match &config["eos_token"] {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(String::from),
        _ => None,
    };
    Ok((template, eos))
}

/// A Modelfile's quoted string: `"…"` with `\` and `"` escaped.
fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// What goes after `FROM` (and `ADAPTER`), and the Modelfile's text for the model in `model_dir`;
/// the second value is a warning for the user, if any.
pub fn modelfile(from: &str, adapter: Option<&str>, model_dir: &Path) -> Result<(String, Option<String>)> {
    let (template, eos) = read_tokenizer_config(model_dir)?;
    let family = template.as_deref().and_then(Family::recognise);
    let mut text = String::from(
        "# Ollama Modelfile written by `lora-ft export-gguf`: ollama create NAME -f THIS_FILE\n",
    );
    let mut warning = None;
    text += &format!("FROM {from}\n");
    if let Some(adapter) = adapter {
        text += &format!("ADAPTER {adapter}\n");
    }
    match family {
        Some(family) => {
            let (source, body) = family.ollama_template();
            text += &format!(
                "# {} chat template, as Ollama's own github.com/ollama/ollama {source}\n",
                family.label()
            );
            text += &format!("TEMPLATE \"\"\"{body}\"\"\"\n");
        }
        None => {
            let why = match template {
                Some(_) => "its chat template is none of ChatML, Llama 3, Gemma or Mistral [INST]",
                None => "the model has no chat template",
            };
            text += &format!("# no TEMPLATE: {why}; Ollama uses the GGUF's tokenizer.chat_template\n");
            warning = Some(format!(
                "the Modelfile has no TEMPLATE: {why}; Ollama will use the GGUF's own template"
            ));
        }
    }
    if let Some(system) =
        template.as_deref().filter(|_| family == Some(Family::ChatMl)).and_then(default_system)
    {
        text += &format!("SYSTEM \"\"\"{system}\"\"\"\n");
    }
    let mut stops: Vec<String> = family.map(|f| f.end_of_turn().to_string()).into_iter().collect();
    stops.extend(eos.filter(|eos| !stops.contains(eos)));
    for stop in stops {
        text += &format!("PARAMETER stop {}\n", quoted(&stop));
    }
    Ok((text, warning))
}

/// `OUT.Modelfile` beside `OUT.gguf`.
pub fn path_beside(gguf: &Path) -> std::path::PathBuf {
    gguf.with_extension("Modelfile")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_system_is_the_literal_system_turn_only() {
        let smol = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}";
        assert_eq!(
            default_system(smol).as_deref(),
            Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
        );
        let variable = "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}";
        assert_eq!(default_system(variable), None);
        assert_eq!(quoted("say \"hi\" \\ bye"), "\"say \\\"hi\\\" \\\\ bye\"");
    }
}
