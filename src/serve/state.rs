//! What every handler shares: the engine, the tokenizer and chat template, the served names and
//! the limits of the command line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::errors::ApiError;
use crate::data::ChatTokenizer;
use crate::generate::engine::Engine;

/// The server's settings (`lora-ft serve`'s flags).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The base model's name in `model` fields and `/v1/models`.
    pub served_model_name: String,
    /// Required as `Authorization: Bearer KEY` on /v1/* where set.
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// The most new tokens one request may ask for.
    pub max_tokens: usize,
    pub request_timeout: Duration,
    /// Where `/v1/load_lora_adapter` may load adapters from (canonical); `None` turns it off.
    pub adapter_dir: Option<PathBuf>,
}

/// The handlers' state.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub tokenizer: Arc<ChatTokenizer>,
    pub options: Arc<ServeOptions>,
    /// When the server started (Unix seconds): the models' `created`.
    pub started: u64,
}

impl AppState {
    pub fn new(engine: Engine, tokenizer: ChatTokenizer, options: ServeOptions) -> Self {
        Self { engine, tokenizer: Arc::new(tokenizer), options: Arc::new(options), started: now() }
    }

    /// The engine's adapter for a request's `model`: `None` for the base (or no `model`), the
    /// adapter's name for a loaded adapter, else a 404.
    pub fn adapter_for(&self, model: Option<&str>) -> Result<Option<String>, ApiError> {
        match model {
            None => Ok(None),
            Some(m) if m == self.options.served_model_name => Ok(None),
            Some(m) if self.engine.adapters().iter().any(|a| a == m) => Ok(Some(m.to_string())),
            Some(m) => Err(ApiError::model_not_found(m)),
        }
    }

    /// The name a response gives for a request's model.
    pub fn model_name(&self, adapter: &Option<String>) -> String {
        adapter.clone().unwrap_or_else(|| self.options.served_model_name.clone())
    }
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A response id: `prefix` and 24 random hex digits.
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:024x}", rand::random::<u128>() >> 32)
}
