//! Text generation for `lora-ft chat`: the model's chat template, a KV cache, greedy or sampled
//! decoding, stopping at the end-of-turn / end-of-sequence tokens.

use std::path::Path;

use anyhow::Context;
use candle_core::Tensor;
use candle_transformers::generation::{LogitsProcessor, Sampling};

use minijinja::Value;
use tokenizers::Tokenizer;

use crate::data::{ChatTokenizer, Message, TOOL_CALL_TOKENS};
use crate::model::{CausalLm, KvCache};

#[derive(Debug, Clone)]
pub struct GenerationSettings {
    pub max_new_tokens: usize,
    /// 0 means greedy decoding.
    pub temperature: f64,
    pub top_p: Option<f64>,
    pub seed: u64,
}

/// Token ids that end a reply: `eos_token_id` from config.json / generation_config.json (an
/// id or a list) and the tokenizer's eos token (ChatML's `<|im_end|>`).
pub fn stop_ids(model_dir: &Path, tokenizer: &ChatTokenizer) -> Vec<u32> {
    let mut ids = Vec::new();
    for file in ["generation_config.json", "config.json"] {
        let Ok(text) = std::fs::read_to_string(model_dir.join(file)) else { continue };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        match &json["eos_token_id"] {
            serde_json::Value::Number(n) => ids.extend(n.as_u64().map(|v| v as u32)),
            serde_json::Value::Array(a) => ids.extend(a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32)),
            _ => {}
        }
    }
    if let Some(eos) = tokenizer.template().special_token("eos_token") {
        ids.extend(tokenizer.tokenizer().token_to_id(eos));
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Continues `prompt_ids` until a stop id or `max_new_tokens`; returns the new ids (stop excluded).
pub fn generate(
    model: &CausalLm,
    prompt_ids: &[u32],
    stop: &[u32],
    settings: &GenerationSettings,
) -> anyhow::Result<Vec<u32>> {
    let sampling = if settings.temperature <= 0.0 {
        Sampling::ArgMax
    } else {
        match settings.top_p {
            Some(p) => Sampling::TopP { p, temperature: settings.temperature },
            None => Sampling::All { temperature: settings.temperature },
        }
    };
    let mut processor = LogitsProcessor::from_sampling(settings.seed, sampling);
    let mut caches = vec![KvCache::default(); model.layers.len()];
    // a reply stops at the model's last position (a prompt past it is an error)
    let max_pos = model.config().max_position_embeddings;
    anyhow::ensure!(
        prompt_ids.len() <= max_pos,
        "the prompt is {} tokens, past the model's max_position_embeddings ({max_pos})",
        prompt_ids.len()
    );
    let mut input = prompt_ids.to_vec();
    let mut out = Vec::new();
    for _ in 0..settings.max_new_tokens {
        if prompt_ids.len() + out.len() >= max_pos && !out.is_empty() {
            break;
        }
        let ids = Tensor::new(input.as_slice(), model.device())?.unsqueeze(0)?;
        let logits = model.forward(&ids, Some(&mut caches))?;
        let last = logits.squeeze(0)?.get(input.len() - 1)?;
        let next = processor.sample(&last.to_dtype(candle_core::DType::F32)?)?;
        if stop.contains(&next) {
            break;
        }
        out.push(next);
        input = vec![next];
    }
    Ok(out)
}

/// Renders the conversation with the chat template (generation prompt on), generates a reply
/// and decodes it (`decode_reply`).
pub fn reply(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    messages: &[Message],
    stop: &[u32],
    settings: &GenerationSettings,
) -> anyhow::Result<String> {
    reply_with_tools(model, tokenizer, messages, None, stop, settings)
}

/// `reply` with the row's tool schemas handed to the template, as
/// `apply_chat_template(messages, tools=tools, add_generation_prompt=True)` does.
pub fn reply_with_tools(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    messages: &[Message],
    tools: Option<&[Value]>,
    stop: &[u32],
    settings: &GenerationSettings,
) -> anyhow::Result<String> {
    let prompt = tokenizer.template().render_tools(messages, tools, true)?;
    let enc = tokenizer
        .tokenizer()
        .encode(prompt.as_str(), false)
        .map_err(anyhow::Error::msg)
        .context("tokenizing")?;
    let ids = generate(model, enc.get_ids(), stop, settings)?;
    decode_reply(tokenizer.tokenizer(), &ids)
}

/// The text of generated ids: special tokens dropped, except those that carry a tool call
/// (`TOOL_CALL_TOKENS`: Mistral's `[TOOL_CALLS]`, Llama's `<|python_tag|>`, ...), which the
/// tool-call parser reads.
pub fn decode_reply(tokenizer: &Tokenizer, ids: &[u32]) -> anyhow::Result<String> {
    let added = tokenizer.get_added_tokens_decoder();
    let kept: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|id| match added.get(id) {
            Some(token) if token.special => TOOL_CALL_TOKENS.contains(&token.content.as_str()),
            _ => true,
        })
        .collect();
    tokenizer.decode(&kept, false).map_err(anyhow::Error::msg)
}
