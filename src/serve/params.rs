//! The generation fields that chat and text completions share (`max_tokens`, `temperature`,
//! `top_p`, `top_k`, `min_p`, the penalties, `seed`, `n`, `stop`, `stream`), checked into the
//! engine's sampling parameters, seeds and token budget; every value out of range is a 400 naming
//! its field.

use serde::Deserialize;

use super::errors::ApiError;
use crate::generate::sampling::SamplingParams;

/// The most samples one request may ask for (`n`).
pub const MAX_N: usize = 16;
/// The most top log-probs a token may carry (`top_logprobs`, the completions' `logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The fields both endpoints read; others in the body are ignored, as OpenAI's API does.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerationFields {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// vLLM's: -1 (or 0) keeps every token.
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<u64>,
    pub n: Option<usize>,
    pub stop: Option<Stop>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

/// What the fields ask of the engine, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub params: SamplingParams,
    /// One per sample (`n` of them).
    pub seeds: Vec<u64>,
    /// `max_completion_tokens` or `max_tokens`, where given (the context's room otherwise).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

impl GenerationFields {
    /// The checked request, its token log-probs as `logprobs` asks (`None`: none). OpenAI's
    /// default temperature is 1.
    pub fn generation(&self, logprobs: Option<usize>, max_tokens_cap: usize) -> Result<Generation, ApiError> {
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => {
                return Err(ApiError::field("top_k", format!("top_k must be -1 (all) or >= 1, got {k}")))
            }
        };
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed: 0,
            logprobs,
        };
        params.validate().map_err(|e| {
            let message = e.to_string();
            let param = message.split_whitespace().next().unwrap_or("").to_string();
            ApiError::field(&param, message)
        })?;
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::field("n", format!("n must be in [1, {MAX_N}], got {n}")));
        }
        let (max_tokens, name) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => (Some(m), "max_completion_tokens"),
            (None, m) => (m, "max_tokens"),
        };
        match max_tokens {
            Some(0) => return Err(ApiError::field(name, format!("{name} must be at least 1"))),
            Some(m) if m > max_tokens_cap => {
                return Err(ApiError::field(
                    name,
                    format!(
                    "{name} is {m}, more than this server allows a request ({max_tokens_cap}, --max-tokens)"
                ),
                ))
            }
            _ => {}
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(list)) => list.clone(),
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::field("stop", "stop strings must not be empty"));
        }
        if stop.len() > 16 {
            return Err(ApiError::field("stop", "at most 16 stop strings"));
        }
        // a seed given makes the samples repeatable; sample i draws with seed + i
        let first = self.seed.unwrap_or_else(rand::random);
        let seeds = (0..n as u64).map(|i| first.wrapping_add(i)).collect();
        Ok(Generation {
            params,
            seeds,
            max_tokens,
            stop,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        })
    }
}

impl Generation {
    /// The new tokens a prompt of `prompt` tokens may have: the request's `max_tokens` if the
    /// context holds it (else a 400 naming `what`, `messages` or `prompt`, as vLLM answers), or
    /// the room left, at most `cap`.
    pub fn budget(&self, prompt: usize, context: usize, cap: usize, what: &str) -> Result<usize, ApiError> {
        if prompt >= context {
            return Err(ApiError::field(
                what,
                format!(
                    "This model's maximum context length is {context} tokens. However, your {what} resulted \
                     in {prompt} tokens, leaving no room for a completion. Please reduce the length of the {what}."
                ),
            ));
        }
        match self.max_tokens {
            Some(m) if prompt + m > context => Err(ApiError::field(
                what,
                format!(
                    "This model's maximum context length is {context} tokens. However, you requested {} tokens \
                     ({prompt} in the {what}, {m} in the completion). Please reduce the length of the {what} \
                     or completion.",
                    prompt + m
                ),
            )),
            Some(m) => Ok(m),
            None => Ok(cap.min(context - prompt)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: serde_json::Value) -> GenerationFields {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn defaults_are_openais() {
        let g = fields(serde_json::json!({})).generation(None, 100).unwrap();
        assert_eq!(g.params.temperature, 1.0);
        assert_eq!(g.seeds.len(), 1);
        assert!(!g.stream);
        let g = fields(serde_json::json!({"n": 3, "seed": 5, "stop": "x", "top_k": -1}))
            .generation(Some(2), 100)
            .unwrap();
        assert_eq!(g.seeds, [5, 6, 7]);
        assert_eq!(g.stop, ["x"]);
        assert_eq!(g.params.top_k, None);
        assert_eq!(g.params.logprobs, Some(2));
    }

    #[test]
    fn values_out_of_range_name_their_field() {
        for (json, param) in [
            (serde_json::json!({"temperature": -1.0}), "temperature"),
            (serde_json::json!({"top_p": 0.0}), "top_p"),
            (serde_json::json!({"top_k": -2}), "top_k"),
            (serde_json::json!({"min_p": 2.0}), "min_p"),
            (serde_json::json!({"presence_penalty": 3.0}), "presence_penalty"),
            (serde_json::json!({"frequency_penalty": -3.0}), "frequency_penalty"),
            (serde_json::json!({"repetition_penalty": 0.0}), "repetition_penalty"),
            (serde_json::json!({"n": 0}), "n"),
            (serde_json::json!({"n": 17}), "n"),
            (serde_json::json!({"max_tokens": 0}), "max_tokens"),
            (serde_json::json!({"max_tokens": 101}), "max_tokens"),
            (serde_json::json!({"max_completion_tokens": 101}), "max_completion_tokens"),
            (serde_json::json!({"stop": ["a", ""]}), "stop"),
        ] {
            let e = fields(json.clone()).generation(None, 100).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{json}: {}", e.message);
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn the_budget_stays_in_the_context() {
        let g = fields(serde_json::json!({})).generation(None, 100).unwrap();
        assert_eq!(g.budget(10, 50, 100, "prompt").unwrap(), 40);
        assert_eq!(g.budget(10, 500, 100, "prompt").unwrap(), 100);
        assert_eq!(g.budget(50, 50, 100, "prompt").unwrap_err().param.as_deref(), Some("prompt"));
        let g = fields(serde_json::json!({"max_tokens": 41})).generation(None, 100).unwrap();
        let e = g.budget(10, 50, 100, "messages").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("maximum context length is 50"), "{}", e.message);
        assert_eq!(g.budget(9, 50, 100, "messages").unwrap(), 41);
    }
}
