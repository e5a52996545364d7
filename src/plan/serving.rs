//! Serving's memory (`lora-ft serve`, `lora-ft generate`): what the decoding engine holds on the
//! device — the weights as stored, the adapters, the prefill's and a decode step's transients,
//! and the KV cache, allocated up front as slots of `max_seq_len` positions
//! (model/layer/slot_cache.rs) — and how many sequences of a length fit a budget.

use candle_core::DType;
use serde::Serialize;

use super::activations::{fused_kernel_takes, ArchExtras, Dims};
use super::estimate::{dequantized_slice, projection_dims, stored_model_bytes, FIXED_WORKSPACE};
use crate::arch::ModelConfig;
use crate::model::ops::attention::QUERY_CHUNK;
use crate::model::{LoraSpec, SlotCache, PROJECTIONS};

/// Prompt tokens one prefill forward takes at most: the engine prefills requests of one length
/// and one adapter together up to this many (a longer prompt alone), which bounds the forward's
/// activations.
pub const PREFILL_TOKENS: usize = 16384;

/// The most sequences serving plans for where the flags leave it (vLLM's `max_num_seqs`
/// default): more rarely pays, each step's rows are what the replies wait on.
pub const MAX_PLANNED_BATCH: usize = 256;

/// The decode kernels' scratch on a GPU, one set for the engine's stream, allocated at its first
/// decode step and kept (src/cuda/stream_workspace.rs): the NF4 lookup GEMM's tile fragments (two
/// 128-row × 64-batch-row f32 fragments for each of its two blocks a multiprocessor, and a count
/// for each of 16,384 tiles) and the split LoRA product's partial sums (four blocks a
/// multiprocessor of 64 × 8 f32, a count for each of 1,024 column groups), sized for a GPU of up
/// to 160 multiprocessors (an H100 or H200 has 132). The CUDA tests hold the kernels' own sizes to
/// it.
pub const DECODE_SCRATCH: u64 =
    SCRATCH_MULTIPROCESSORS * (2 * 2 * 128 * 64 * 4 + 4 * 64 * 8 * 4) + (1 << 14) * 4 + 1024 * 4;
/// The multiprocessors `DECODE_SCRATCH` is sized for.
pub const SCRATCH_MULTIPROCESSORS: u64 = 160;

/// What is served, as far as memory goes.
#[derive(Debug, Clone)]
pub struct ServingShape {
    /// The model's dtype on the device (bf16 on a GPU, f32 on the CPU): the 16-bit parts, the
    /// activations and the KV cache.
    pub dtype: DType,
    /// NF4 storage of the projections (`Some(double_quant)`), or dense (`None`).
    pub nf4: Option<bool>,
    /// The adapters served beside the base (each a copy of the layers' LoRA weights, f32).
    pub adapters: Vec<LoraSpec>,
    /// On a GPU: the untied embedding table stays in host memory (model/ops/embedding.rs) and the
    /// prefill's attention runs on the fused kernels.
    pub gpu: bool,
    /// Prompt tokens one prefill forward takes at most (`PREFILL_TOKENS` unless
    /// `--max-prefill-tokens` says less).
    pub max_prefill_tokens: usize,
}

/// Serving's bytes on the device, for sequences of `max_seq_len` positions.
#[derive(Debug, Clone, Serialize)]
pub struct ServingPlan {
    pub max_seq_len: usize,
    /// Prompt tokens one prefill forward takes at most.
    pub max_prefill_tokens: usize,
    /// The frozen model as stored: NF4 codes and absmax (or dense projections), the 16-bit
    /// lm_head (and the embedding table where it is on the device), norms and RoPE tables.
    pub weights: u64,
    /// The adapters' A and B (f32).
    pub adapters: u64,
    /// A prefill's transients per prompt token: the prompts' keys and values for every layer
    /// before they go into their slots, and one layer's activations.
    pub prefill_per_token: u64,
    /// A prefill's transients whatever its length: the composed attention's query chunk of scores
    /// over the longest prompt (none where a fused kernel takes the training path's attention)
    /// and cuBLAS's workspace; the largest weight dequantized at once comes on top
    /// (`prefill`).
    pub prefill_fixed: u64,
    /// A decode step's bytes per sequence: its row of logits in the model's dtype and in f32,
    /// one layer's activations, and its attention scores over `max_seq_len` keys (f32).
    pub step_per_sequence: u64,
    /// The KV cache's bytes per position of one sequence: layers × kv heads × head_dim × 2 (keys
    /// and values) × the dtype's bytes.
    pub kv_bytes_per_token: u64,
    /// The decode kernels' scratch (`DECODE_SCRATCH` on a GPU with NF4 weights, else none).
    pub decode_scratch: u64,
    /// What sizes the dequantized weight: the largest projection's values, the MLP's width and
    /// the dtype's bytes.
    #[serde(skip)]
    dequantized: (u64, u64, u64),
}

