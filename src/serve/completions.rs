//! `POST /v1/completions`: a raw `prompt` (a string or a list of them, each tokenized with the
//! tokenizer's special tokens as vLLM does, `generate::text_prompt_ids`) continued without the
//! chat template, and the whole `text_completion` response.

use serde::Deserialize;
use serde_json::{json, Value};

use super::body::typed;
use super::chat::usage;
use super::errors::ApiError;
use super::events::Choice;
use super::logprobs;
use super::params::{Generation, GenerationFields, MAX_TOP_LOGPROBS};
use super::state::{now, AppState};
use crate::generate::engine::Request;
use crate::generate::text_prompt_ids;

/// `prompt`: a string or a list of strings (token-id prompts are not taken).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    One(String),
    Many(Vec<String>),
}

/// The completions' own fields.
#[derive(Debug, Deserialize)]
struct CompletionBody {
    prompt: Prompt,
    /// How many top log-probs each token carries (the legacy API's integer).
    logprobs: Option<usize>,
    echo: Option<bool>,
    suffix: Option<String>,
}

/// A checked completions request: one engine request per prompt.
pub struct CompletionJob {
    pub requests: Vec<Request>,
    pub generation: Generation,
    pub model: String,
    pub prompt_tokens: usize,
}

/// The request body checked and tokenized into the engine's requests.
pub fn prepare(state: &AppState, body: &Value) -> Result<CompletionJob, ApiError> {
    if body.get("prompt").is_none_or(Value::is_null) {
        return Err(ApiError::field("prompt", "prompt is required (a string or a list of strings)"));
    }
    let own: CompletionBody = typed(body).map_err(|e| match e.param.as_deref() {
        Some("prompt") => ApiError::field("prompt", "prompt must be a string or a list of strings"),
        _ => e,
    })?;
    let fields: GenerationFields = typed(body)?;
    if own.echo == Some(true) {
        return Err(ApiError::field("echo", "echo is not supported"));
    }
    if own.suffix.is_some() {
        return Err(ApiError::field("suffix", "suffix is not supported"));
    }
    if own.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
        return Err(ApiError::field("logprobs", format!("logprobs must be in [0, {MAX_TOP_LOGPROBS}]")));
    }
    let adapter = state.adapter_for(fields.model.as_deref())?;
    let generation = fields.generation(own.logprobs, state.options.max_tokens)?;
    let prompts = match own.prompt {
        Prompt::One(p) => vec![p],
        Prompt::Many(list) if list.is_empty() => {
            return Err(ApiError::field("prompt", "prompt is an empty list"))
        }
        Prompt::Many(list) => list,
    };
    let mut requests = Vec::with_capacity(prompts.len());
    let mut prompt_tokens = 0;
    for text in &prompts {
        let ids =
            text_prompt_ids(state.tokenizer.tokenizer(), text).map_err(|e| ApiError::field("prompt", e))?;
        let max_new_tokens =
            generation.budget(ids.len(), state.engine.max_context(), state.options.max_tokens, "prompt")?;
        prompt_tokens += ids.len();
        requests.push(Request {
            prompt: ids,
            params: generation.params.clone(),
            seeds: generation.seeds.clone(),
            max_new_tokens,
            stop_strings: generation.stop.clone(),
            adapter: adapter.clone(),
            constraint: None,
        });
    }
    Ok(CompletionJob { requests, generation, model: state.model_name(&adapter), prompt_tokens })
}

/// The whole `text_completion` response.
pub fn response(state: &AppState, job: &CompletionJob, id: &str, choices: &[Choice]) -> Value {
    let items: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = match job.generation.params.logprobs {
                Some(_) => logprobs::completion(state.tokenizer.tokenizer(), &c.tokens, 0),
                None => Value::Null,
            };
            let finish = c.finish.map_or("stop", |f| f.as_str());
            json!({"index": i, "text": c.text, "logprobs": lp, "finish_reason": finish})
        })
        .collect();
    let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
    json!({
        "id": id,
        "object": "text_completion",
        "created": now(),
        "model": job.model,
        "choices": items,
        "usage": usage(job.prompt_tokens, completion),
    })
}
