//! Causal-LM cross-entropy fused with its backward, in chunks of rows and only on trained rows:
//! the full `[tokens × vocab]` logits never exist, and prompt tokens (label −100) cost nothing.

use candle_core::{DType, Result, Tensor, D};

use super::softcap::{softcap, softcap_backward};

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

/// hidden `[n, d]` (after the final norm), lm_head `[vocab, d]`, targets (len n, −100 = none);
/// logits soft-capped to `softcap` first where the family does (Gemma 2).
/// With `grad_scale = Some(s)` also returns the gradient of `s · loss_sum` w.r.t. hidden.
/// Logits exist one chunk of `chunk_rows` trained rows at a time; on CUDA the fused kernel turns
/// each chunk into per-row losses (summed once, at the end: one read-back) and its gradient, on
/// the CPU (f32, no cap) the fused loop of `cpu::cross_entropy`.
pub fn cross_entropy(
    hidden: &Tensor,
    lm_head: &Tensor,
    targets: &[i64],
    grad_scale: Option<f64>,
    chunk_rows: usize,
    logit_softcap: Option<f64>,
) -> Result<LossOutput> {
    let device = hidden.device();
    let rows: Vec<u32> = (0..targets.len() as u32).filter(|&i| targets[i as usize] != IGNORE_INDEX).collect();
    let mut loss_sum = 0f64;
    let mut row_losses = Vec::new();
    let mut d_rows = Vec::new();
    for chunk in rows.chunks(chunk_rows.max(1)) {
        let idx = Tensor::new(chunk, device)?;
        let tgt: Vec<u32> = chunk.iter().map(|&i| targets[i as usize] as u32).collect();
        if logit_softcap.is_none() && super::cpu::takes(&[hidden, lm_head]) {
            let hs = hidden.index_select(&idx, 0)?;
            let (loss, d) = super::cpu::cross_entropy::chunk(&hs, lm_head, &tgt, grad_scale)?;
            loss_sum += loss;
            d_rows.extend(d);
            continue;
        }
        let tgt = Tensor::from_vec(tgt, chunk.len(), device)?;
        let logits = hidden.index_select(&idx, 0)?.matmul(&lm_head.t()?)?;
        let d_logits = if device.is_cuda() {
            // the cap inside the kernel: no capped copy, no f32 tanh, no chain-rule passes
            fused_chunk(&logits, &tgt, grad_scale, logit_softcap, &mut row_losses)?
        } else {
            let (logits, tanh) = match logit_softcap {
                None => (logits, None),
                Some(cap) => softcap(&logits, cap).map(|(l, t)| (l, Some(t)))?,
            };
            let (loss, d_logits) = composed_chunk(&logits, &tgt, grad_scale)?;
            loss_sum += loss;
            match (d_logits, &tanh) {
                (Some(d), Some(t)) => Some(softcap_backward(&d, t, logits.dtype())?),
                (d, _) => d,
            }
        };
        if let Some(d_logits) = d_logits {
            d_rows.push(d_logits.matmul(lm_head)?);
        }
    }
    if !row_losses.is_empty() {
        loss_sum += Tensor::cat(&row_losses, 0)?.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
    }
    let d_hidden = match grad_scale {
        None => None,
        Some(_) => Some(if rows.is_empty() {
            hidden.zeros_like()?
        } else {
            super::rows::rows_among(hidden, &rows, &Tensor::cat(&d_rows, 0)?)?
        }),
    };
    Ok(LossOutput { loss_sum, n_tokens: rows.len(), d_hidden })
}

/// One chunk in f32 candle ops (the CPU path and the reference): its summed loss and
/// d(grad_scale · loss)/d(logits) in the logits' dtype.
fn composed_chunk(logits: &Tensor, tgt: &Tensor, grad_scale: Option<f64>) -> Result<(f64, Option<Tensor>)> {
    let tgt = tgt.unsqueeze(1)?;
    let log_probs = candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
    let loss = -log_probs.gather(&tgt, 1)?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    let Some(scale) = grad_scale else { return Ok((loss, None)) };
    // d(-log p_t)/d logits = softmax − onehot(t).
    let minus_one = Tensor::full(-1f32, tgt.shape(), logits.device())?;
    let d_logits = log_probs.exp()?.scatter_add(&tgt, &minus_one, 1)?;
    Ok((loss, Some((d_logits * scale)?.to_dtype(logits.dtype())?)))
}