impl ServingPlan {
    /// The plan of `shape` for `m` at sequences of `max_seq_len` positions.
    pub fn new(m: &ModelConfig, shape: &ServingShape, max_seq_len: usize) -> Self {
        let b = shape.dtype.size_in_bytes() as u64;
        let on_device = (m.tied_embeddings() || !shape.gpu, !m.tied_embeddings());
        let weights = stored_model_bytes(m, (shape.nf4, b as usize), on_device, max_seq_len);
        let adapters = shape.adapters.iter().map(|spec| adapter_bytes(m, spec)).sum();
        let d = Dims::of(m);
        // one layer's transients a token at its larger half, beside the residual stream x: n1,
        // q, k, v, the context and o's output; or n2, gate, up, their gated product and down's
        // output
        let layer_values = d.h + (2 * d.h + 2 * d.q + 2 * d.kv).max(2 * d.h + 3 * d.i);
        let kv_bytes_per_token = kv_bytes_per_token(m, shape.dtype);
        // the training path's attention: fused on a GPU in 16 bits where a kernel takes the layers
        let fused = shape.gpu && b == 2 && fused_kernel_takes(&ArchExtras::of(m), &d);
        let scores = match fused {
            true => 0,
            // [heads, QUERY_CHUNK, keys] of the longest prompt, scores and probabilities in f32
            false => d.heads * QUERY_CHUNK.min(max_seq_len) as u64 * max_seq_len as u64 * 2 * 4,
        };
        let largest_weight = projection_dims(m).iter().map(|&(o, n)| (o * n) as u64).max().unwrap_or(0);
        Self {
            max_seq_len,
            max_prefill_tokens: shape.max_prefill_tokens.max(1),
            weights,
            adapters,
            prefill_per_token: kv_bytes_per_token + layer_values * b,
            prefill_fixed: scores + FIXED_WORKSPACE,
            step_per_sequence: m.vocab_size as u64 * (b + 4)
                + layer_values * b
                + d.heads * max_seq_len as u64 * 4,
            kv_bytes_per_token,
            decode_scratch: if shape.gpu && shape.nf4.is_some() { DECODE_SCRATCH } else { 0 },
            dequantized: (largest_weight, d.i, b),
        }
    }

    /// The KV cache's bytes for one sequence of `max_seq_len` positions.
    pub fn kv_bytes_per_sequence(&self) -> u64 {
        self.kv_bytes_per_token * self.max_seq_len as u64
    }

    /// Prompt tokens the largest prefill takes with `sequences` slots: the engine admits a
    /// request only into a free slot and prefills prompts of one length together up to
    /// `max_prefill_tokens` (a longer prompt alone), so as many as the slots' prompts, within
    /// those bounds.
    pub fn prefill_tokens(&self, sequences: usize) -> usize {
        let l = self.max_seq_len;
        sequences.saturating_mul(l).clamp(l, self.max_prefill_tokens.max(l))
    }

    /// The largest prefill's transients with `sequences` slots.
    pub fn prefill(&self, sequences: usize) -> u64 {
        let t = self.prefill_tokens(sequences);
        let (largest, i, b) = self.dequantized;
        t as u64 * self.prefill_per_token + self.prefill_fixed + dequantized_slice(largest, t, i) * b
    }

