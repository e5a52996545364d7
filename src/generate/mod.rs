//! Text generation for `lora-ft chat`, `generate` and the eval prompts: the model's chat template,
//! greedy or sampled decoding (`sampling`), stopping at the end-of-turn / end-of-sequence tokens
//! and stop strings (`stop`), all on the decoding engine (`engine`: continuous batching over KV
//! caches, the server's too).

pub mod completions;
pub mod constrained;
pub mod engine;
pub mod prompts;
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
use minijinja::Value;
use tokenizers::Tokenizer;

use crate::data::{ChatTokenizer, Message};
use crate::model::CausalLm;
use engine::scheduler::Scheduler;
use engine::text::ReplyText;
use engine::{Event, Request};
use sampling::{Sampled, SamplingParams};
use stop::FinishReason;

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
    let mut replies = generate_many_detailed(model, &[prompt_ids.to_vec()], stop, settings)?;
    replies.pop().context("one reply")
}

/// `generate` of several prompts together on the engine's scheduler: each prompt's own forward
/// first, then one step for every unfinished reply at a time, so that a step reads each weight
/// once for all of them instead of once per reply. Each reply has its own sampler, seeded as
/// `generate` seeds it: a reply is the one `generate` gives, up to the rounding of products over
/// several rows.
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
    let replies = run_to_end(model, None, prompts, (stop, None), settings)?;
    Ok(replies.into_iter().map(|(g, _)| g).collect())
}

/// Every prompt's reply (with its text where `text` is given, cut before a stop string), all of
/// them in one batch of the scheduler, run until the last ends.
fn run_to_end(
    model: &CausalLm,
    text: Option<&ReplyText>,
    prompts: &[Vec<u32>],
    (stop, seeds): (&[u32], Option<&[u64]>),
    settings: &GenerationSettings,
) -> anyhow::Result<Vec<(Generation, String)>> {
    let params = settings.sampling_params();
    params.validate()?;
    stop::check_stop_strings(&settings.stop_strings)?;
    // a slot for every prompt, each as long as the longest prompt and its reply
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let capacity = longest.saturating_add(settings.max_new_tokens);
    let mut scheduler = Scheduler::new(model, text, stop.to_vec(), (prompts.len(), capacity))?;
    let mut channels = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let request = Request {
            prompt: prompt.clone(),
            params: params.clone(),
            seeds: vec![seeds.map_or(params.seed, |s| s[i])],
            max_new_tokens: settings.max_new_tokens,
            stop_strings: settings.stop_strings.clone(),
            adapter: None,
            constraint: None,
        };
        let (sink, events) = tokio::sync::mpsc::unbounded_channel();
        scheduler.add(request, sink).map_err(|e| anyhow::anyhow!("prompt {i}: {e}"))?;
        channels.push(events);
    }
    while !scheduler.is_idle() {
        scheduler.step()?;
    }
    channels.into_iter().map(collect_reply).collect()
}

/// A finished reply from its channel's events.
fn collect_reply(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> anyhow::Result<(Generation, String)> {
    let (mut out, mut text) = (Generation::new(), String::new());
    while let Ok(event) = events.try_recv() {
        match event {
            Event::Token { sampled, text: piece, .. } => {
                out.tokens.push(sampled.token);
                out.sampled.push(sampled);
                text.push_str(&piece);
            }
            Event::Finished { reason, text: piece, .. } => {
                out.finish = reason;
                text.push_str(&piece);
                return Ok((out, text));
            }
            Event::Failed(message) => anyhow::bail!("{message}"),
        }
    }
    anyhow::bail!("a reply ended without finishing")
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
    let prompts = conversations
        .iter()
        .map(|(messages, tools)| chat_prompt_ids(tokenizer, messages, *tools))
        .collect::<anyhow::Result<Vec<_>>>()?;
    replies_to_ids(model, tokenizer.tokenizer(), &prompts, (stop, seeds), settings)
}

/// `replies_detailed` of prompts already tokenized (rendered conversations, or raw text):
/// each reply's text, its prompt's length, its tokens and finish reason.
pub fn replies_to_ids(
    model: &CausalLm,
    tokenizer: &Tokenizer,
    prompts: &[Vec<u32>],
    (stop, seeds): (&[u32], Option<&[u64]>),
    settings: &GenerationSettings,
) -> anyhow::Result<Vec<(String, usize, Generation)>> {
    anyhow::ensure!(seeds.is_none_or(|s| s.len() == prompts.len()), "a seed per prompt");
    let text = ReplyText::new(tokenizer);
    let replies = run_to_end(model, Some(&text), prompts, (stop, seeds), settings)?;
    Ok(prompts.iter().zip(replies).map(|(prompt, (g, text))| (text, prompt.len(), g)).collect())
}

/// A raw text prompt's ids, as vLLM's and OpenAI's completions take `prompt`: tokenized with
/// the tokenizer's special tokens (its BOS where its post-processor adds one), no chat template.
/// The error says why where the text cannot be tokenized or comes to no tokens.
pub fn text_prompt_ids(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    let ids =
        tokenizer.encode(text, true).map_err(|e| format!("tokenizing the prompt: {e}"))?.get_ids().to_vec();
    if ids.is_empty() {
        return Err("a prompt must not be empty".into());
    }
    Ok(ids)
}

/// The conversation rendered with the chat template (tools given, generation prompt on) and
/// tokenized.
pub fn chat_prompt_ids(
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
    let mut replies = replies_detailed(model, tokenizer, &[(messages, tools)], (stop, None), settings)?;
    Ok(replies.pop().context("one reply")?.0)
}

/// The text of generated ids: special tokens dropped, except those that carry a tool call
/// (`TOOL_CALL_TOKENS`: Mistral's `[TOOL_CALLS]`, Llama's `<|python_tag|>`, ...), which the
/// tool-call parser reads.
pub fn decode_reply(tokenizer: &Tokenizer, ids: &[u32]) -> anyhow::Result<String> {
    ReplyText::new(tokenizer).decode(ids)
}
