//! The planner's count of what one step holds beyond the frozen parts: one backward layer's
//! working set (the gated MLP's backward, or the composed attention's query chunk), and the loss
//! with one chunk of logits. Each term names the tensors of model/layer/mod.rs, ops/attention/ and
//! ops/loss.rs it stands for.

use crate::arch::{Architecture, ModelConfig};
use crate::model::layer::tiles::{tile_rows, MLP_TILE_VALUES};
use crate::model::ops::attention::QUERY_CHUNK;

use super::RunShape;

/// What the planner reads of a model's `Architecture` (src/arch/description.rs): the differences
/// from the Llama layer that change its memory — the extra tensors its layers keep for the
/// backward, its soft caps and its second RoPE table.
#[derive(Debug, Clone, Default)]
pub(super) struct ArchExtras {
    /// q and k normed per head (Qwen3, Gemma 3): the layer keeps them before the norm.
    pub qk_norm: bool,
    /// Norms after the attention and MLP outputs (Gemma): the layer keeps o's and down's output.
    pub post_norms: bool,
    pub qkv_bias: bool,
    pub attention_softcap: bool,
    pub logit_softcap: bool,
    /// A second RoPE table for the sliding-window layers (Gemma 3).
    pub local_rope: bool,
}

impl ArchExtras {
    /// `m`'s extras, or the plain Llama decoder's (none) where config.json names no family the
    /// model reads (`ModelConfig::from_file` refuses those before the planner sees them).
    pub fn of(m: &ModelConfig) -> Self {
        match Architecture::from_config(m) {
            Ok(a) => Self {
                qk_norm: a.qk_norm,
                post_norms: a.post_sublayer_norms,
                qkv_bias: a.qkv_bias,
                attention_softcap: a.attention_softcap.is_some(),
                logit_softcap: a.final_logit_softcap.is_some(),
                local_rope: a.local_rope.is_some(),
            },
            Err(_) => Self::default(),
        }
    }
}

/// The sizes one layer's activations are made of.
pub(super) struct Dims {
    pub h: u64,
    pub i: u64,
    /// Widths of q (all heads) and of k or v.
    pub q: u64,
    pub kv: u64,
    pub heads: u64,
    pub head_dim: u64,
}

impl Dims {
    pub fn of(m: &ModelConfig) -> Self {
        let d = m.head_dim() as u64;
        Self {
            h: m.hidden_size as u64,
            i: m.intermediate_size as u64,
            q: m.num_attention_heads as u64 * d,
            kv: m.num_kv_heads() as u64 * d,
            heads: m.num_attention_heads as u64,
            head_dim: d,
        }
    }
}

/// Whether a layer's attention runs on a fused kernel (ops/attention/cuda.rs `kernel_forward`): cuDNN
/// for head_dim a multiple of 8 up to 256 (windows and soft caps included), the flash kernels for
/// head_dim 64 or 128 without a soft cap where cuDNN is absent; the composed path otherwise, and
/// everywhere without `run.fused_attention`. The same for every layer: windows do not decide it.
pub(super) fn fused(f: &ArchExtras, d: &Dims, run: &RunShape) -> bool {
    run.fused_attention && fused_kernel_takes(f, d)
}

/// Whether a fused kernel takes the layers' attention where fused attention is on (`fused`).
pub(super) fn fused_kernel_takes(f: &ArchExtras, d: &Dims) -> bool {
    let cudnn = d.head_dim.is_multiple_of(8) && d.head_dim <= 256;
    let flash = matches!(d.head_dim, 64 | 128) && !f.attention_softcap;
    cudnn || flash
}

/// One backward layer's largest working set (bytes), at `batch` rows of `seq` tokens: the gated
/// MLP's backward, or where the layers run the composed attention, its query chunk's backward if
/// larger.
pub(super) fn layer_peak(
    m: &ModelConfig,
    f: &ArchExtras,
    run: &RunShape,
    (seq, batch): (usize, usize),
) -> u64 {
    let d = Dims::of(m);
    let (b, t) = (run.dtype_bytes as u64, (seq * batch) as u64);
    let mlp = b * mlp_backward_values(f, &d, run, t);
    if fused(f, &d, run) {
        return mlp.max(fused_attention_backward(f, &d, run, t));
    }
    mlp.max(composed_attention_backward(m, f, &d, run, (seq, batch)))
}

