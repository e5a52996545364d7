//! Continuous batching: requests wait in a queue; each step first admits the waiting ones that fit
//! in the batch (the prompt's prefill, once for all its samples, each sample in its own slot of
//! the KV cache, a copy of the prompt's), then decodes one token for every live sequence, the
//! sequences of one adapter in one forward (each weight read once for all of them). A finished or
//! abandoned sequence leaves the batch at once, and its slot goes to the next waiting request in
//! the same step.

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::Context;
use candle_core::{DType, Tensor};

use rayon::prelude::*;

use crate::generate::sampling::{Sampled, Sampler};
use crate::generate::stop::{check_stop_strings, FinishReason};
use crate::model::{CausalLm, DecodeRows, DecoderLayer, KvCache, SlotCache};
// the planner sizes the prefill's transients by it (plan/serving.rs)
use crate::plan::serving::PREFILL_TOKENS;

use super::request::{Event, Request, SubmitError};
use super::sequence::{Job, Sequence};
use super::step_graphs::{StepGraphs, StepRows};
use super::text::ReplyText;

pub struct Scheduler<'m> {
    model: &'m CausalLm,
    /// `None`: no text (token ids alone, no stop strings).
    text: Option<&'m ReplyText<'m>>,
    stop_ids: Vec<u32>,
    /// One per layer: a slot per sequence decoded together.
    caches: Vec<SlotCache>,
    /// The slots no sequence holds.
    free: Vec<usize>,
    waiting: VecDeque<(Arc<Job>, Vec<Sampler>)>,
    live: Vec<Sequence>,
    /// The decode step replayed from CUDA graphs (on a GPU, unless `enforce_eager`).
    graphs: StepGraphs,
    /// Prompt tokens one prefill forward takes at most (a longer prompt alone).
    prefill_tokens: usize,
    /// Prefill forwards run so far.
    prefills: usize,
}

