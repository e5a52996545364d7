//! A run's peak GPU memory at one shape, predicted from the model's config.json and the run's
//! settings: the frozen parts, the checkpoints, the backward's first layer and the loss.

use serde::Serialize;

use super::activations::{self, ArchExtras};
use super::shape::RunShape;
use crate::arch::ModelConfig;
use crate::model::lora::linear::{MIN_SLICE_VALUES, WHOLE_WEIGHT_TOKENS};
use crate::model::PROJECTIONS;

/// Predicted bytes of each part of the peak, for `tokens` = batch × sequence length per step.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    pub tokens: usize,
    /// Projections (NF4 codes and statistics, or dense), lm_head, norms, RoPE tables, and the
    /// embedding table when it lives on the device.
    pub base_weights: u64,
    /// LoRA A and B (f32) and the optimizer's state.
    pub lora_and_optimizer: u64,
    /// The inputs of the recomputed layers on the device when the backward starts: all of them,
    /// or with host offload the few still leaving or already fetched.
    pub checkpoints: u64,
    /// The kept layers' activations (`RunShape::kept_layers`), all alive when the forward ends.
    pub kept_activations: u64,
    /// Layers kept.
    pub kept_layers: usize,
    /// Layers whose activations wait in host memory, and their bytes there (not on the GPU).
    pub offloaded_layers: usize,
    pub offloaded_host: u64,
    /// With offloaded layers: one of them on the device besides the kept ones (leaving at the
    /// forward's end, or fetched ahead of its backward).
    pub in_flight: u64,
    /// The kept layers' activations still alive at the highest offloaded layer's backward
    /// (those above it are done).
    #[serde(skip)]
    kept_below_offloaded: u64,
    /// A kept layer's backward: its activations and its untiled MLP's gradients.
    pub kept_layer_backward: u64,
    /// One backward layer: its recomputed activations and the gated MLP backward's gradients, or
    /// the composed attention's query chunk where that is larger.
    pub layer_recompute: u64,
    /// The loss: one chunk of logits and their gradient (soft-capped: with the cap's f32
    /// temporaries) beside the last layer's output rows, or with lm_head streamed, two vocab
    /// chunks of it, one chunk of logits and the f32 hidden-gradient accumulator.
    pub loss_chunk: u64,
    /// The adapters' gradients (compute dtype), all alive when the backward reaches layer 0.
    pub gradients: u64,
    /// cuBLAS and the largest slice of a dequantized weight.
    pub workspace: u64,
    /// One layer input.
    #[serde(skip)]
    checkpoint_bytes: u64,
    /// One kept layer's activations.
    #[serde(skip)]
    pub(crate) kept_layer_bytes: u64,
    /// Whether some layers are recomputed (not all kept).
    #[serde(skip)]
    recomputes: bool,
}

/// Layer inputs on the device with host offload: the last two pushed and the one fetched.
const RESIDENT_CHECKPOINTS: u64 = 3;

impl Estimate {
    /// The peak: the frozen parts and the largest of the step's moments — the loss at the
    /// forward's end (the checkpoints and every kept layer's activations), the first kept
    /// layer's backward, the first recomputed layer's, and the backward's end (every gradient
    /// with layer 0's).
    pub fn peak(&self) -> u64 {
        let fixed = self.fixed();
        let kept = self.checkpoints + self.kept_activations;
        let mut start = self.loss_moment();
        if self.kept_layers > 0 {
            start = start.max(kept - self.kept_layer_bytes + self.kept_layer_backward + self.in_flight);
        }
        if self.offloaded_layers > 0 {
            // the highest offloaded layer's backward: the kept layers below it, and the next
            // offloaded one fetched ahead
            let below = self.checkpoints + self.kept_below_offloaded;
            start = start.max(below + self.kept_layer_backward + self.in_flight);
        }
        let end = match self.recomputes {
            true => {
                start = start.max(self.checkpoints + self.layer_recompute + self.in_flight);
                self.layer_recompute + self.checkpoints.min(self.resident_checkpoints())
            }
            false => self.kept_layer_backward,
        };
        fixed + start.max(self.gradients + end + self.in_flight)
    }

    /// What the whole step holds: the frozen model, the adapters with their optimizer state, and
    /// the workspace.
    fn fixed(&self) -> u64 {
        self.base_weights + self.lora_and_optimizer + self.workspace
    }

    /// The loss at the forward's end, less the frozen parts: the checkpoints, every kept layer's
    /// activations, the offloaded one leaving, and the loss's own buffers.
    fn loss_moment(&self) -> u64 {
        self.checkpoints + self.kept_activations + self.in_flight + self.loss_chunk
    }

    /// Bytes by which the loss's moment stays under the step's peak: what a streamed lm_head's
    /// prefetched chunks may take without raising the peak (`keep::with_head_prefetch`).
    pub fn loss_headroom(&self) -> u64 {
        self.peak() - self.fixed() - self.loss_moment()
    }

