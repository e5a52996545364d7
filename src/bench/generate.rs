//! `lora-ft bench generate`: the decoding engine's throughput on random prompts, at each batch
//! size (every sequence of a batch submitted at once and decoded to the same length, no stop
//! token), with a rank-16 adapter on all seven projections applied unmerged, and the time to the
//! first token of one long prompt. It reports the bytes a decode step reads (weights and KV
//! cache) so that the comparison script can set them against the GPU's memory bandwidth.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::generate::engine::scheduler::Scheduler;
use crate::generate::engine::{Event, Request};
use crate::generate::sampling::SamplingParams;
use crate::memory::{pool_memory, reset_peak, GIB};
use crate::model::{CausalLm, LoraSpec};
use crate::quant::Quantization;

/// What `bench generate` measures.
pub struct GenerateOptions {
    pub batches: Vec<usize>,
    pub prompt_len: usize,
    pub new_tokens: usize,
    /// The rank of the random adapter (0: none).
    pub lora_rank: usize,
    /// The prompt length of the time-to-first-token row (0: none).
    pub ttft_prompt: usize,
    /// Decode steps launched kernel by kernel, none replayed from a CUDA graph.
    pub enforce_eager: bool,
    /// Prompt tokens one prefill forward takes at most (`Scheduler::limit_prefill`).
    pub max_prefill_tokens: Option<usize>,
}

/// One batch size's numbers.
#[derive(Debug, Serialize)]
pub struct GenerateRow {
    pub batch: usize,
    /// Whether the decode steps were replayed from CUDA graphs (else launched kernel by kernel).
    pub cuda_graphs: bool,
    pub prompt_len: usize,
    pub new_tokens: usize,
    /// Tokens generated per second from submission to the last token, prefill included (what a
    /// `generate` call of the batch gives).
    pub tokens_per_s: Option<f64>,
    /// The same over the decode steps alone (after the step that prefills).
    pub decode_tokens_per_s: Option<f64>,
    pub prefill_s: Option<f64>,
    pub step_ms: Option<f64>,
    /// Bytes one decode step reads: the weights (projections as stored, lm_head, the adapter),
    /// and the KV cache at the run's mean length.
    pub weight_bytes_per_step: u64,
    pub kv_bytes_per_step: u64,
    pub peak_alloc_gib: Option<f64>,
    /// The KV cache's size.
    pub kv_cache_gib: f64,
    pub error: Option<String>,
}

/// The time to the first token of one prompt.
#[derive(Debug, Serialize)]
pub struct FirstTokenRow {
    pub ttft_prompt: usize,
    pub ttft_ms: Option<f64>,
    pub error: Option<String>,
}

/// Loads `model` with a random adapter and times each batch size, `report` called with each
/// row as JSON.
pub fn generate(
    model: &str,
    (quantization, dtype, device): (Quantization, DType, &Device),
    options: &GenerateOptions,
    mut report: impl FnMut(&serde_json::Value),
) -> anyhow::Result<()> {
    let (config, weights) = crate::hub::config_and_weights(model, "main")?;
    let mut lm = CausalLm::load(&config, &weights, dtype, quantization, device)?;
    if options.lora_rank > 0 {
        let spec = LoraSpec {
            r: options.lora_rank,
            alpha: 2.0 * options.lora_rank as f64,
            dropout: 0.0,
            target_modules: crate::model::PROJECTIONS.iter().map(|p| p.to_string()).collect(),
            rslora: false,
        };
        lm.add_lora(&spec, 0)?;
        // PEFT's B starts at zero; a trained one does not
        for (name, var) in lm.lora_params() {
            if name.contains("lora_B") {
                var.set(&(Tensor::randn(0f32, 0.01, var.shape(), device)?))?;
            }
        }
    }
    let vocab = lm.config().vocab_size as u32;
    // the kernels' first use, outside the timings: a prompt of the timed length, so the
    // prefill's first run at that shape (its attention plan) is not in the first batch's time
    time_batch(&lm, vocab, (1, options.prompt_len, 4), (options, false))?;
    for &batch in &options.batches {
        let shape = (batch, options.prompt_len, options.new_tokens);
        let row = match time_batch(&lm, vocab, shape, (options, true)) {
            Ok(row) => row,
            Err(e) => GenerateRow {
                batch,
                cuda_graphs: false,
                prompt_len: options.prompt_len,
                new_tokens: options.new_tokens,
                tokens_per_s: None,
                decode_tokens_per_s: None,
                prefill_s: None,
                step_ms: None,
                weight_bytes_per_step: weight_bytes(&lm),
                kv_bytes_per_step: 0,
                peak_alloc_gib: None,
                kv_cache_gib: 0.0,
                error: Some(format!("{e:#}")),
            },
        };
        report(&serde_json::to_value(&row)?);
    }
    if options.ttft_prompt > 0 {
        let row = match first_token(&lm, vocab, options.ttft_prompt) {
            Ok(ms) => FirstTokenRow { ttft_prompt: options.ttft_prompt, ttft_ms: Some(ms), error: None },
            Err(e) => FirstTokenRow {
                ttft_prompt: options.ttft_prompt,
                ttft_ms: None,
                error: Some(format!("{e:#}")),
            },
        };
        report(&serde_json::to_value(&row)?);
    }
    Ok(())
}