/// Values alive in the gated MLP's backward (layer.rs `mlp_backward`, at `gated_backward`),
/// for `t` tokens. Per token: the layer's input, n1, h1, n2, the output's gradient and three
/// more hidden-size temporaries (the third found by the H100 peaks at 39-90K tokens per step,
/// benches/fits.md: the measured slope is one hidden-size f16 row per token above six); q and
/// the context; k, v. Per row of the MLP's pass: gate and up kept, and d(act), d(gate), d(up).
/// Plus what a family keeps beyond that: q and k before their per-head norms (`q_raw`, `k_raw`),
/// o's output before its norm (`o_out`; down's is dropped before this point); with LoRA dropout,
/// each group's dropped input (3h + i, fitted to the H100 peaks of the ready configs' shapes
/// with dropout 0.05). In row tiles (layer/tiles.rs) the MLP's pass is one tile, and gate, up
/// and down are dequantized for the whole pass (two more than the one in `workspace`).
fn mlp_backward_values(f: &ArchExtras, d: &Dims, run: &RunShape, t: u64) -> u64 {
    let mut per_token = 7 * d.h + 2 * d.q + 2 * d.kv;
    let mut per_mlp_row = 5 * d.i;
    if f.qk_norm {
        per_token += d.q + d.kv;
    }
    if f.post_norms {
        per_token += d.h;
    }
    if run.lora_dropout() {
        per_token += 3 * d.h;
        per_mlp_row += d.i;
    }
    let (rows, weights) = match mlp_tile_rows(d, run, t) {
        Some(rows) => (rows, if run.nf4.is_some() { 2 * d.h * d.i } else { 0 }),
        None => (t, 0),
    };
    t * per_token + rows * per_mlp_row + weights
}

/// The fused attention's backward (layer.rs `attention_half_backward`, at the kernel), for `t`
/// tokens: per token the layer's input, n1 and d(h1); q, the attention's output (its own copy,
/// which the backward reads), d(context) and dq; k, v, dk and dv; with q/k norms q and k before
/// them, with dropout the q/k/v group's dropped input. And cuDNN's f32 accumulators, 12 bytes per
/// query value (dQ, and dK and dV for every query head before the sum to the kv heads): fitted to
/// the H100 peaks at 100,000 tokens (benches/long_rows/), where this, not the tiled MLP, is the
/// layer's peak.
fn fused_attention_backward(f: &ArchExtras, d: &Dims, run: &RunShape, t: u64) -> u64 {
    let mut values = 3 * d.h + 4 * d.q + 4 * d.kv;
    if f.qk_norm {
        values += d.q + d.kv;
    }
    if run.lora_dropout() {
        values += d.h;
    }
    t * (run.dtype_bytes as u64 * values + CUDNN_ACCUMULATOR_BYTES * d.q)
}

/// Bytes of one kept layer's activations (layer/mod.rs `forward_saving`) at `t` tokens: per
/// token the input x, h1, q, k, v and the context (the fused kernels' output, which their
/// backward reads, in the same memory), with a fused kernel one f32 statistic per head; gate
/// and up per MLP row (untiled: every row); with q/k norms q and k before them; with output
/// norms o's and down's outputs; the LoRA groups' x·Aᵀ (r per projection, grouped without
/// dropout). n1, n2 and act are left out: the backward recomputes them.
pub(super) fn kept_layer_bytes(m: &ModelConfig, f: &ArchExtras, run: &RunShape, t: u64) -> u64 {
    let d = Dims::of(m);
    let fused = fused(f, &d, run);
    let mut values = 2 * d.h + 2 * d.q + 2 * d.kv + 2 * d.i;
    if f.qk_norm {
        values += d.q + d.kv;
    }
    if f.post_norms {
        values += 2 * d.h;
    }
    if !run.lora_dropout() {
        values += run.lora.target_modules.len() as u64 * run.lora.r as u64;
    }
    let stats = if fused { 4 * d.heads } else { 0 };
    t * (run.dtype_bytes as u64 * values + stats)
}

