//! Causal-LM cross-entropy fused with its backward, in chunks of rows and only on trained rows:
//! the full `[tokens × vocab]` logits never exist, and prompt tokens (label −100) cost nothing.

use candle_core::{DType, Result, Tensor, D};

pub const IGNORE_INDEX: i64 = -100;

/// HF's shift: position t predicts labels[t + 1]; the last position of each row predicts nothing.
pub fn shift_labels(labels: &[i64], batch: usize, seq_len: usize) -> Vec<i64> {
    let mut targets = vec![IGNORE_INDEX; labels.len()];
    for row in 0..batch {
        let base = row * seq_len;
        targets[base..base + seq_len - 1].copy_from_slice(&labels[base + 1..base + seq_len]);
    }
    targets
}

pub struct LossOutput {
    /// Sum of per-token negative log-likelihoods (f64 accumulation).
    pub loss_sum: f64,
    pub n_tokens: usize,
    /// d(loss_sum · grad_scale) / d(hidden), `[n, hidden]`; `None` when only the loss was asked.
    pub d_hidden: Option<Tensor>,
}

/// hidden `[n, d]` (after the final norm), lm_head `[vocab, d]`, targets (len n, −100 = none).
/// With `grad_scale = Some(s)` also returns the gradient of `s · loss_sum` w.r.t. hidden.
pub fn cross_entropy(
    hidden: &Tensor,
    lm_head: &Tensor,
    targets: &[i64],
    grad_scale: Option<f64>,
    chunk_rows: usize,
) -> Result<LossOutput> {
    let device = hidden.device();
    let rows: Vec<u32> = (0..targets.len() as u32).filter(|&i| targets[i as usize] != IGNORE_INDEX).collect();
    let mut loss_sum = 0f64;
    let mut d_rows = Vec::new();
    for chunk in rows.chunks(chunk_rows.max(1)) {
        let idx = Tensor::new(chunk, device)?;
        let tgt: Vec<u32> = chunk.iter().map(|&i| targets[i as usize] as u32).collect();
        let tgt = Tensor::from_vec(tgt, (chunk.len(), 1), device)?;
        let h = hidden.index_select(&idx, 0)?;
        let logits = h.matmul(&lm_head.t()?)?.to_dtype(DType::F32)?;
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let picked = log_probs.gather(&tgt, 1)?;
        loss_sum -= picked.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        if let Some(scale) = grad_scale {
            // d(-log p_t)/d logits = softmax − onehot(t).
            let minus_one = Tensor::full(-1f32, (chunk.len(), 1), device)?;
            let d_logits = log_probs.exp()?.scatter_add(&tgt, &minus_one, 1)?;
            let d_logits = (d_logits * scale)?.to_dtype(hidden.dtype())?;
            d_rows.push(d_logits.matmul(lm_head)?);
        }
    }
    let d_hidden = match grad_scale {
        None => None,
        Some(_) => {
            let zeros = hidden.zeros_like()?;
            Some(if rows.is_empty() {
                zeros
            } else {
                let idx = Tensor::new(rows.as_slice(), device)?;
                zeros.index_add(&idx, &Tensor::cat(&d_rows, 0)?, 0)?
            })
        }
    };
    Ok(LossOutput { loss_sum, n_tokens: rows.len(), d_hidden })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn shift_drops_first_label_and_ignores_last_position() {
        let t = shift_labels(&[1, 2, 3, 4, 5, 6], 2, 3);
        assert_eq!(t, vec![2, 3, -100, 5, 6, -100]);
    }

    #[test]
    fn loss_and_gradient_match_autograd() {
        let dev = Device::Cpu;
        let hidden = Tensor::randn(0f32, 1.0, (6, 4), &dev).unwrap();
        let head = Tensor::randn(0f32, 1.0, (9, 4), &dev).unwrap();
        let targets = [3, -100, 0, 8, -100, 2];
        let out = cross_entropy(&hidden, &head, &targets, Some(0.25), 2).unwrap();
        // Reference: full logits, candle_nn's cross-entropy (a mean), autograd.
        let hv = candle_core::Var::from_tensor(&hidden).unwrap();
        let keep = Tensor::new(&[0u32, 2, 3, 5], &dev).unwrap();
        let logits = hv.as_tensor().index_select(&keep, 0).unwrap().matmul(&head.t().unwrap()).unwrap();
        let tgt = Tensor::new(&[3u32, 0, 8, 2], &dev).unwrap();
        let mean = candle_nn::loss::cross_entropy(&logits, &tgt).unwrap();
        let expected_sum = mean.to_scalar::<f32>().unwrap() as f64 * 4.0;
        assert_eq!(out.n_tokens, 4);
        assert!((out.loss_sum - expected_sum).abs() < 1e-5 * expected_sum.abs());
        // d(0.25 · sum) = d(mean · 4 · 0.25) = d(mean).
        let grads = mean.backward().unwrap();
        let expected = grads.get(hv.as_tensor()).unwrap();
        let diff = (out.d_hidden.unwrap() - expected).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
    }
}