    /// What stays whatever the number of sequences: the weights and the adapters.
    pub fn fixed(&self) -> u64 {
        self.weights + self.adapters
    }

    /// Each sequence's share: its slot of the KV cache and its part of a decode step.
    pub fn per_sequence(&self) -> u64 {
        self.kv_bytes_per_sequence() + self.step_per_sequence
    }

    /// The planner's bytes with `sequences` sequences decoded together: the fixed parts, the
    /// decode kernels' scratch, the largest prefill, and each sequence's share.
    pub fn total(&self, sequences: usize) -> u64 {
        self.fixed() + self.decode_scratch + self.prefill(sequences) + sequences as u64 * self.per_sequence()
    }

    /// The most sequences whose `total` is within `budget` bytes (0 if not even one); `total`
    /// grows with the sequences.
    pub fn largest_batch(&self, budget: u64) -> usize {
        if self.total(1) > budget {
            return 0;
        }
        let (mut lo, mut hi) = (1usize, 2usize);
        while self.total(hi) <= budget {
            (lo, hi) = (hi, hi * 2);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match self.total(mid) <= budget {
                true => lo = mid,
                false => hi = mid,
            }
        }
        lo
    }

    /// This plan with `bytes` in place of the predicted weights and adapters: on a device where
    /// the model is loaded, what the device says it holds (the weights, the CUDA context, any
    /// other process), plus the adapters still to load (`pending`).
    pub fn with_resident(self, bytes: u64, pending: u64) -> Self {
        Self { weights: bytes, adapters: pending, ..self }
    }
}

/// The KV cache's bytes per position of one sequence: every layer's `SlotCache` of one slot of
/// one position.
pub fn kv_bytes_per_token(m: &ModelConfig, dtype: DType) -> u64 {
    let per_layer = SlotCache::bytes((1, 1), (m.num_kv_heads(), m.head_dim()), dtype);
    (m.num_hidden_layers * per_layer) as u64
}

/// An adapter's A `[r, in]` and B `[out, r]` in f32 for each target module of each layer.
pub fn adapter_bytes(m: &ModelConfig, spec: &LoraSpec) -> u64 {
    let per_layer: u64 = projection_dims(m)
        .iter()
        .zip(PROJECTIONS)
        .filter(|(_, name)| spec.target_modules.iter().any(|t| t == name))
        .map(|(&(o, n), _)| (spec.r * (o + n) * 4) as u64)
        .sum();
    m.num_hidden_layers as u64 * per_layer
}

/// What serving runs with: sequences of `max_seq_len` positions, `max_batch` of them at once,
/// and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingChoice {
    pub max_seq_len: usize,
    pub max_batch: usize,
    /// Says what was chosen, from what budget, in a sentence for the log.
    pub reason: String,
}

/// Sequences a context must hold at once for serving to choose it over a shorter one (the batch
/// `lora-ft serve` had by default before the planner chose).
const MIN_PLANNED_BATCH: usize = 16;

/// Serving's shape for a budget of `budget` bytes where the flags leave it: `max_seq_len` given,
/// or the longest of the model's context, 32768, 16384, 8192 and 4096 positions at which
/// `MIN_PLANNED_BATCH` sequences fit (else the shortest of them); `max_batch` given, or the most
/// sequences of that length that fit, `MAX_PLANNED_BATCH` at most. An error where not one
/// sequence fits. `plan` makes the plan at a length.
pub fn choose(
    context: usize,
    plan: impl Fn(usize) -> ServingPlan,
    budget: u64,
    (max_seq_len, max_batch): (Option<usize>, Option<usize>),
) -> Result<ServingChoice, String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let lengths: Vec<usize> = match max_seq_len {
        Some(n) => vec![n],
        None => {
            let mut l: Vec<usize> =
                [context, 32768, 16384, 8192, 4096].into_iter().map(|n| n.min(context)).collect();
            l.dedup();
            l
        }
    };
    let fitting = |n: usize| plan(n).largest_batch(budget);
    let max_seq_len =
        *lengths.iter().find(|&&n| fitting(n) >= MIN_PLANNED_BATCH).unwrap_or(&lengths[lengths.len() - 1]);
    let p = plan(max_seq_len);
    let fits = p.largest_batch(budget);
    if fits == 0 {
        return Err(format!(
            "not even one sequence of {max_seq_len} positions fits: the planner counts {:.2} GiB for the weights \
             and adapters, {:.2} GiB for its prefill and {:.2} GiB for its KV cache and decode step, within {:.2} GiB",
            gib(p.fixed()),
            gib(p.prefill(1)),
            gib(p.per_sequence()),
            gib(budget)
        ));
    }
    let max_batch = max_batch.unwrap_or(fits.min(MAX_PLANNED_BATCH));
    let reason = format!(
        "{max_batch} sequences of {max_seq_len} positions: the planner fits {fits} within {:.2} GiB \
         ({:.2} GiB weights and adapters, KV cache {:.1} KiB a position, {:.2} GiB in all at {max_batch})",
        gib(budget),
        gib(p.fixed()),
        p.kv_bytes_per_token as f64 / 1024.0,
        gib(p.total(max_batch)),
    );
    Ok(ServingChoice { max_seq_len, max_batch, reason })
}

