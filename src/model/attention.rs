//! Causal scaled-dot-product attention with grouped-query heads and an optional sliding window,
//! and its backward. Sequences are padded on the right, so causality alone keeps real tokens
//! from seeing padding and no padding mask is needed.

use candle_core::{DType, Device, Result, Tensor, D};

/// Additive mask `[q_len, kv_len]` (0 or −∞) for queries at positions offset..offset+q_len.
/// A key j is visible to query i when j ≤ i and, with a window w, i − j < w (HF Mistral).
pub fn causal_mask(
    q_len: usize,
    kv_len: usize,
    offset: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Tensor> {
    let mask: Vec<f32> = (0..q_len)
        .flat_map(|qi| {
            let i = qi + offset;
            (0..kv_len).map(move |j| {
                let visible = j <= i && window.is_none_or(|w| i - j < w);
                if visible {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (q_len, kv_len), device)
}

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

/// What the backward needs from one attention forward.
pub struct AttentionSaved {
    pub probs: Tensor,
}

/// q `[b, h, t, d]`, k/v `[b, kv, s, d]` (already rotated), mask `[t, s]`. Returns the context
/// `[b, h, t, d]` and the softmax probabilities (f32).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<(Tensor, AttentionSaved)> {
    let n_rep = q.dim(1)? / k.dim(1)?;
    let scale = 1.0 / (q.dim(D::Minus1)? as f64).sqrt();
    let k = repeat_kv(k, n_rep)?;
    let v = repeat_kv(v, n_rep)?;
    let scores = (q.contiguous()?.matmul(&k.t()?)? * scale)?.to_dtype(DType::F32)?;
    let scores = scores.broadcast_add(mask)?;
    let probs = candle_nn::ops::softmax_last_dim(&scores)?;
    let context = probs.to_dtype(v.dtype())?.matmul(&v)?;
    Ok((context, AttentionSaved { probs }))
}

/// Backward of `attention`: given d(context), returns (dq, dk, dv) with dk/dv summed back to
/// the kv heads. dS = P ⊙ (dP − rowsum(dP ⊙ P)).
pub fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    saved: &AttentionSaved,
    d_context: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let n_rep = q.dim(1)? / k.dim(1)?;
    let scale = 1.0 / (q.dim(D::Minus1)? as f64).sqrt();
    let dtype = q.dtype();
    let k = repeat_kv(k, n_rep)?;
    let v = repeat_kv(v, n_rep)?;
    let probs = &saved.probs;
    let d_context = d_context.contiguous()?;
    let dv = probs.to_dtype(dtype)?.t()?.matmul(&d_context)?;
    let dp = d_context.matmul(&v.t()?)?.to_dtype(DType::F32)?;
    let row = (&dp * probs)?.sum_keepdim(D::Minus1)?;
    let ds = (probs * dp.broadcast_sub(&row)?)?.to_dtype(dtype)?;
    let dq = (ds.matmul(&k)? * scale)?;
    let dk = (ds.t()?.matmul(&q.contiguous()?)? * scale)?;
    Ok((dq, sum_kv_groups(&dk, n_rep)?, sum_kv_groups(&dv, n_rep)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliding_window_mask_matches_hf_rule() {
        let m = causal_mask(4, 4, 0, Some(2), &Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let visible: Vec<Vec<bool>> = m.iter().map(|r| r.iter().map(|v| v.is_finite()).collect()).collect();
        assert_eq!(
            visible,
            vec![
                vec![true, false, false, false],
                vec![true, true, false, false],
                vec![false, true, true, false],
                vec![false, false, true, true],
            ]
        );
        // With a cache: query at position 5 sees keys 4 and 5 only.
        let m = causal_mask(1, 6, 5, Some(2), &Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
        let seen: Vec<usize> = (0..6).filter(|&j| m[0][j].is_finite()).collect();
        assert_eq!(seen, vec![4, 5]);
    }
}
