//! One sample being generated: its sampler, tokens, slot of the KV cache, text so far, and the channel its
//! events go to (closed: the client is gone, and the sequence is dropped).

use std::sync::Arc;

use crate::generate::constrained::matcher::Grammar;
use crate::generate::sampling::{Sampled, Sampler};
use crate::generate::stop::{FinishReason, StopMatcher};
use crate::model::DecoderLayer;

use super::constraint::TokenConstraint;
use super::request::{Event, Request};
use super::text::{Detokenizer, ReplyText};

/// What the samples of one request share: the prompt, the adapter's layers (`None`: the
/// model's), how long a reply may grow, its stop strings, its grammar, and where its events go.
pub struct Job {
    pub prompt: Vec<u32>,
    pub layers: Option<Arc<Vec<DecoderLayer>>>,
    pub max_new_tokens: usize,
    pub stop_strings: Vec<String>,
    pub constraint: Option<Arc<Grammar>>,
    pub sink: tokio::sync::mpsc::UnboundedSender<Event>,
}

impl Job {
    /// The job of `request` through `layers`, its events into `sink`.
    pub fn of(
        request: Request,
        layers: Option<Arc<Vec<DecoderLayer>>>,
        sink: tokio::sync::mpsc::UnboundedSender<Event>,
    ) -> Self {
        let Request { prompt, max_new_tokens, stop_strings, constraint, .. } = request;
        Self { prompt, layers, max_new_tokens, stop_strings, constraint, sink }
    }

    /// Whether two jobs decode through the same layers (and so in one batch).
    pub fn same_layers(&self, other: &Job) -> bool {
        match (&self.layers, &other.layers) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Whether nobody reads this job's events any more.
    pub fn abandoned(&self) -> bool {
        self.sink.is_closed()
    }

    /// Sends an event; a reader gone is noticed by `abandoned` before the next step.
    pub fn send(&self, event: Event) {
        let _ = self.sink.send(event);
    }
}

pub struct Sequence {
    pub job: Arc<Job>,
    /// Which sample of its job this is.
    pub index: usize,
    pub sampler: Sampler,
    pub tokens: Vec<u32>,
    /// Its slot in the scheduler's KV cache.
    pub slot: usize,
    detokenizer: Detokenizer,
    stops: StopMatcher,
    constraint: Option<TokenConstraint>,
}

impl Sequence {
    /// Sample `index` of `job`; a job's grammar is followed through `text`'s token texts, the
    /// reply ended by `stop_ids` where the grammar may end.
    pub fn new(
        job: Arc<Job>,
        (index, sampler, slot): (usize, Sampler, usize),
        text: Option<&ReplyText>,
        stop_ids: &[u32],
    ) -> anyhow::Result<Self> {
        let stops = StopMatcher::new(&job.stop_strings)?;
        let constraint = match (&job.constraint, text) {
            (None, _) => None,
            (Some(grammar), Some(text)) => {
                Some(TokenConstraint::new(grammar.matcher(), text.token_texts(), stop_ids))
            }
            (Some(_), None) => anyhow::bail!("a constrained reply needs the tokenizer"),
        };
        let detokenizer = Detokenizer::default();
        Ok(Self { job, index, sampler, tokens: Vec::new(), slot, detokenizer, stops, constraint })
    }

    /// Whether the next token is the logits' argmax with nothing to mask (the GPU may pick it).
    #[cfg(feature = "cuda")]
    pub fn plain_greedy(&self) -> bool {
        self.sampler.plain_greedy() && self.constraint.is_none()
    }

    /// The position the next step writes (the cached length: the prompt and every token but the
    /// last, which the step reads).
    pub fn position(&self) -> usize {
        self.job.prompt.len() + self.tokens.len().saturating_sub(1)
    }

    /// The token the next step reads (the last one sampled).
    pub fn last_token(&self) -> Option<u32> {
        self.tokens.last().copied()
    }

    /// The next token drawn from `logits` by the sequence's sampler.
    pub fn sample(&mut self, logits: &[f32]) -> anyhow::Result<Sampled> {
        match &self.constraint {
            None => self.sampler.sample(logits, &self.job.prompt, &self.tokens),
            Some(constraint) => {
                let masked = constraint.masked(logits)?;
                self.sampler.sample(&masked, &self.job.prompt, &self.tokens)
            }
        }
    }

    /// Takes the next token (chosen by `sample`, or on the device) and sends it with the text it
    /// releases; false when the sequence ended (a stop id, which is not kept; a stop string; its
    /// grammar's end;
    /// length; or the model's last position or the cache's, `limit`), its `Finished` sent.
    pub fn accept(
        &mut self,
        next: Sampled,
        text: Option<&ReplyText>,
        stop_ids: &[u32],
        limit: usize,
    ) -> anyhow::Result<bool> {
        if stop_ids.contains(&next.token) {
            self.finish(FinishReason::Stop, text)?;
            return Ok(false);
        }
        let complete = match &mut self.constraint {
            Some(constraint) => constraint.accept(next.token)?,
            None => false,
        };
        self.tokens.push(next.token);
        let piece = match text {
            Some(text) => self.stops.push(&self.detokenizer.push(text, next.token)?),
            None => String::new(),
        };
        self.job.send(Event::Token { index: self.index, sampled: next, text: piece });
        if self.stops.stopped() || complete {
            self.finish(FinishReason::Stop, text)?;
            return Ok(false);
        }
        if self.tokens.len() >= self.job.max_new_tokens || self.job.prompt.len() + self.tokens.len() >= limit
        {
            self.finish(FinishReason::Length, text)?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Sends the held-back rest of the text and why the sequence ended.
    fn finish(&mut self, reason: FinishReason, text: Option<&ReplyText>) -> anyhow::Result<()> {
        let mut rest = match text {
            Some(text) => self.stops.push(&self.detokenizer.finish(text)?),
            None => String::new(),
        };
        rest.push_str(&self.stops.finish());
        let completion_tokens = self.tokens.len();
        self.job.send(Event::Finished { index: self.index, reason, text: rest, completion_tokens });
        Ok(())
    }
}