/// One chunk through the fused CUDA kernel: per-row losses pushed to `row_losses`, the gradient
/// returned.
#[cfg(feature = "cuda")]
fn fused_chunk(
    logits: &Tensor,
    tgt: &Tensor,
    grad_scale: Option<f64>,
    softcap: Option<f64>,
    row_losses: &mut Vec<Tensor>,
) -> Result<Option<Tensor>> {
    let (losses, d_logits) =
        crate::cuda::cross_entropy::cross_entropy_rows(logits, tgt, grad_scale, softcap)?;
    row_losses.push(losses);
    Ok(d_logits)
}

#[cfg(not(feature = "cuda"))]
fn fused_chunk(
    logits: &Tensor,
    tgt: &Tensor,
    grad_scale: Option<f64>,
    softcap: Option<f64>,
    _: &mut Vec<Tensor>,
) -> Result<Option<Tensor>> {
    let _ = (logits, tgt, grad_scale, softcap);
    candle_core::bail!("the fused cross-entropy needs the cuda feature")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_within_reference_error;
    use candle_core::Device;

    #[test]
    fn shift_drops_first_label_and_ignores_last_position() {
        let t = shift_labels(&[1, 2, 3, 4, 5, 6], 2, 3);
        assert_eq!(t, vec![2, 3, -100, 5, 6, -100]);
    }

    /// Reference: full logits (soft-capped by their formula where asked), candle_nn's
    /// cross-entropy (a mean), autograd; the same in f64 (log_softmax and nll keep the dtype) is
    /// the exact answer.
    #[test]
    fn loss_and_gradient_match_autograd() {
        loss_case(None);
        // a cap of 2 on logits of spread ~2: well inside tanh's bend
        loss_case(Some(2.0));
    }

    fn loss_case(cap: Option<f64>) {
        let dev = Device::Cpu;
        let hidden = Tensor::randn(0f32, 1.0, (6, 4), &dev).unwrap();
        let head = Tensor::randn(0f32, 1.0, (9, 4), &dev).unwrap();
        let targets = [3, -100, 0, 8, -100, 2];
        let out = cross_entropy(&hidden, &head, &targets, Some(0.25), 2, cap).unwrap();
        // the mean loss and its gradient w.r.t. hidden, in the inputs' dtype
        let reference = |hidden: &Tensor, head: &Tensor| {
            let hv = candle_core::Var::from_tensor(hidden).unwrap();
            let keep = Tensor::new(&[0u32, 2, 3, 5], &dev).unwrap();
            let logits = hv.as_tensor().index_select(&keep, 0).unwrap().matmul(&head.t().unwrap()).unwrap();
            let logits = match cap {
                Some(c) => ((logits / c).unwrap().tanh().unwrap() * c).unwrap(),
                None => logits,
            };
            let tgt = Tensor::new(&[3u32, 0, 8, 2], &dev).unwrap();
            let mean = candle_nn::loss::cross_entropy(&logits, &tgt).unwrap();
            let grads = mean.backward().unwrap();
            (mean, grads.get(hv.as_tensor()).unwrap().clone())
        };
        let (mean, expected) = reference(&hidden, &head);
        let f64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let (mean64, exact) = reference(&f64(&hidden), &f64(&head));
        assert_eq!(out.n_tokens, 4);
        let sum = |mean: &Tensor| (mean * 4.0).unwrap();
        let ours = Tensor::new(out.loss_sum, &dev).unwrap();
        assert_within_reference_error("loss sum", &ours, &sum(&mean), &sum(&mean64));
        // d(0.25 · sum) = d(mean · 4 · 0.25) = d(mean).
        assert_within_reference_error("d_hidden", &out.d_hidden.unwrap(), &expected, &exact);
    }

    /// The fused kernel against the composed chunk (f32, f16, bf16 logits), and the whole chunked
    /// loss on CUDA against the CPU (ignored rows, chunks that do not divide the rows).
    #[cfg(feature = "cuda")]
    #[test]
    fn fused_cuda_cross_entropy_matches_the_composed_cpu_loss() {
        let (cpu, gpu) = (Device::Cpu, Device::new_cuda(0).unwrap());
        let max_abs = |t: &Tensor| t.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let logits = Tensor::randn(0f32, 3.0, (37, 1000), &cpu).unwrap();
        let tgt = Tensor::from_vec((0..37u32).map(|i| i * 97 % 1000).collect::<Vec<_>>(), 37, &cpu).unwrap();
        for (dtype, tol) in [(DType::F32, 1e-6), (DType::F16, 1e-3), (DType::BF16, 1e-2)] {
            let l = logits.to_dtype(dtype).unwrap();
            let (want_loss, want_d) = composed_chunk(&l, &tgt, Some(0.5)).unwrap();
            let on_gpu = |t: &Tensor| t.to_device(&gpu).unwrap();
            let (losses, d) =
                crate::cuda::cross_entropy::cross_entropy_rows(&on_gpu(&l), &on_gpu(&tgt), Some(0.5), None)
                    .unwrap();
            let loss = losses.to_dtype(DType::F64).unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
            assert!(
                (loss - want_loss).abs() < 1e-5 * want_loss.abs(),
                "{dtype:?} loss {loss} vs {want_loss}"
            );
            let want_d = want_d.unwrap().to_dtype(DType::F32).unwrap();
            let d = d.unwrap().to_dtype(DType::F32).unwrap().to_device(&cpu).unwrap();
            let err = max_abs(&(d - &want_d).unwrap()) / max_abs(&want_d);
            assert!(err < tol, "{dtype:?} gradient {err}");
            let (_, none) =
                crate::cuda::cross_entropy::cross_entropy_rows(&on_gpu(&l), &on_gpu(&tgt), None, None)
                    .unwrap();
            assert!(none.is_none());
        }
        let hidden = Tensor::randn(0f32, 1.0, (11, 16), &cpu).unwrap();
        let head = Tensor::randn(0f32, 1.0, (300, 16), &cpu).unwrap();
        let targets = [3, -100, 0, 299, -100, 2, 7, 8, 9, 10, -100];
        // plain and soft-capped (Gemma 2's final logits)
        for cap in [None, Some(2.0)] {
            let want = cross_entropy(&hidden, &head, &targets, Some(0.25), 3, cap).unwrap();
            let (h, w) = (hidden.to_device(&gpu).unwrap(), head.to_device(&gpu).unwrap());
            let got = cross_entropy(&h, &w, &targets, Some(0.25), 3, cap).unwrap();
            assert_eq!(got.n_tokens, want.n_tokens);
            assert!((got.loss_sum - want.loss_sum).abs() < 1e-5 * want.loss_sum.abs(), "{cap:?}");
            let want_d = want.d_hidden.unwrap();
            let got_d = got.d_hidden.unwrap().to_device(&cpu).unwrap();
            assert!(max_abs(&(got_d - &want_d).unwrap()) < 1e-5 * max_abs(&want_d), "{cap:?}");
        }
    }

    /// The cap inside the kernel gives the bits of the composed cap on CUDA (capped logits in the
    /// compute dtype, the plain kernel, the chain rule through the f32 tanh): losses and gradients,
    /// in f32, f16 and bf16, with logits spread well past the cap's bend.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_cap_in_the_kernel_equals_the_composed_cap() {
        use crate::cuda::cross_entropy::cross_entropy_rows;
        let gpu = Device::new_cuda(0).unwrap();
        let logits = (Tensor::randn(0f32, 1.0, (7, 1000), &gpu).unwrap() * 40.0).unwrap();
        let tgt = Tensor::new(&[0u32, 999, 5, 17, 500, 3, 3], &gpu).unwrap();
        let bits =
            |t: &Tensor| t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let l = logits.to_dtype(dtype).unwrap();
            let (fused_loss, fused_d) = cross_entropy_rows(&l, &tgt, Some(0.5), Some(30.0)).unwrap();
            let (capped, tanh) = softcap(&l, 30.0).unwrap();
            let (loss, d) = cross_entropy_rows(&capped, &tgt, Some(0.5), None).unwrap();
            let d = softcap_backward(&d.unwrap(), &tanh, dtype).unwrap();
            assert_eq!(bits(&fused_loss), bits(&loss), "{dtype:?} losses");
            let (fd, d) = (bits(&fused_d.unwrap()), bits(&d));
            let differing = fd.iter().zip(&d).filter(|(a, b)| a != b).count();
            assert_eq!(differing, 0, "{dtype:?} gradients");
        }
    }
}
