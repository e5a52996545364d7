//! STUB until main's engine lands: the engine's API, requests answered one at a time with
//! `generate_detailed` (no batching, no adapters). Replaced whole by main's `engine` at the merge.

use std::sync::mpsc;

use tokenizers::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::generate::sampling::{Sampled, SamplingParams};
use crate::generate::stop::{FinishReason, StopMatcher};
use crate::generate::{decode_reply, generate_detailed, GenerationSettings};
use crate::model::CausalLm;

pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub seeds: Vec<u64>,
    pub max_new_tokens: usize,
    pub stop_strings: Vec<String>,
    pub adapter: Option<String>,
}

#[derive(Debug)]
pub enum Event {
    Token { index: usize, sampled: Sampled, text: String },
    Finished { index: usize, reason: FinishReason, text: String, completion_tokens: usize },
    Failed(String),
}

pub struct EngineConfig {
    pub max_batch: usize,
}

#[derive(Clone)]
pub struct Engine {
    jobs: mpsc::Sender<(Request, UnboundedSender<Event>)>,
    max_context: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is {prompt} tokens, past the model's context of {max}")]
    PromptTooLong { prompt: usize, max: usize },
    #[error("no adapter named {0:?}")]
    UnknownAdapter(String),
    #[error("{0}")]
    InvalidParams(String),
    #[error("the engine has stopped")]
    Stopped,
}

impl Engine {
    pub fn start(
        model: CausalLm,
        tokenizer: Tokenizer,
        stop_ids: Vec<u32>,
        _config: EngineConfig,
    ) -> anyhow::Result<Engine> {
        let max_context = model.config().max_position_embeddings;
        let (jobs, rx) = mpsc::channel::<(Request, UnboundedSender<Event>)>();
        std::thread::spawn(move || {
            for (request, tx) in rx {
                if let Err(e) = run(&model, &tokenizer, &stop_ids, &request, &tx) {
                    let _ = tx.send(Event::Failed(format!("{e:#}")));
                }
            }
        });
        Ok(Engine { jobs, max_context })
    }

    pub fn submit(&self, request: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        if request.prompt.len() >= self.max_context {
            return Err(SubmitError::PromptTooLong { prompt: request.prompt.len(), max: self.max_context });
        }
        if let Some(name) = &request.adapter {
            return Err(SubmitError::UnknownAdapter(name.clone()));
        }
        request.params.validate().map_err(|e| SubmitError::InvalidParams(e.to_string()))?;
        let (tx, rx) = unbounded_channel();
        self.jobs.send((request, tx)).map_err(|_| SubmitError::Stopped)?;
        Ok(rx)
    }

    pub fn add_adapter(&self, name: &str, _dir: &std::path::Path) -> anyhow::Result<()> {
        anyhow::bail!("stub engine: no adapters ({name})")
    }

    pub fn remove_adapter(&self, name: &str) -> anyhow::Result<()> {
        anyhow::bail!("stub engine: no adapter {name}")
    }

    pub fn adapters(&self) -> Vec<String> {
        Vec::new()
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }
}

fn run(
    model: &CausalLm,
    tokenizer: &Tokenizer,
    stop: &[u32],
    r: &Request,
    tx: &UnboundedSender<Event>,
) -> anyhow::Result<()> {
    for (index, &seed) in r.seeds.iter().enumerate() {
        if tx.is_closed() {
            return Ok(());
        }
        let p = &r.params;
        let settings = GenerationSettings {
            max_new_tokens: r.max_new_tokens,
            temperature: p.temperature,
            top_p: Some(p.top_p),
            seed,
            top_k: p.top_k,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            logprobs: p.logprobs,
            stop_strings: Vec::new(),
        };
        let g = generate_detailed(model, &r.prompt, stop, &settings)?;
        let mut matcher = StopMatcher::new(&r.stop_strings)?;
        let mut decoded = String::new();
        let mut reason = g.finish;
        let mut count = 0;
        for (i, sampled) in g.sampled.iter().enumerate() {
            let full = decode_reply(tokenizer, &g.tokens[..=i])?;
            let piece = if full.ends_with('\u{fffd}') {
                String::new()
            } else {
                full[decoded.len().min(full.len())..].to_string()
            };
            if !piece.is_empty() {
                decoded = full;
            }
            let text = matcher.push(&piece);
            count += 1;
            let _ = tx.send(Event::Token { index, sampled: sampled.clone(), text });
            if matcher.stopped() {
                reason = FinishReason::Stop;
                break;
            }
        }
        let rest = matcher.finish();
        let _ = tx.send(Event::Finished { index, reason, text: rest, completion_tokens: count });
    }
    Ok(())
}
