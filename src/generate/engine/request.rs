//! What a request to the engine is, what comes back on its channel, and why one is refused.

use std::sync::Arc;

use crate::generate::constrained::matcher::Grammar;
use crate::generate::sampling::{Sampled, SamplingParams};
use crate::generate::stop::FinishReason;

/// What to generate: `seeds.len()` samples of one prompt (they share its prefill), each drawn
/// with `params` and its own seed (`params.seed` is not read).
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub seeds: Vec<u64>,
    pub max_new_tokens: usize,
    /// Matched over the detokenized text; a reply's text ends before the first it contains.
    pub stop_strings: Vec<String>,
    /// An adapter given to `Engine::add_adapter`; `None` is the model as loaded.
    pub adapter: Option<String>,
    /// A grammar every sample's reply follows (constrained decoding: tokens it does not allow
    /// next are masked before sampling); the reply ends where the grammar must.
    pub constraint: Option<Arc<Grammar>>,
}

/// What a request's channel carries, in the order it happens for each sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Sample `index`'s next token and the text it releases (empty while it may begin a stop
    /// string or ends in an incomplete character).
    Token { index: usize, sampled: Sampled, text: String },
    /// Sample `index` ended: why, the rest of its text, its token count.
    Finished { index: usize, reason: FinishReason, text: String, completion_tokens: usize },
    /// The request failed in the engine; nothing follows.
    Failed(String),
}

/// Why a request was refused before it was queued.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is {prompt} tokens, past the model's context of {max}")]
    PromptTooLong { prompt: usize, max: usize },
    #[error("no adapter named {0:?} is loaded")]
    UnknownAdapter(String),
    #[error("{0}")]
    InvalidParams(String),
    #[error("the engine has stopped")]
    Stopped,
}
