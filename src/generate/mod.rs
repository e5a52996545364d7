//! Text generation for `lora-ft chat`: the model's chat template, a KV cache, greedy or sampled
//! decoding (`sampling`), stopping at the end-of-turn / end-of-sequence tokens (`stop`).

pub mod completions;
#[cfg(test)]
mod replies_tests;
pub mod sampling;
#[cfg(test)]
mod sampling_tests;
pub mod stop;
#[cfg(test)]
mod stop_tests;

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Tensor};

use minijinja::Value;
use tokenizers::Tokenizer;

use crate::data::{ChatTokenizer, Message, TOOL_CALL_TOKENS};
use crate::model::{CausalLm, KvCache};
use sampling::{Sampled, Sampler, SamplingParams};
use stop::{cut_at_stop, FinishReason};

/// How replies are generated; `Default` is greedy with every penalty off, 256 new tokens at most.
#[derive(Debug, Clone)]
pub struct GenerationSettings {
    pub max_new_tokens: usize,
    /// 0 means greedy decoding.
    pub temperature: f64,
    pub top_p: Option<f64>,
    pub seed: u64,
    pub top_k: Option<usize>,
    /// 0 keeps every token.
    pub min_p: f64,
    /// 1 is no penalty.
    pub repetition_penalty: f64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    /// How many of the most likely raw log-probs each `Sampled` holds.
    pub logprobs: Option<usize>,
    /// A reply's text ends before the first of these it contains (`reply`, `replies_with_tools`:
    /// they detokenize).
    pub stop_strings: Vec<String>,
}

impl Default for GenerationSettings {
    fn default() -> Self {
        Self {
            max_new_tokens: 256,
            temperature: 0.0,
            top_p: None,
            seed: 0,
            top_k: None,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logprobs: None,
            stop_strings: Vec::new(),
        }
    }
}

impl GenerationSettings {
    /// The sampler's parameters (validated when a `Sampler` is made of them).
    pub fn sampling_params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            logprobs: self.logprobs,
        }
    }
}

/// One generated reply: its tokens (a stop id excluded), what the sampler knew of each, and
/// why it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// One per token of `tokens`, in order.
    pub sampled: Vec<Sampled>,
    pub finish: FinishReason,
}

impl Generation {
    fn new() -> Self {
        Self { tokens: Vec::new(), sampled: Vec::new(), finish: FinishReason::Length }
    }

    /// Samples the next token from `logits`; false when it is a stop id (then not kept) or
    /// `ends` says the reply ends with it (a stop string, then kept).
    fn step(
        &mut self,
        sampler: &mut Sampler,
        logits: &[f32],
        prompt: &[u32],
        stop: &[u32],
        ends: &mut dyn FnMut(&[u32]) -> anyhow::Result<bool>,
    ) -> anyhow::Result<bool> {
        let next = sampler.sample(logits, prompt, &self.tokens)?;
        if stop.contains(&next.token) {
            self.finish = FinishReason::Stop;
            return Ok(false);
        }
        self.tokens.push(next.token);
        self.sampled.push(next);
        if ends(&self.tokens)? {
            self.finish = FinishReason::Stop;
            return Ok(false);
        }
        Ok(true)
    }
}

/// One row of logits on the host, as f32.
fn logits_row(logits: &Tensor) -> anyhow::Result<Vec<f32>> {
    Ok(logits.to_dtype(DType::F32)?.to_vec1::<f32>()?)
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
    Ok(generate_detailed(model, prompt_ids, stop, settings)?.tokens)
}

/// `generate` with each token's log-probs and the reason the reply ended.
pub fn generate_detailed(
    model: &CausalLm,
    prompt_ids: &[u32],
    stop: &[u32],
    settings: &GenerationSettings,
) -> anyhow::Result<Generation> {
    generate_until(model, prompt_ids, stop, settings, &mut |_| Ok(false))
}

/// `generate_detailed` that also ends where `ends` says, given the reply's tokens so far.
fn generate_until(
    model: &CausalLm,
    prompt_ids: &[u32],
    stop: &[u32],
    settings: &GenerationSettings,
    ends: &mut dyn FnMut(&[u32]) -> anyhow::Result<bool>,
) -> anyhow::Result<Generation> {
    let mut sampler = Sampler::new(settings.sampling_params())?;
    let mut caches: Vec<KvCache> = (0..model.layers.len()).map(|_| KvCache::default()).collect();
    // a reply stops at the model's last position (a prompt past it is an error)
    let max_pos = model.config().max_position_embeddings;
    anyhow::ensure!(
        prompt_ids.len() <= max_pos,
        "the prompt is {} tokens, past the model's max_position_embeddings ({max_pos})",
        prompt_ids.len()
    );
    let mut input = prompt_ids.to_vec();
    let mut out = Generation::new();
    for _ in 0..settings.max_new_tokens {
        if prompt_ids.len() + out.tokens.len() >= max_pos && !out.tokens.is_empty() {
            break;
        }
        let ids = Tensor::new(input.as_slice(), model.device())?.unsqueeze(0)?;
        // the last position's logits alone: a prompt's other positions need none
        let last = model.forward_last(&ids, Some(&mut caches))?.squeeze(0)?;
        if !out.step(&mut sampler, &logits_row(&last)?, prompt_ids, stop, ends)? {
            break;
        }
        input = out.tokens[out.tokens.len() - 1..].to_vec();
    }
    Ok(out)
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
    let replies = generate_many_detailed(model, prompts, stop, settings)?;
    Ok(replies.into_iter().map(|g| g.tokens).collect())
}

