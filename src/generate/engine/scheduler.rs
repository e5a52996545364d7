//! Continuous batching: requests wait in a queue; each step first admits the waiting ones that fit
//! in the batch (the prompt's prefill, once for all its samples, whose caches are forks of it),
//! then decodes one token for every live sequence, the sequences of one adapter in one forward
//! (each weight read once for all of them). A finished or abandoned sequence leaves the batch at
//! once, and its place goes to the next waiting request in the same step.

use std::collections::VecDeque;
use std::sync::Arc;

use candle_core::{DType, Tensor};

use crate::generate::sampling::Sampler;
use crate::generate::stop::{check_stop_strings, FinishReason};
use crate::model::{CausalLm, DecoderLayer, KvCache};

use super::request::{Event, Request, SubmitError};
use super::sequence::{Job, Sequence};
use super::text::ReplyText;

pub struct Scheduler<'m> {
    model: &'m CausalLm,
    /// `None`: no text (token ids alone, no stop strings).
    text: Option<&'m ReplyText<'m>>,
    stop_ids: Vec<u32>,
    /// Sequences decoded together at most.
    max_batch: usize,
    waiting: VecDeque<(Arc<Job>, Vec<Sampler>)>,
    live: Vec<Sequence>,
}

/// The samplers of a request's samples, or what is wrong with it, for a model of `max_pos`
/// positions (with text or without).
pub fn validate(request: &Request, max_pos: usize, has_text: bool) -> Result<Vec<Sampler>, SubmitError> {
    if request.prompt.is_empty() {
        return Err(SubmitError::InvalidParams("the prompt is empty".into()));
    }
    if request.prompt.len() > max_pos {
        return Err(SubmitError::PromptTooLong { prompt: request.prompt.len(), max: max_pos });
    }
    if request.seeds.is_empty() {
        return Err(SubmitError::InvalidParams("a request needs at least one sample (a seed each)".into()));
    }
    if !request.stop_strings.is_empty() && !has_text {
        return Err(SubmitError::InvalidParams("stop strings need the tokenizer".into()));
    }
    check_stop_strings(&request.stop_strings).map_err(|e| SubmitError::InvalidParams(e.to_string()))?;
    request
        .seeds
        .iter()
        .map(|&seed| {
            Sampler::new(crate::generate::sampling::SamplingParams { seed, ..request.params.clone() })
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map_err(|e| SubmitError::InvalidParams(e.to_string()))
}

impl<'m> Scheduler<'m> {
    pub fn new(
        model: &'m CausalLm,
        text: Option<&'m ReplyText<'m>>,
        stop_ids: Vec<u32>,
        max_batch: usize,
    ) -> Self {
        Self {
            model,
            text,
            stop_ids,
            max_batch: max_batch.max(1),
            waiting: VecDeque::new(),
            live: Vec::new(),
        }
    }

    /// Queues a request on the model's own layers (an adapter by name is the engine's).
    pub fn add(
        &mut self,
        request: Request,
        sink: tokio::sync::mpsc::UnboundedSender<Event>,
    ) -> Result<(), SubmitError> {
        if let Some(name) = &request.adapter {
            return Err(SubmitError::UnknownAdapter(name.clone()));
        }
        let samplers = validate(&request, self.max_pos(), self.text.is_some())?;
        self.enqueue(Job::of(request, None, sink), samplers);
        Ok(())
    }

    /// Queues a validated job with its samplers.
    pub fn enqueue(&mut self, job: Job, samplers: Vec<Sampler>) {
        self.waiting.push_back((Arc::new(job), samplers));
    }

    pub fn max_pos(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    /// Nothing waiting and nothing live.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.live.is_empty()
    }

    /// Sequences in the batch now.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Admits what fits, then decodes one token of every live sequence. An error of one
    /// request's prefill fails that request alone; an error of a decode step fails the
    /// sequences of that forward.
    pub fn step(&mut self) -> anyhow::Result<()> {
        self.live.retain(|s| !s.job.abandoned());
        self.waiting.retain(|(job, _)| !job.abandoned());
        while let Some((job, samplers)) = self.waiting.pop_front() {
            if !self.live.is_empty() && self.live.len() + samplers.len() > self.max_batch {
                self.waiting.push_front((job, samplers));
                break;
            }
            if let Err(e) = self.prefill(&job, samplers) {
                tracing::warn!("a request failed in its prefill: {e:#}");
                job.send(Event::Failed(format!("{e:#}")));
            }
        }
        self.decode()
    }

    /// Sends `Failed` to every request waiting or live and drops them (the engine goes on).
    pub fn fail_all(&mut self, message: &str) {
        for (job, _) in self.waiting.drain(..) {
            job.send(Event::Failed(message.to_string()));
        }
        for seq in self.live.drain(..) {
            seq.job.send(Event::Failed(message.to_string()));
        }
    }

    fn layers<'a>(&'a self, job: &'a Job) -> &'a [DecoderLayer] {
        job.layers.as_deref().map_or(&self.model.layers[..], |l| &l[..])
    }

    /// The prompt's forward once, its first token sampled for each sample, each sample on a
    /// fork of the prompt's caches.
    fn prefill(&mut self, job: &Arc<Job>, samplers: Vec<Sampler>) -> anyhow::Result<()> {
        if job.max_new_tokens == 0 {
            for index in 0..samplers.len() {
                let finished = Event::Finished {
                    index,
                    reason: FinishReason::Length,
                    text: String::new(),
                    completion_tokens: 0,
                };
                job.send(finished);
            }
            return Ok(());
        }
        let mut caches: Vec<KvCache> = (0..self.model.layers.len()).map(|_| KvCache::default()).collect();
        let ids = Tensor::new(job.prompt.as_slice(), self.model.device())?.unsqueeze(0)?;
        let logits = self.model.forward_last_of(self.layers(job), &ids, Some(&mut caches))?.squeeze(0)?;
        let logits = logits.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let n = samplers.len();
        for (index, sampler) in samplers.into_iter().enumerate() {
            let caches = match index + 1 == n {
                true => std::mem::take(&mut caches),
                false => caches.iter().map(KvCache::fork).collect::<candle_core::Result<Vec<_>>>()?,
            };
            let mut seq = Sequence::new(job.clone(), index, sampler, caches)?;
            if seq.advance(&logits, self.text, &self.stop_ids, self.max_pos())? {
                self.live.push(seq);
            }
        }
        Ok(())
    }

    /// One token for every live sequence, a forward per adapter.
    fn decode(&mut self) -> anyhow::Result<()> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for r in 0..self.live.len() {
            match groups.iter_mut().find(|g| self.live[g[0]].job.same_layers(&self.live[r].job)) {
                Some(group) => group.push(r),
                None => groups.push(vec![r]),
            }
        }
        let mut ended = vec![false; self.live.len()];
        let mut failure = None;
        for rows in groups {
            if let Err(e) = self.decode_rows(&rows, &mut ended) {
                tracing::warn!("a decode step failed: {e:#}");
                for &r in &rows {
                    self.live[r].job.send(Event::Failed(format!("{e:#}")));
                    ended[r] = true;
                }
                failure = Some(e);
            }
        }
        let mut r = 0;
        self.live.retain(|_| {
            r += 1;
            !ended[r - 1]
        });
        match failure {
            Some(e) if self.live.is_empty() && self.waiting.is_empty() => Err(e),
            _ => Ok(()),
        }
    }

    /// The next token of live sequences `rows` (of one adapter), in one forward.
    fn decode_rows(&mut self, rows: &[usize], ended: &mut [bool]) -> anyhow::Result<()> {
        let last: Vec<u32> = rows.iter().map(|&r| self.live[r].last_token().unwrap_or(0)).collect();
        let ids = Tensor::new(last.as_slice(), self.model.device())?.unsqueeze(1)?;
        let layer_count = self.model.layers.len();
        let mut caches: Vec<Vec<KvCache>> = (0..layer_count)
            .map(|l| rows.iter().map(|&r| std::mem::take(&mut self.live[r].caches[l])).collect())
            .collect();
        let job = self.live[rows[0]].job.clone();
        let logits = self.model.forward_last_rows_of(self.layers(&job), &ids, &mut caches);
        for (l, layer) in caches.into_iter().enumerate() {
            for (cache, &r) in layer.into_iter().zip(rows) {
                self.live[r].caches[l] = cache;
            }
        }
        let logits = logits?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let max_pos = self.max_pos();
        for (row, &r) in logits.iter().zip(rows) {
            if !self.live[r].advance(row, self.text, &self.stop_ids, max_pos)? {
                ended[r] = true;
            }
        }
        Ok(())
    }
}