/// `lora-ft estimate`'s serving section: the parts of serving `shape` and how many sequences
/// of each context length fit `budget` bytes.
pub fn report(m: &ModelConfig, shape: &ServingShape, budget: u64) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let context = m.max_position_embeddings;
    let p = ServingPlan::new(m, shape, context.min(4096));
    let b = shape.dtype.size_in_bytes();
    let weights = match shape.nf4 {
        Some(_) => format!("weights (NF4 codes + absmax, {}-bit head and norms)", 8 * b),
        None => format!("weights ({}-bit)", 8 * b),
    };
    let adapters = match shape.adapters.as_slice() {
        [one] => format!("adapter (rank {}, {} modules, f32)", one.r, one.target_modules.len()),
        many => format!("{} adapters (f32)", many.len()),
    };
    let prefill = format!("prefill of one {}-token prompt (transient)", p.max_seq_len);
    let mut out =
        format!("serving (lora-ft serve, lora-ft generate) on a GPU in {}:\n", shape.dtype.as_str());
    for (what, bytes) in
        [(weights.as_str(), p.weights), (adapters.as_str(), p.adapters), (prefill.as_str(), p.prefill(1))]
    {
        out += &format!("  {what:<52} {:>8.2} GiB\n", gib(bytes));
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    if p.decode_scratch > 0 {
        out += &format!("  {:<52} {:>8.2} MiB\n", "decode kernels' scratch", mib(p.decode_scratch));
    }
    out += &format!(
        "  {:<52} {:>8.2} MiB\n",
        format!("decode step per sequence (at {} positions)", p.max_seq_len),
        mib(p.step_per_sequence)
    );
    out += &format!(
        "  {:<52} {:>8.1} KiB   ({} layers x {} kv heads x {} x 2 x {b} bytes)\n",
        "KV cache per token",
        p.kv_bytes_per_token as f64 / 1024.0,
        m.num_hidden_layers,
        m.num_kv_heads(),
        m.head_dim()
    );
    out += &format!("concurrent sequences within the budget ({:.2} GiB):\n", gib(budget));
    let mut lengths: Vec<usize> = [2048, 4096, 8192, context].into_iter().filter(|&n| n <= context).collect();
    lengths.dedup();
    for n in lengths {
        let p = ServingPlan::new(m, shape, n);
        let fits = p.largest_batch(budget);
        let kv = gib(p.kv_bytes_per_sequence() * fits as u64);
        let all = if fits > 0 { format!(", {:.2} GiB in all", gib(p.total(fits))) } else { String::new() };
        out += &format!("  context {n:>6}: {fits:>5} sequences   (KV cache {kv:.2} GiB{all})\n");
    }
    match choose(context, |n| ServingPlan::new(m, shape, n), budget, (None, None)) {
        Ok(c) => {
            out += &format!(
                "lora-ft serve on this budget: --max-model-len {} --max-batch {}\n",
                c.max_seq_len, c.max_batch
            )
        }
        Err(e) => out += &format!("lora-ft serve on this budget: {e}\n"),
    }
    out
}