/// Bytes of the weights a decode step reads: every projection as stored, the adapters, the
/// lm_head (the embedding table reads one row a sequence).
fn weight_bytes(lm: &CausalLm) -> u64 {
    let arch = &lm.arch;
    let projections: usize =
        lm.layers.iter().flat_map(|l| l.proj.iter()).map(|p| p.base.size_in_bytes()).sum();
    let adapters: usize = lm.lora_params().iter().map(|(_, v)| v.elem_count() * 4).sum();
    let head = arch.vocab_size * arch.hidden_size * lm.dtype().size_in_bytes();
    (projections + adapters + head) as u64
}

fn random_prompts(vocab: u32, (batch, len): (usize, usize), seed: u64) -> Vec<Vec<u32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..batch).map(|_| (0..len).map(|_| rng.random_range(0..vocab)).collect()).collect()
}

fn request(prompt: Vec<u32>, new_tokens: usize) -> Request {
    Request {
        prompt,
        params: SamplingParams::greedy(),
        seeds: vec![0],
        max_new_tokens: new_tokens,
        stop_strings: Vec::new(),
        adapter: None,
        constraint: None,
    }
}

/// `batch` prompts of `prompt_len` decoded to `new_tokens` each, after a short run of the same
/// batch that records its step's CUDA graph (as an engine does once when it starts).
fn time_batch(
    lm: &CausalLm,
    vocab: u32,
    (batch, prompt_len, new_tokens): (usize, usize, usize),
    (options, profiled): (&GenerateOptions, bool),
) -> anyhow::Result<GenerateRow> {
    let device = lm.device();
    let capacity = prompt_len + new_tokens;
    let mut scheduler = Scheduler::new(lm, None, Vec::new(), (batch, capacity))?;
    if options.enforce_eager {
        scheduler.enforce_eager();
    }
    if let Some(tokens) = options.max_prefill_tokens {
        scheduler.limit_prefill(tokens);
    }
    let mut warm = Vec::new();
    for prompt in random_prompts(vocab, (batch, prompt_len.min(8)), u64::MAX - batch as u64) {
        let (sink, events) = tokio::sync::mpsc::unbounded_channel();
        scheduler.add(request(prompt, 3), sink).map_err(anyhow::Error::msg)?;
        warm.push(events);
    }
    while !scheduler.is_idle() {
        scheduler.step()?;
    }
    drop(warm);
    let arch = &lm.arch;
    let kv_per_token = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * lm.dtype().size_in_bytes();
    let kv_cache_gib = (batch * capacity * kv_per_token) as f64 / GIB;
    let mut channels = Vec::new();
    for prompt in random_prompts(vocab, (batch, prompt_len), batch as u64) {
        let (sink, events) = tokio::sync::mpsc::unbounded_channel();
        scheduler.add(request(prompt, new_tokens), sink).map_err(anyhow::Error::msg)?;
        channels.push(events);
    }
    reset_peak(device);
    device.synchronize()?;
    let start = Instant::now();
    scheduler.step()?;
    device.synchronize()?;
    let prefill_s = start.elapsed().as_secs_f64();
    if profiled {
        crate::profile::range(device, true)?;
    }
    let mut steps = 0usize;
    while !scheduler.is_idle() {
        scheduler.step()?;
        steps += 1;
    }
    if profiled {
        crate::profile::range(device, false)?;
    }
    device.synchronize()?;
    let total_s = start.elapsed().as_secs_f64();
    let mut generated = 0;
    for mut events in channels {
        while let Ok(event) = events.try_recv() {
            match event {
                Event::Token { .. } => generated += 1,
                Event::Failed(message) => anyhow::bail!("{message}"),
                Event::Finished { .. } => {}
            }
        }
    }
    anyhow::ensure!(generated == batch * new_tokens, "{generated} tokens of {}", batch * new_tokens);
    let decode_s = total_s - prefill_s;
    let mean_len = prompt_len + new_tokens / 2;
    Ok(GenerateRow {
        batch,
        cuda_graphs: scheduler.replays_graphs(),
        prompt_len,
        new_tokens,
        tokens_per_s: Some(generated as f64 / total_s),
        decode_tokens_per_s: (steps > 0).then(|| (batch * steps) as f64 / decode_s),
        prefill_s: Some(prefill_s),
        step_ms: (steps > 0).then(|| 1e3 * decode_s / steps as f64),
        weight_bytes_per_step: weight_bytes(lm),
        kv_bytes_per_step: (batch * mean_len * kv_per_token) as u64,
        peak_alloc_gib: pool_memory(device).map(|p| p.peak_allocated as f64 / GIB),
        kv_cache_gib,
        error: None,
    })
}

/// Milliseconds from submitting one `prompt_len` prompt to its first token (the second of two
/// runs: the first builds the attention's plans for the shape).
fn first_token(lm: &CausalLm, vocab: u32, prompt_len: usize) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for seed in 0..2 {
        let mut scheduler = Scheduler::new(lm, None, Vec::new(), (1, prompt_len + 1))?;
        let (sink, mut events) = tokio::sync::mpsc::unbounded_channel();
        let prompt = random_prompts(vocab, (1, prompt_len), 1000 + seed).remove(0);
        lm.device().synchronize()?;
        let start = Instant::now();
        scheduler.add(request(prompt, 1), sink).map_err(anyhow::Error::msg)?;
        scheduler.step()?;
        anyhow::ensure!(matches!(events.try_recv(), Ok(Event::Token { .. })), "no first token");
        best = best.min(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(best)
}
