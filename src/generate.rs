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
    let mut processor = sampler(settings);
    let mut caches: Vec<KvCache> = (0..model.layers.len()).map(|_| KvCache::default()).collect();
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
        // the last position's logits alone: a prompt's other positions need none
        let last = model.forward_last(&ids, Some(&mut caches))?.squeeze(0)?;
        let next = processor.sample(&last)?;
        if stop.contains(&next) {
            break;
        }
        out.push(next);
        input = vec![next];
    }
    Ok(out)
}

/// A reply's sampler: greedy at temperature 0, else seeded sampling (top-p where set).
fn sampler(settings: &GenerationSettings) -> LogitsProcessor {
    let sampling = if settings.temperature <= 0.0 {
        Sampling::ArgMax
    } else {
        match settings.top_p {
            Some(p) => Sampling::TopP { p, temperature: settings.temperature },
            None => Sampling::All { temperature: settings.temperature },
        }
    };
    LogitsProcessor::from_sampling(settings.seed, sampling)
}

/// `generate` of several prompts together: each prompt's own forward first, then one step for
/// every unfinished reply at a time (`CausalLm::forward_last_rows`), so that a step reads each
/// weight once for all of them instead of once per reply. Each reply has its own sampler, seeded
/// as `generate` seeds it: a reply is the one `generate` gives, up to the rounding of products
/// over several rows.
pub fn generate_many(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    stop: &[u32],
    settings: &GenerationSettings,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let max_pos = model.config().max_position_embeddings;
    let mut outs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    // the unfinished replies: prompt index, sampler, last token; their caches layer by layer
    let mut live: Vec<(usize, LogitsProcessor, u32)> = Vec::new();
    let mut caches: Vec<Vec<KvCache>> = (0..model.layers.len()).map(|_| Vec::new()).collect();
    for (i, prompt) in prompts.iter().enumerate() {
        anyhow::ensure!(
            prompt.len() <= max_pos,
            "prompt {i} is {} tokens, past the model's max_position_embeddings ({max_pos})",
            prompt.len()
        );
        if settings.max_new_tokens == 0 {
            continue;
        }
        let mut own: Vec<KvCache> = (0..model.layers.len()).map(|_| KvCache::default()).collect();
        let ids = Tensor::new(prompt.as_slice(), model.device())?.unsqueeze(0)?;
        let mut processor = sampler(settings);
        let next = processor.sample(&model.forward_last(&ids, Some(&mut own))?.squeeze(0)?)?;
        if stop.contains(&next) {
            continue;
        }
        outs[i].push(next);
        for (layer, cache) in caches.iter_mut().zip(own) {
            layer.push(cache);
        }
        live.push((i, processor, next));
    }
    loop {
        // a reply ends at max_new_tokens or at the model's last position
        let done: Vec<usize> = (0..live.len())
            .filter(|&r| {
                let i = live[r].0;
                outs[i].len() >= settings.max_new_tokens || prompts[i].len() + outs[i].len() >= max_pos
            })
            .collect();
        for &r in done.iter().rev() {
            live.remove(r);
            for layer in caches.iter_mut() {
                layer.remove(r);
            }
        }
        if live.is_empty() {
            return Ok(outs);
        }
        let last: Vec<u32> = live.iter().map(|(_, _, token)| *token).collect();
        let ids = Tensor::new(last.as_slice(), model.device())?.unsqueeze(1)?;
        let logits = model.forward_last_rows(&ids, &mut caches)?;
        let mut stopped = Vec::new();
        for (r, (i, processor, token)) in live.iter_mut().enumerate() {
            let next = processor.sample(&logits.get(r)?)?;
            if stop.contains(&next) {
                stopped.push(r);
            } else {
                outs[*i].push(next);
                *token = next;
            }
        }
        for &r in stopped.iter().rev() {
            live.remove(r);
            for layer in caches.iter_mut() {
                layer.remove(r);
            }
        }
    }
}

/// `reply_with_tools` of several conversations together (`generate_many`), the replies in order.
pub fn replies_with_tools(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    conversations: &[(&[Message], Option<&[Value]>)],
    stop: &[u32],
    settings: &GenerationSettings,
) -> anyhow::Result<Vec<String>> {
    let prompts = conversations
        .iter()
        .map(|(messages, tools)| prompt_ids(tokenizer, messages, *tools))
        .collect::<anyhow::Result<Vec<_>>>()?;
    generate_many(model, &prompts, stop, settings)?
        .iter()
        .map(|ids| decode_reply(tokenizer.tokenizer(), ids))
        .collect()
}

/// The conversation rendered with the chat template (tools given, generation prompt on) and
/// tokenized.
fn prompt_ids(
    tokenizer: &ChatTokenizer,
    messages: &[Message],
    tools: Option<&[Value]>,
) -> anyhow::Result<Vec<u32>> {
    let prompt = tokenizer.template().render_tools(messages, tools, true)?;
    let enc = tokenizer
        .tokenizer()
        .encode(prompt.as_str(), false)
        .map_err(anyhow::Error::msg)
        .context("tokenizing")?;
    Ok(enc.get_ids().to_vec())
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
    let ids = generate(model, &prompt_ids(tokenizer, messages, tools)?, stop, settings)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Quantization;
    use candle_core::{DType, Device};

    /// Prompts of different lengths answered together give each the reply it gets alone: greedy
    /// and sampled, with the tiny chat model's adapter on (its LoRA group in every projection),
    /// replies stopped by a stop id at different steps, and more rows than the products'
    /// dot-product path takes.
    #[test]
    fn replies_generated_together_equal_each_generated_alone() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-chat");
        let (config, weights) = crate::hub::local_weights(&dir).unwrap();
        let mut model =
            CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap();
        crate::peft_adapter::load_adapter(&mut model, &dir.join("adapter")).unwrap();
        let prompts: Vec<Vec<u32>> = (0..19)
            .map(|p| (0..3 + 7 * p).map(|i| ((i * 37 + p * 11) % 1000) as u32 + 3).collect())
            .collect();
        for temperature in [0.0, 0.8] {
            let settings = GenerationSettings { max_new_tokens: 9, temperature, top_p: None, seed: 5 };
            let alone: Vec<Vec<u32>> =
                prompts.iter().map(|p| generate(&model, p, &[], &settings).unwrap()).collect();
            // stop at the token some replies reach at different steps
            let stop = [alone[0][4], alone[3][1]];
            let stopped: Vec<Vec<u32>> =
                prompts.iter().map(|p| generate(&model, p, &stop, &settings).unwrap()).collect();
            assert_eq!(generate_many(&model, &prompts, &[], &settings).unwrap(), alone, "T = {temperature}");
            assert_eq!(
                generate_many(&model, &prompts, &stop, &settings).unwrap(),
                stopped,
                "T = {temperature}"
            );
            assert!(stopped.iter().any(|r| r.len() < 9) && stopped.iter().any(|r| r.len() == 9));
        }
    }
}