/// Bytes a complete kept layer (`LayerPlan::complete`) keeps beyond a lean one at `t` tokens:
/// n1 and n2 per token, and the gated product per MLP row.
pub(super) fn complete_layer_extra_bytes(m: &ModelConfig, run: &RunShape, t: u64) -> u64 {
    t * run.dtype_bytes as u64 * (2 * m.hidden_size as u64 + m.intermediate_size as u64)
}

/// Bytes of cuDNN's f32 accumulators per query value in the attention's backward.
const CUDNN_ACCUMULATOR_BYTES: u64 = 12;

/// Rows per MLP tile at `t` tokens (layer/tiles.rs `mlp_tile_rows`), `None` untiled.
pub(super) fn mlp_tile_rows(d: &Dims, run: &RunShape, t: u64) -> Option<u64> {
    let rows = tile_rows(t as usize, d.i as usize, MLP_TILE_VALUES)?;
    run.mlp_tiles.then_some(rows as u64)
}

/// The composed attention's backward at its last query chunk (the one that sees every key), on
/// top of the layer's attention half (attention.rs `attention_backward`, layer.rs
/// `attention_half_backward`): the input, n1, d(h1), the layer output's gradient, q, k, v and
/// d(context) (with q/k norms q and k before them too; with dropout the q/k/v group's dropped
/// input); k and v repeated to every query head (GQA); dK and dV summed in f32; dQ of the earlier
/// chunks; and per score of the chunk `[batch, heads, QUERY_CHUNK, seq]` the probabilities, dP and
/// dS, and through a soft cap tanh(s / cap) in f32 and the three f32 temporaries of its chain rule
/// (softcap.rs `softcap_backward`).
fn composed_attention_backward(
    m: &ModelConfig,
    f: &ArchExtras,
    d: &Dims,
    run: &RunShape,
    (seq, batch): (usize, usize),
) -> u64 {
    let (b, t) = (run.dtype_bytes as u64, (seq * batch) as u64);
    let mut values = 4 * d.h + 2 * d.q + 2 * d.kv;
    if f.qk_norm {
        values += d.q + d.kv;
    }
    if run.lora_dropout() {
        values += d.h;
    }
    let repeated = if m.num_kv_heads() < m.num_attention_heads { 2 * b } else { 0 };
    let per_query_value = repeated + 2 * 4 + b;
    let scores = t * d.heads * seq.min(QUERY_CHUNK) as u64;
    let per_score = 3 * b + if f.attention_softcap { softcap_chain_bytes(b) } else { 0 };
    t * b * values + t * d.q * per_query_value + scores * per_score
}

/// Bytes per capped value that the soft cap's forward and backward add at their peak (softcap.rs):
/// tanh(x / cap) in f32, the gradient widened to f32 (none in f32 already), 1 − tanh² and the
/// product, in f32.
fn softcap_chain_bytes(b: u64) -> u64 {
    4 + if b < 4 { 4 } else { 0 } + 2 * 4
}

/// The loss with lm_head on the device (ops/loss.rs `cross_entropy`): one chunk of logits and
/// their gradient — soft-capped by the composed ops, also the capped copy and the cap's chain rule;
/// the fused kernel caps in its registers — with the last layer's output, its normed copy and the
/// gradient rows of the chunks before; or at the end, the gradient scattered into a zeroed
/// `[tokens, hidden]` (three more such rows).
pub(super) fn dense_loss_bytes(m: &ModelConfig, f: &ArchExtras, run: &RunShape, tokens: usize) -> u64 {
    let b = run.dtype_bytes as u64;
    let logits = tokens.min(run.loss_chunk_rows) as u64 * m.vocab_size as u64;
    let composed_cap = f.logit_softcap && !run.fused_loss;
    let per_logit = 2 * b + if composed_cap { b + softcap_chain_bytes(b) } else { 0 };
    let row = tokens as u64 * m.hidden_size as u64 * b;
    (logits * per_logit + 3 * row).max(6 * row)
}