    /// Bytes of the checkpoints that stay on the device with host offload (checkpoints.rs: two
    /// still leaving and one fetched), whatever the number of layers.
    fn resident_checkpoints(&self) -> u64 {
        self.checkpoint_bytes * RESIDENT_CHECKPOINTS
    }
}

/// cuBLAS workspace and other per-run buffers the pool holds.
pub(super) const FIXED_WORKSPACE: u64 = 8 << 20;

/// The seven projections' (out, in) dims.
pub(super) fn projection_dims(m: &ModelConfig) -> [(usize, usize); 7] {
    let (h, i) = (m.hidden_size, m.intermediate_size);
    let (q, kv) = (m.num_attention_heads * m.head_dim(), m.num_kv_heads() * m.head_dim());
    [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]
}

/// Bytes of a projection weight of `n` values as stored: NF4 (`Some(double_quant)`) or dense in
/// `dtype_bytes`.
fn stored_weight_bytes(n: u64, (nf4, dtype_bytes): (Option<bool>, usize)) -> u64 {
    match nf4 {
        // packed codes, one absmax code per 64 values, one f32 scale per 256 codes
        Some(true) => n.div_ceil(2) + n.div_ceil(64) + n.div_ceil(64 * 256) * 4,
        Some(false) => n.div_ceil(2) + n.div_ceil(64) * 4,
        None => n * dtype_bytes as u64,
    }
}

/// Bytes of the frozen model on the device: every layer's projections as stored (`nf4`, else
/// dense in `dtype_bytes`), the 16-bit embedding table and lm_head where they are on the device
/// (`(table, head)`), the norms, biases and RoPE tables as far as `seq` fills them.
pub(super) fn stored_model_bytes(
    m: &ModelConfig,
    (nf4, dtype_bytes): (Option<bool>, usize),
    (table_on_device, head_on_device): (bool, bool),
    seq: usize,
) -> u64 {
    let b = dtype_bytes as u64;
    let projections: u64 = projection_dims(m)
        .iter()
        .map(|&(o, n)| stored_weight_bytes((o * n) as u64, (nf4, dtype_bytes)))
        .sum();
    let table = m.vocab_size as u64 * m.hidden_size as u64 * b;
    let tables = (table_on_device as u64 + head_on_device as u64) * table;
    m.num_hidden_layers as u64 * projections + tables + small_tensors(m, &ArchExtras::of(m), seq) * b
}

/// Predicts the parts of the peak for `batch` rows of `seq` tokens per step.
pub fn estimate(m: &ModelConfig, run: &RunShape, (seq, batch): (usize, usize)) -> Estimate {
    let f = ArchExtras::of(m);
    let tokens = seq * batch;
    let (layers, h, i) = (m.num_hidden_layers as u64, m.hidden_size as u64, m.intermediate_size as u64);
    let (b, t) = (run.dtype_bytes as u64, tokens as u64);
    let dims = projection_dims(m);
    let streamed = run.streams_lm_head(m);
    let on_device = (m.tied_embeddings() || !run.embeddings_on_host, !(m.tied_embeddings() || streamed));
    let base_weights = stored_model_bytes(m, (run.nf4, run.dtype_bytes), on_device, seq);

    let adapted = |name: &str| run.lora.target_modules.iter().any(|t| t == name);
    let r = run.lora.r as u64;
    let per_layer: u64 = dims
        .iter()
        .zip(PROJECTIONS)
        .filter(|(_, name)| adapted(name))
        .map(|(&(o, n), _)| {
            let (o, n) = (o as u64, n as u64);
            let params = r * (n + o);
            // A [r, in] and B [out, r], f32, with the optimizer's state of each
            let state = run.optimizer.bytes(r, n) + run.optimizer.bytes(o, r);
            // the f32 accumulators of gradient accumulation
            let kept_gradients = if run.accumulates_gradients { params } else { 0 };
            (params + kept_gradients) * 4 + state
        })
        .sum();

    let largest_weight = dims.iter().map(|&(o, n)| (o * n) as u64).max().unwrap_or(0);
    let kept = (run.layers.kept as u64).min(layers);
    let offloaded = (run.layers.offloaded as u64).min(layers - kept);
    let checkpoint_bytes = t * h * b;
    let all_checkpoints = (layers - kept - offloaded) * checkpoint_bytes;
    let kept_layer_bytes = activations::kept_layer_bytes(m, &f, run, t);
    let untiled = RunShape { mlp_tiles: false, ..run.clone() };
    Estimate {
        tokens,
        base_weights,
        lora_and_optimizer: layers * per_layer,
        checkpoints: if run.host_offload {
            all_checkpoints.min(RESIDENT_CHECKPOINTS * checkpoint_bytes)
        } else {
            all_checkpoints
        },
        kept_activations: kept * kept_layer_bytes
            + (run.layers.complete as u64).min(kept) * activations::complete_layer_extra_bytes(m, run, t),
        kept_layers: kept as usize,
        offloaded_layers: offloaded as usize,
        offloaded_host: offloaded * kept_layer_bytes,
        in_flight: if offloaded > 0 { kept_layer_bytes } else { 0 },
        // the layers above the highest offloaded one are kept ones where there are that many
        kept_below_offloaded: kept.saturating_sub(run.layers.stride.max(1) as u64) * kept_layer_bytes,
        kept_layer_backward: activations::layer_peak(m, &f, &untiled, (seq, batch)),
        layer_recompute: activations::layer_peak(m, &f, run, (seq, batch)),
        loss_chunk: if streamed {
            streamed_loss_bytes(m, run, t)
        } else {
            activations::dense_loss_bytes(m, &f, run, tokens)
        },
        gradients: layers * lora_params_per_layer(m, run) * b,
        workspace: FIXED_WORKSPACE + dequantized_slice(largest_weight, tokens, i) * b,
        checkpoint_bytes,
        kept_layer_bytes,
        recomputes: kept + offloaded < layers,
    }
}