/// The samplers of a request's samples, or what is wrong with it, for a context of `max_pos`
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
    if request.constraint.is_some() && !has_text {
        return Err(SubmitError::InvalidParams("a constrained reply needs the tokenizer".into()));
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
    /// A scheduler of `slots` sequences at most, each of `capacity` positions at most (prompt and
    /// reply; no more than the model's context), its KV cache allocated here.
    pub fn new(
        model: &'m CausalLm,
        text: Option<&'m ReplyText<'m>>,
        stop_ids: Vec<u32>,
        (slots, capacity): (usize, usize),
    ) -> anyhow::Result<Self> {
        let (slots, capacity) = (slots.max(1), capacity.clamp(1, model.config().max_position_embeddings));
        let caches = model.slot_caches(slots, capacity).context("allocating the KV cache")?;
        let free = (0..slots).rev().collect();
        let graphs = StepGraphs::new(model, slots, true);
        Ok(Self {
            model,
            text,
            stop_ids,
            caches,
            free,
            waiting: VecDeque::new(),
            live: Vec::new(),
            graphs,
            prefill_tokens: PREFILL_TOKENS,
            prefills: 0,
        })
    }

    /// Prompt tokens one prefill forward takes at most, `PREFILL_TOKENS` unless set lower here
    /// (SGLang's `--max-prefill-tokens`): a smaller bound lowers the prefill's activations, the
    /// engine's peak memory, at the cost of more forwards; a longer prompt still runs alone.
    pub fn limit_prefill(&mut self, tokens: usize) {
        self.prefill_tokens = tokens.max(1);
    }

    /// Prefill forwards run so far.
    pub fn prefill_forwards(&self) -> usize {
        self.prefills
    }

    /// Every decode step launched kernel by kernel, none replayed from a CUDA graph (vLLM's
    /// `--enforce-eager`).
    pub fn enforce_eager(&mut self) {
        self.graphs = StepGraphs::new(self.model, self.caches[0].slots(), false);
    }

    /// Whether decode steps are replayed from CUDA graphs (on a GPU, not `enforce_eager`, and no
    /// recording has failed).
    pub fn replays_graphs(&self) -> bool {
        self.graphs.on()
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

    /// Positions a sequence may reach: the model's context, or less where the cache is shorter.
    pub fn max_pos(&self) -> usize {
        self.caches.first().map_or(0, SlotCache::capacity)
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
        let (live, free) = (&mut self.live, &mut self.free);
        live.retain(|s| {
            !s.job.abandoned() || {
                free.push(s.slot);
                false
            }
        });
        self.waiting.retain(|(job, _)| !job.abandoned());
        let mut admitted = Vec::new();
        let mut slots_left = self.free.len();
        while let Some((job, samplers)) = self.waiting.pop_front() {
            if samplers.len() > slots_left {
                anyhow::ensure!(
                    !self.live.is_empty() || !admitted.is_empty() || samplers.len() <= self.caches[0].slots(),
                    "a request of {} samples, more than the {} sequences the engine decodes together",
                    samplers.len(),
                    self.caches[0].slots()
                );
                self.waiting.push_front((job, samplers));
                break;
            }
            slots_left -= samplers.len();
            admitted.push((job, samplers));
        }
        for group in prefill_groups(admitted, self.prefill_tokens) {
            self.prefills += 1;
            let jobs: Vec<Arc<Job>> = group.iter().map(|(job, _)| job.clone()).collect();
            if let Err(e) = self.prefill(group) {
                tracing::warn!("a prefill failed: {e:#}");
                jobs.iter().for_each(|job| job.send(Event::Failed(format!("{e:#}"))));
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
            self.free.push(seq.slot);
        }
    }

    fn layers<'a>(&'a self, job: &'a Job) -> &'a [DecoderLayer] {
        job.layers.as_deref().map_or(&self.model.layers[..], |l| &l[..])
    }

    /// The prompts' forward once for a group of requests of one length and one adapter (the
    /// training path's attention, the prompts as the rows of one batch), each prompt's keys and
    /// values copied into a slot for each of its samples, the first token sampled for each.
    fn prefill(&mut self, group: Vec<(Arc<Job>, Vec<Sampler>)>) -> anyhow::Result<()> {
        let (run, done): (Vec<_>, Vec<_>) = group.into_iter().partition(|(job, _)| job.max_new_tokens > 0);
        for (job, samplers) in done {
            for index in 0..samplers.len() {
                let finished = Event::Finished {
                    index,
                    reason: FinishReason::Length,
                    text: String::new(),
                    completion_tokens: 0,
                };
                job.send(finished);
            }
        }
        let Some((first, _)) = run.first() else { return Ok(()) };
        let first = first.clone();
        let ids: Vec<u32> = run.iter().flat_map(|(job, _)| job.prompt.iter().copied()).collect();
        let ids = Tensor::from_vec(ids, (run.len(), first.prompt.len()), self.model.device())?;
        let mut prompt_caches: Vec<KvCache> =
            (0..self.model.layers.len()).map(|_| KvCache::default()).collect();
        let logits = self.model.forward_last_of(self.layers(&first), &ids, Some(&mut prompt_caches))?;
        let mut taken = Vec::new();
        let mut sequences = Vec::new();
        for (row, (job, samplers)) in run.into_iter().enumerate() {
            let slots: Vec<usize> = self.free.split_off(self.free.len() - samplers.len());
            taken.extend(&slots);
            let filled = slots.iter().enumerate().try_for_each(|(i, &slot)| {
                self.caches.iter().zip(&prompt_caches).try_for_each(|(cache, prompt)| match i {
                    0 => cache.fill(slot, (prompt, row)),
                    _ => cache.copy_slot(slots[0], slot, job.prompt.len()),
                })
            });
            if let Err(e) = filled {
                self.free.extend(&taken);
                return Err(e.into());
            }
            for (index, (sampler, slot)) in samplers.into_iter().zip(slots).enumerate() {
                let sample = Sequence::new(job.clone(), (index, sampler, slot), self.text, &self.stop_ids)?;
                sequences.push((row, sample));
            }
        }
        drop(prompt_caches);
        let max_pos = self.max_pos();
        let rows: Vec<usize> = sequences.iter().map(|(row, _)| *row).collect();
        let mut seqs: Vec<&mut Sequence> = sequences.iter_mut().map(|(_, seq)| seq).collect();
        let chosen = choose(&logits, &rows, &mut seqs)?;
        for ((_, mut seq), next) in sequences.into_iter().zip(chosen) {
            match next.and_then(|next| seq.accept(next, self.text, &self.stop_ids, max_pos)) {
                Ok(true) => self.live.push(seq),
                Ok(false) => self.free.push(seq.slot),
                Err(e) => {
                    seq.job.send(Event::Failed(format!("{e:#}")));
                    self.free.push(seq.slot);
                }
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
        let free = &mut self.free;
        self.live.retain(|seq| {
            r += 1;
            if ended[r - 1] {
                free.push(seq.slot);
            }
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
        let slots: Vec<usize> = rows.iter().map(|&r| self.live[r].slot).collect();
        let positions: Vec<usize> = rows.iter().map(|&r| self.live[r].position()).collect();
        let job = self.live[rows[0]].job.clone();
        let layers = job.layers.as_deref().map_or(&self.model.layers[..], |l| &l[..]);
        let step = StepRows { ids: &last, slots: &slots, positions: &positions };
        let logits = match self.graphs.decode(self.model, (&job.layers, layers), &self.caches, step)? {
            Some(logits) => logits,
            None => {
                let ids = Tensor::new(last.as_slice(), self.model.device())?.unsqueeze(1)?;
                let places = DecodeRows::new(slots, positions, &self.caches[0])?;
                self.model.forward_slots_of(layers, &ids, &self.caches, &places)?
            }
        };
        let max_pos = self.max_pos();
        let mut seqs: Vec<&mut Sequence> = self
            .live
            .iter_mut()
            .enumerate()
            .filter_map(|(r, seq)| rows.binary_search(&r).is_ok().then_some(seq))
            .collect();
        let chosen = choose(&logits, &(0..rows.len()).collect::<Vec<_>>(), &mut seqs)?;
        for ((seq, next), &r) in seqs.into_iter().zip(chosen).zip(rows) {
            if !seq.accept(next?, self.text, &self.stop_ids, max_pos)? {
                ended[r] = true;
            }
        }
        Ok(())
    }
}

/// The admitted requests in groups that share a prefill forward: one prompt length, one adapter,
/// `limit` tokens at most (a longer prompt alone), in the order they came.
fn prefill_groups(
    admitted: Vec<(Arc<Job>, Vec<Sampler>)>,
    limit: usize,
) -> Vec<Vec<(Arc<Job>, Vec<Sampler>)>> {
    let mut groups: Vec<Vec<(Arc<Job>, Vec<Sampler>)>> = Vec::new();
    for (job, samplers) in admitted {
        let fits = |g: &Vec<(Arc<Job>, Vec<Sampler>)>| {
            let (head, _) = &g[0];
            head.prompt.len() == job.prompt.len()
                && head.same_layers(&job)
                && (g.len() + 1) * job.prompt.len() <= limit
        };
        match groups.iter_mut().find(|g| fits(g)) {
            Some(group) => group.push((job, samplers)),
            None => groups.push(vec![(job, samplers)]),
        }
    }
    groups
}

/// Each sequence's next token from row `rows[i]` of `logits` `[n, vocab]`: on a GPU, where every
/// sequence is plain greedy (none constrained), the argmax and its log-prob computed there
/// (`cuda::greedy`: two numbers a row come to the host instead of the row); otherwise the rows on
/// the host, the sequences' samplers (and constraints' masks) run in parallel.
fn choose(
    logits: &Tensor,
    rows: &[usize],
    seqs: &mut [&mut Sequence],
) -> anyhow::Result<Vec<anyhow::Result<Sampled>>> {
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() && seqs.iter().all(|s| s.plain_greedy()) {
        let chosen = crate::cuda::greedy::greedy_to_host(logits)?;
        return Ok(rows.iter().map(|&r| device_greedy(chosen[r], r)).collect());
    }
    let logits = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    Ok(seqs.par_iter_mut().zip(rows.par_iter()).map(|(seq, &r)| seq.sample(&logits[r])).collect())
}

/// The device's greedy choice of row `r`: its log-prob is NaN for the rows the host's sampler
/// refuses (a NaN or +inf logit, or nothing above -inf), an error as there.
#[cfg(feature = "cuda")]
fn device_greedy((id, raw): (u32, f32), r: usize) -> anyhow::Result<Sampled> {
    anyhow::ensure!(raw.is_finite(), "the logits of row {r} are not finite (a NaN or +inf, or all -inf)");
    Ok(Sampled::greedy(id, f64::from(raw)))
}
