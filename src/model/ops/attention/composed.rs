//! The composed attention: candle's matmuls and softmax over query chunks with an additive mask,
//! the backward recomputing the probabilities. Any dtype, device and head size; the reference the
//! fused paths (cuda.rs, `model::ops::cpu::attention`) are tested against.

use candle_core::{DType, Result, Tensor, D};

use super::rule::{causal_mask, ScoreRule};
use super::saved::AttentionSaved;
use crate::model::ops::softcap::{softcap, softcap_backward};
use crate::model::packing::PackedRows;

/// Repeats each key/value head `n_rep` times: `[b, kv, t, d]` → `[b, kv·n_rep, t, d]`, head
/// h reading kv head h / n_rep (HF's `repeat_kv`).
pub fn repeat_kv(x: &Tensor, n_rep: usize) -> Result<Tensor> {
    candle_transformers::utils::repeat_kv(x.clone(), n_rep)?.contiguous()
}

/// The inverse of `repeat_kv` for gradients: sums the copies of each kv head.
fn sum_kv_groups(dx: &Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(dx.clone());
    }
    let (b, h, t, d) = dx.dims4()?;
    dx.reshape((b, h / n_rep, n_rep, t, d))?.sum(2)
}

/// Query rows per chunk. Scores exist for one chunk at a time, `[b, h, QUERY_CHUNK, s]` in f32,
/// never `[b, h, t, s]` whole: at batch 8 × 2048 with 32 heads that is 1 GiB instead of 4, and
/// the backward recomputes them instead of keeping the probabilities (as FlashAttention does).
pub const QUERY_CHUNK: usize = 512;

/// One query chunk: its rows `start..start + len`, the keys it can see (`0..kv`: causality
/// hides every later key, so those columns are never computed), and its queries times the
/// softmax scale.
struct Chunk {
    start: usize,
    len: usize,
    kv: usize,
    q_scaled: Tensor,
}

/// The chunks of `t` query rows against `s` keys, the first query at position `s - t`.
fn chunks(q: &Tensor, s: usize, scale: f64) -> Result<Vec<Chunk>> {
    let t = q.dim(2)?;
    (0..t)
        .step_by(QUERY_CHUNK)
        .map(|start| {
            let len = QUERY_CHUNK.min(t - start);
            let q_scaled = (q.narrow(2, start, len)? * scale)?.contiguous()?;
            Ok(Chunk { start, len, kv: (s - t + start + len).min(s), q_scaled })
        })
        .collect()
}

/// Softmax probabilities `[b, h, len, kv]` of one chunk: on CUDA without a mask the fused kernel,
/// which masks by position (`window`) and returns the compute dtype; elsewhere the composed ops
/// with the mask (built here when the caller has none; packed rows bring theirs), in f32. Both rules are the same (tested on the GPU).
/// With a soft cap, also tanh(s / cap), which the backward's chain rule reads.
fn chunk_probs(
    c: &Chunk,
    k: &Tensor,
    mask: Option<&Tensor>,
    rule: &ScoreRule,
) -> Result<(Tensor, Option<Tensor>)> {
    let k = k.narrow(2, 0, c.kv)?;
    let scores = c.q_scaled.matmul(&k.t()?)?;
    let (scores, tanh) = match rule.softcap {
        None => (scores, None),
        Some(cap) => softcap(&scores, cap).map(|(s, t)| (s, Some(t)))?,
    };
    #[cfg(feature = "cuda")]
    if scores.device().is_cuda() && mask.is_none() {
        return Ok((crate::cuda::softmax::causal_softmax(&scores, c.kv - c.len, rule.window)?, tanh));
    }
    let mask = match mask {
        // [t, s], or packed rows' [b, 1, t, s]
        Some(m) => m.narrow(D::Minus2, c.start, c.len)?.narrow(D::Minus1, 0, c.kv)?,
        None => causal_mask(c.len, c.kv, c.kv - c.len, rule.window, scores.device())?,
    };
    let scores = scores.to_dtype(DType::F32)?;
    Ok((candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?, tanh))
}