/// Values of the frozen tensors beside the projections: every norm (Gemma's four a layer, the
/// q/k norms), q/k/v biases, and the RoPE tables as far as `seq` fills them (rope.rs: a power of
/// two from 256, at most max_position_embeddings; Gemma 3 has a second for its local layers).
fn small_tensors(m: &ModelConfig, f: &ArchExtras, seq: usize) -> u64 {
    let (h, d) = (m.hidden_size as u64, m.head_dim() as u64);
    let (q, kv) = (m.num_attention_heads as u64 * d, m.num_kv_heads() as u64 * d);
    let mut layer = if f.post_norms { 4 * h } else { 2 * h };
    if f.qk_norm {
        layer += 2 * d;
    }
    if f.qkv_bias {
        layer += q + 2 * kv;
    }
    let rows = seq.next_power_of_two().max(256).min(m.max_position_embeddings) as u64;
    let ropes = if f.local_rope { 2 } else { 1 };
    m.num_hidden_layers as u64 * layer + h + ropes * rows * d
}

/// The streamed loss (model/ops/lm_head.rs): two vocab chunks of lm_head besides the plan's
/// prefetched ones, one chunk of logits, the f32 accumulator, and the chunk's and the gradient's
/// `[tokens, hidden]` rows.
fn streamed_loss_bytes(m: &ModelConfig, run: &RunShape, tokens: u64) -> u64 {
    let (h, chunk, b) =
        (m.hidden_size as u64, crate::model::ops::lm_head::VOCAB_CHUNK as u64, run.dtype_bytes as u64);
    (2 + run.layers.lm_head_prefetch as u64) * head_chunk_bytes(m, run)
        + tokens * (chunk * b + h * (4 + 3 * b))
}

/// Bytes of one streamed vocab chunk of lm_head.
pub(crate) fn head_chunk_bytes(m: &ModelConfig, run: &RunShape) -> u64 {
    (crate::model::ops::lm_head::VOCAB_CHUNK * m.hidden_size * run.dtype_bytes) as u64
}

/// The vocab chunks a streamed lm_head is read in.
pub(crate) fn head_chunks(m: &ModelConfig) -> usize {
    m.vocab_size.div_ceil(crate::model::ops::lm_head::VOCAB_CHUNK)
}

/// LoRA parameters of one layer.
fn lora_params_per_layer(m: &ModelConfig, run: &RunShape) -> u64 {
    let adapted = |name: &str| run.lora.target_modules.iter().any(|t| t == name);
    projection_dims(m)
        .iter()
        .zip(PROJECTIONS)
        .filter(|(_, name)| adapted(name))
        .map(|(&(o, n), _)| run.lora.r as u64 * (o + n) as u64)
        .sum()
}

/// Values of the largest weight dequantized at once (linear.rs `rows_per_slice`): whole from
/// `WHOLE_WEIGHT_TOKENS` tokens on, else a slice no larger than the largest activation (at least
/// 2^24 values).
pub(super) fn dequantized_slice(largest_weight: u64, tokens: usize, intermediate: u64) -> u64 {
    if tokens >= WHOLE_WEIGHT_TOKENS {
        return largest_weight;
    }
    largest_weight.min((MIN_SLICE_VALUES as u64).max(tokens as u64 * intermediate))
}

impl RunShape {
    /// Whether the loss streams lm_head from host memory (model/ops/lm_head.rs): an untied head with
    /// host offload, unless the logits are soft-capped (the streamed loss does not cap) or the
    /// plan keeps it on the device.
    pub(crate) fn streams_lm_head(&self, m: &ModelConfig) -> bool {
        self.host_offload
            && !self.layers.lm_head_resident
            && !m.tied_embeddings()
            && !ArchExtras::of(m).logit_softcap
    }
}