/// `generate_many` with each token's log-probs and the reason each reply ended.
pub fn generate_many_detailed(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    stop: &[u32],
    settings: &GenerationSettings,
) -> anyhow::Result<Vec<Generation>> {
    generate_many_until(model, prompts, stop, settings, None, &mut |_| Ok(false))
}

/// `generate_many_detailed` that also ends a reply where `ends` says, given its tokens so far.
fn generate_many_until(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    stop: &[u32],
    settings: &GenerationSettings,
    seeds: Option<&[u64]>,
    ends: &mut dyn FnMut(&[u32]) -> anyhow::Result<bool>,
) -> anyhow::Result<Vec<Generation>> {
    let max_pos = model.config().max_position_embeddings;
    let params = settings.sampling_params();
    params.validate()?;
    let mut outs: Vec<Generation> = prompts.iter().map(|_| Generation::new()).collect();
    // the unfinished replies: prompt index and sampler; their caches layer by layer
    let mut live: Vec<(usize, Sampler)> = Vec::new();
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
        let seed = seeds.map_or(params.seed, |seeds| seeds[i]);
        let mut sampler = Sampler::new(SamplingParams { seed, ..params.clone() })?;
        let logits = logits_row(&model.forward_last(&ids, Some(&mut own))?.squeeze(0)?)?;
        if !outs[i].step(&mut sampler, &logits, prompt, stop, ends)? {
            continue;
        }
        for (layer, cache) in caches.iter_mut().zip(own) {
            layer.push(cache);
        }
        live.push((i, sampler));
    }
    loop {
        // a reply ends at max_new_tokens or at the model's last position
        let done: Vec<usize> = (0..live.len())
            .filter(|&r| {
                let i = live[r].0;
                let n = outs[i].tokens.len();
                n >= settings.max_new_tokens || prompts[i].len() + n >= max_pos
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
        // a live reply has at least its first token
        let last: Vec<u32> = live.iter().map(|(i, _)| outs[*i].tokens.last().copied().unwrap_or(0)).collect();
        let ids = Tensor::new(last.as_slice(), model.device())?.unsqueeze(1)?;
        let logits = model.forward_last_rows(&ids, &mut caches)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut stopped = Vec::new();
        for (r, (i, sampler)) in live.iter_mut().enumerate() {
            if !outs[*i].step(sampler, &logits[r], &prompts[*i], stop, ends)? {
                stopped.push(r);
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
    let replies = replies_detailed(model, tokenizer, conversations, (stop, None), settings)?;
    Ok(replies.into_iter().map(|(text, _, _)| text).collect())
}

/// Whether a reply's tokens so far hold one of `stops` in their text (none: never); empty stop
/// strings are an error.
fn stop_strings_end<'a>(
    tokenizer: &'a Tokenizer,
    stops: &'a [String],
) -> anyhow::Result<impl FnMut(&[u32]) -> anyhow::Result<bool> + 'a> {
    stop::check_stop_strings(stops)?;
    Ok(move |ids: &[u32]| Ok(!stops.is_empty() && cut_at_stop(&decode_reply(tokenizer, ids)?, stops).1))
}

/// The text of a reply's tokens, cut before its first stop string.
fn reply_text(tokenizer: &Tokenizer, ids: &[u32], stops: &[String]) -> anyhow::Result<String> {
    Ok(cut_at_stop(&decode_reply(tokenizer, ids)?, stops).0)
}

/// Replies to `conversations` generated together (each drawn with its own seed where `seeds`
/// gives them, else all with the settings'), with the prompt's length and the reply's tokens and
/// finish reason: what `lora-ft generate` writes.
pub fn replies_detailed(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    conversations: &[(&[Message], Option<&[Value]>)],
    (stop, seeds): (&[u32], Option<&[u64]>),
    settings: &GenerationSettings,
) -> anyhow::Result<Vec<(String, usize, Generation)>> {
    anyhow::ensure!(seeds.is_none_or(|s| s.len() == conversations.len()), "a seed per conversation");
    let prompts = conversations
        .iter()
        .map(|(messages, tools)| prompt_ids(tokenizer, messages, *tools))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut ends = stop_strings_end(tokenizer.tokenizer(), &settings.stop_strings)?;
    let replies = generate_many_until(model, &prompts, stop, settings, seeds, &mut ends)?;
    prompts
        .iter()
        .zip(replies)
        .map(|(prompt, g)| {
            Ok((reply_text(tokenizer.tokenizer(), &g.tokens, &settings.stop_strings)?, prompt.len(), g))
        })
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
    let mut ends = stop_strings_end(tokenizer.tokenizer(), &settings.stop_strings)?;
    let reply = generate_until(model, &prompt_ids(tokenizer, messages, tools)?, stop, settings, &mut ends)?;
    reply_text(tokenizer.tokenizer(), &reply.tokens, &settings.stop_strings)
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