/// dS = P ⊙ (dP − rowsum(dP ⊙ P)) in `dtype`; through a soft cap also times 1 − tanh²(s / cap).
fn softmax_grad(probs: &Tensor, dp: &Tensor, tanh: Option<&Tensor>, dtype: DType) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if probs.device().is_cuda() {
        let ds = crate::cuda::softmax::softmax_backward(probs, dp)?;
        return tanh.map_or(Ok(ds.clone()), |t| softcap_backward(&ds, t, dtype));
    }
    let dp = dp.to_dtype(DType::F32)?;
    let row = (&dp * probs)?.sum_keepdim(D::Minus1)?;
    let ds = (probs * dp.broadcast_sub(&row)?)?;
    tanh.map_or_else(|| ds.to_dtype(dtype), |t| softcap_backward(&ds, t, dtype))
}

/// The packed rows' mask where the composed path needs it and the caller has none (CUDA, where
/// the fused kernels keep packed rows apart by their spans and no mask is built ahead).
fn packed_mask(
    packed: Option<&PackedRows>,
    mask: Option<&Tensor>,
    rule: &ScoreRule,
    q: &Tensor,
) -> Result<Option<Tensor>> {
    match (packed, mask) {
        (Some(p), None) => p.mask(rule.window, q.device()).map(Some),
        _ => Ok(None),
    }
}

/// The composed forward (the reference of the fused paths): chunked scores with the mask.
pub(crate) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    (mask, packed): (Option<&Tensor>, Option<&PackedRows>),
    rule: &ScoreRule,
) -> Result<(Tensor, AttentionSaved)> {
    let built = packed_mask(packed, mask, rule, q)?;
    let mask = mask.or(built.as_ref());
    let n_rep = q.dim(1)? / k.dim(1)?;
    let k = repeat_kv(&k.contiguous()?, n_rep)?;
    let v = repeat_kv(&v.contiguous()?, n_rep)?;
    let contexts = chunks(q, k.dim(2)?, rule.scale)?
        .iter()
        .map(|c| chunk_probs(c, &k, mask, rule)?.0.to_dtype(v.dtype())?.matmul(&v.narrow(2, 0, c.kv)?))
        .collect::<Result<Vec<_>>>()?;
    Ok((Tensor::cat(&contexts, 2)?, AttentionSaved { kernel: None }))
}

/// The composed backward (the reference of the fused paths), recomputing the probabilities.
pub(crate) fn backward(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (mask, packed): (Option<&Tensor>, Option<&PackedRows>),
    rule: &ScoreRule,
    d_context: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let built = packed_mask(packed, mask, rule, q)?;
    let mask = mask.or(built.as_ref());
    let n_rep = q.dim(1)? / k.dim(1)?;
    let scale = rule.scale;
    let dtype = q.dtype();
    let k = repeat_kv(&k.contiguous()?, n_rep)?;
    let v = repeat_kv(&v.contiguous()?, n_rep)?;
    let s = k.dim(2)?;
    let f32_zeros = |x: &Tensor| Tensor::zeros(x.shape(), DType::F32, x.device());
    let (mut dk, mut dv) = (f32_zeros(&k)?, f32_zeros(&v)?);
    let mut dqs = Vec::new();
    // Adds a `[b, h, kv, d]` gradient of the first kv keys into a `[b, h, s, d]` f32 total.
    let accumulate = |total: Tensor, part: Tensor, kv: usize| -> Result<Tensor> {
        total + part.to_dtype(DType::F32)?.pad_with_zeros(2, 0, s - kv)?
    };
    for c in chunks(q, s, scale)? {
        let (probs, tanh) = chunk_probs(&c, &k, mask, rule)?;
        let (k_c, v_c) = (k.narrow(2, 0, c.kv)?, v.narrow(2, 0, c.kv)?);
        let d_ctx = d_context.narrow(2, c.start, c.len)?.contiguous()?;
        dv = accumulate(dv, probs.to_dtype(dtype)?.t()?.matmul(&d_ctx)?, c.kv)?;
        let ds = softmax_grad(&probs, &d_ctx.matmul(&v_c.t()?)?, tanh.as_ref(), dtype)?;
        dqs.push((ds.matmul(&k_c)? * scale)?);
        dk = accumulate(dk, ds.t()?.matmul(&c.q_scaled)?, c.kv)?;
    }
    let dq = Tensor::cat(&dqs, 2)?;
    let (dk, dv) = (dk.to_dtype(dtype)?, dv.to_dtype(dtype)?);
    Ok((dq, sum_kv_groups(&dk, n_rep)?, sum_kv_groups(&dv, n_rep)?))
}
