//! Causal scaled-dot-product attention with grouped-query heads, an optional sliding window, a
//! query scale of the family's choosing and Gemma 2's soft-capped scores, and its backward.
//! Sequences are padded on the right, so causality alone keeps real tokens from seeing padding
//! and no padding mask is needed.

use candle_core::{DType, Device, Result, Tensor};

use crate::model::packing::PackedRows;
use saved::KernelSaved;

pub use composed::{repeat_kv, QUERY_CHUNK};
pub use rule::{causal_mask, ScoreRule};
pub use saved::AttentionSaved;

/// Whether the CPU's fused attention (cpu/attention.rs) takes q, k and v of `dtype` on `device`
/// under `rule`: f32 without a soft cap.
fn cpu_takes(device: &Device, dtype: DType, rule: &ScoreRule) -> bool {
    device.is_cpu() && dtype == DType::F32 && rule.softcap.is_none()
}

/// Whether the attention reads q, k and v as `[b, h, t, d]` views of the projections'
/// `[b, t, h, d]` memory (the CUDA kernels and the CPU's fused path), so that a layer lays its
/// heads out without a copy; the composed path's matmuls take contiguous heads.
pub fn reads_strided(x: &Tensor, rule: &ScoreRule) -> bool {
    x.device().is_cuda() || cpu_takes(x.device(), x.dtype(), rule)
}

/// The CPU's fused path's view of which keys each query sees: packed rows' spans, else
/// causality, and the rule's window.
fn cpu_visible<'a>(
    packed: Option<&'a PackedRows>,
    rule: &ScoreRule,
) -> crate::model::ops::cpu::attention::Visible<'a> {
    crate::model::ops::cpu::attention::Visible { spans: packed.map(|p| p.spans()), window: rule.window }
}

/// cuDNN's attention graphs built so far in this process and the seconds that took (none without
/// CUDA): each new shape builds a forward and a backward graph.
pub fn graph_builds() -> (u64, f64) {
    #[cfg(feature = "cuda")]
    return crate::cuda::cudnn_sdpa::graph_builds();
    #[cfg(not(feature = "cuda"))]
    (0, 0.0)
}

/// q `[b, h, t, d]`, k/v `[b, kv, s, d]` (already rotated), mask `[t, s]` or `None` (causal: query
/// i sits at position s − t + i; `rule.window` is the same sliding window the mask holds; the CUDA
/// kernels mask by position and never read it). Returns the context `[b, h, t, d]`. On CUDA,
/// soft-capped scores take cuDNN where it builds the graph, else the composed path.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    rule: &ScoreRule,
) -> Result<(Tensor, AttentionSaved)> {
    attention_packed(q, k, v, (mask, None), rule)
}

/// `attention` of packed rows (`packed`: their spans; on the CPU `mask` holds them too).
pub fn attention_packed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (mask, packed): (Option<&Tensor>, Option<&PackedRows>),
    rule: &ScoreRule,
) -> Result<(Tensor, AttentionSaved)> {
    #[cfg(feature = "cuda")]
    if mask.is_none() {
        if let Some(out) = cuda::kernel_forward(q, k, v, rule, packed)? {
            return Ok(out);
        }
    }
    if cpu_takes(q.device(), q.dtype(), rule) {
        // masked by position and span as the CUDA kernels are: `mask` says the same
        let (context, lse) =
            crate::model::ops::cpu::attention::forward(q, k, v, cpu_visible(packed, rule), rule.scale)?;
        return Ok((context, AttentionSaved { kernel: Some(KernelSaved::Cpu { lse }) }));
    }
    composed::forward(q, k, v, (mask, packed), rule)
}

/// Backward of `attention`: given d(context), returns (dq, dk, dv) with dk/dv summed back to
/// the kv heads. The composed path recomputes the probabilities P per query chunk, then
/// dV += Pᵀ·dC, dP = dC·Vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)) (⊙ (1 − tanh²) through a soft cap),
/// dQ = dS·K·scale, dK += dSᵀ·Q·scale (dK and dV accumulate over chunks in f32).
pub fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    rule: &ScoreRule,
    saved: &AttentionSaved,
    d_context: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    attention_backward_packed((q, k, v), (mask, None), rule, saved, d_context)
}

/// `attention_backward` of packed rows.
pub fn attention_backward_packed(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (mask, packed): (Option<&Tensor>, Option<&PackedRows>),
    rule: &ScoreRule,
    saved: &AttentionSaved,
    d_context: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if let Some(kernel) = &saved.kernel {
        if let Some(grads) = cuda::kernel_backward((q, k, v), (rule, packed), kernel, d_context)? {
            return Ok(grads);
        }
    }
    if let Some(KernelSaved::Cpu { lse }) = &saved.kernel {
        let visible = cpu_visible(packed, rule);
        return crate::model::ops::cpu::attention::backward((q, k, v), visible, rule.scale, lse, d_context);
    }
    composed::backward((q, k, v), (mask, packed), rule, d_context)
}

/// The fused attention's forward and backward run once on zeros at one shape (`b` rows of `t`
/// tokens, the projections' `[b, t, heads, d]` layout as a layer lays q, k and v out), so that
/// what their first use costs — cuDNN building its graphs, the driver loading (cold: compiling)
/// their kernels — is paid here, on a thread of its own while the model loads
/// (`decoder::prepare`), not in the first step. The same calls as a layer's, so the graphs built
/// are the ones the step looks up; with `packed`, as packed rows' (`data.packing`).
#[cfg(feature = "cuda")]
pub fn prepare(
    device: &candle_core::Device,
    dtype: DType,
    (b, t): (usize, usize),
    (heads, kv_heads, head_dim): (usize, usize, usize),
    rule: &ScoreRule,
    packed: bool,
) -> Result<()> {
    let laid_out = |h: usize| Tensor::zeros((b, t, h, head_dim), dtype, device)?.transpose(1, 2);
    let (q, k, v) = (laid_out(heads)?, laid_out(kv_heads)?, laid_out(kv_heads)?);
    // packed rows (`data.packing`) take cuDNN's ragged graphs, whose kernels differ: two dialogues
    // a row stand for them
    let spans = vec![vec![t / 2, t - t / 2]; b];
    let rows = packed.then(|| PackedRows::new(&spans, t, device)).transpose()?;
    let (_, saved) = attention_packed(&q, &k, &v, (None, rows.as_ref()), rule)?;
    attention_backward_packed((&q, &k, &v), (None, rows.as_ref()), rule, &saved, &laid_out(heads)?)?;
    Ok(())
}

mod composed;
#[cfg(feature = "cuda")]
mod cuda;
mod rule;
mod saved;
#[cfg(test)]
mod tests;
