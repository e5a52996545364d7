//! Causal scaled-dot-product attention with grouped-query heads, an optional sliding window, a
//! query scale of the family's choosing and Gemma 2's soft-capped scores, and its backward.
//! Sequences are padded on the right, so causality alone keeps real tokens from seeing padding
//! and no padding mask is needed.

use candle_core::{DType, Device, Result, Tensor, D};

use super::softcap::{softcap, softcap_backward};

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

/// How one layer turns q·kᵀ into probabilities: s = scale · q·kᵀ, soft-capped to
/// cap · tanh(s / cap) where the family does (Gemma 2), masked causally and to the sliding window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreRule {
    /// 1/sqrt(head_dim), or Gemma's 1/sqrt(query_pre_attn_scalar).
    pub scale: f64,
    pub softcap: Option<f64>,
    pub window: Option<usize>,
}

impl ScoreRule {
    /// Plain causal attention over heads of `head_dim`, with an optional window.
    pub fn causal(head_dim: usize, window: Option<usize>) -> Self {
        Self { scale: 1.0 / (head_dim as f64).sqrt(), softcap: None, window }
    }

    /// The factor q is multiplied by so that kernels that scale by 1/sqrt(head_dim) compute
    /// this rule's scale (1 for every family but Gemma's with query_pre_attn_scalar ≠ head_dim).
    #[cfg(feature = "cuda")]
    fn query_factor(&self, head_dim: usize) -> f64 {
        self.scale * (head_dim as f64).sqrt()
    }
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

/// Softmax probabilities `[b, h, len, kv]` of one chunk: on CUDA the fused kernel, which masks by
/// position (`window`) and returns the compute dtype; elsewhere the composed ops with the mask
/// (built here when the caller has none), in f32. Both rules are the same (tested on the GPU).
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
    if scores.device().is_cuda() {
        return Ok((crate::cuda::softmax::causal_softmax(&scores, c.kv - c.len, rule.window)?, tanh));
    }
    let mask = match mask {
        Some(m) => m.narrow(0, c.start, c.len)?.narrow(1, 0, c.kv)?,
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

/// What the backward needs beyond q, k, v: on CUDA, the forward's context and row log-sum-exp;
/// the composed path recomputes everything and keeps nothing.
pub struct AttentionSaved {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    kernel: Option<KernelSaved>,
}

impl AttentionSaved {
    /// Which implementation ran the forward: "cudnn", "flash" or "composed".
    pub fn kernel_name(&self) -> &'static str {
        match self.kernel {
            Some(KernelSaved::Cudnn { .. }) => "cudnn",
            Some(KernelSaved::Flash { .. }) => "flash",
            None => "composed",
        }
    }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
enum KernelSaved {
    /// flash.rs: lse in log2 units.
    Flash { context: Tensor, lse: Tensor },
    /// cudnn_sdpa.rs: the same statistic in natural-log units.
    Cudnn { context: Tensor, stats: Tensor },
}

/// q as the fused kernels take it: times `query_factor` where the rule's scale is not theirs.
#[cfg(feature = "cuda")]
fn kernel_query(q: &Tensor, rule: &ScoreRule) -> Result<Tensor> {
    let factor = rule.query_factor(q.dim(D::Minus1)?);
    if (factor - 1.0).abs() < 1e-12 {
        return Ok(q.clone());
    }
    q * factor
}

/// q `[b, h, t, d]`, k/v `[b, kv, s, d]` (already rotated), mask `[t, s]` or `None` (causal: query
/// i sits at position s − t + i; `rule.window` is the same sliding window the mask holds; the CUDA
/// kernels mask by position and never read it). Returns the context `[b, h, t, d]`. Soft-capped
/// scores take the composed path everywhere (the fused kernels do not cap).
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    rule: &ScoreRule,
) -> Result<(Tensor, AttentionSaved)> {
    #[cfg(feature = "cuda")]
    if crate::cuda::flash::supported(q) && rule.softcap.is_none() {
        let qk = kernel_query(q, rule)?;
        if let Some((context, stats)) = crate::cuda::cudnn_sdpa::forward(&qk, k, v, rule.window)? {
            return Ok((
                context.clone(),
                AttentionSaved { kernel: Some(KernelSaved::Cudnn { context, stats }) },
            ));
        }
        let (context, lse) = crate::cuda::flash::forward(&qk, k, v, rule.window)?;
        return Ok((context.clone(), AttentionSaved { kernel: Some(KernelSaved::Flash { context, lse }) }));
    }
    let n_rep = q.dim(1)? / k.dim(1)?;
    let k = repeat_kv(k, n_rep)?;
    let v = repeat_kv(v, n_rep)?;
    let contexts = chunks(q, k.dim(2)?, rule.scale)?
        .iter()
        .map(|c| chunk_probs(c, &k, mask, rule)?.0.to_dtype(v.dtype())?.matmul(&v.narrow(2, 0, c.kv)?))
        .collect::<Result<Vec<_>>>()?;
    Ok((Tensor::cat(&contexts, 2)?, AttentionSaved { kernel: None }))
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
    #[cfg(feature = "cuda")]
    if let Some(kernel) = &saved.kernel {
        let qk = kernel_query(q, rule)?;
        let window = rule.window;
        let (dq, dk, dv) = match kernel {
            KernelSaved::Flash { context, lse } => {
                crate::cuda::flash::backward(&qk, k, v, context, lse, d_context, window, None)?
            }
            KernelSaved::Cudnn { context, stats } => {
                match crate::cuda::cudnn_sdpa::backward(&qk, k, v, context, stats, d_context)? {
                    Some(grads) => grads,
                    None => {
                        // cuDNN refused the backward graph: the flash kernel takes the statistic
                        // in log2 units
                        let lse = (stats * std::f64::consts::LOG2_E)?;
                        crate::cuda::flash::backward(&qk, k, v, context, &lse, d_context, window, None)?
                    }
                }
            }
        };
        let factor = rule.query_factor(q.dim(D::Minus1)?);
        let dq = if (factor - 1.0).abs() < 1e-12 { dq } else { (dq * factor)? };
        return Ok((dq, dk, dv));
    }
    let _ = saved;
    let n_rep = q.dim(1)? / k.dim(1)?;
    let scale = rule.scale;
    let dtype = q.dtype();
    let k = repeat_kv(k, n_rep)?;
    let v = repeat_kv(v, n_rep)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_within_reference_error;
    use candle_core::Var;

    #[cfg(feature = "cuda")]
    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        d / b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    /// The unchunked formula in composed candle ops, in the inputs' dtype throughout (candle's
    /// softmax keeps f64): the reference, and in f64 its exact answer.
    fn unchunked(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Tensor,
        n_rep: usize,
        rule: &ScoreRule,
    ) -> Tensor {
        let (kr, vr) = (repeat_kv(k, n_rep).unwrap(), repeat_kv(v, n_rep).unwrap());
        let scores = (q.matmul(&kr.t().unwrap()).unwrap() * rule.scale).unwrap();
        let scores = match rule.softcap {
            Some(cap) => ((scores / cap).unwrap().tanh().unwrap() * cap).unwrap(),
            None => scores,
        };
        let mask = mask.to_dtype(scores.dtype()).unwrap();
        let probs = candle_nn::ops::softmax(&scores.broadcast_add(&mask).unwrap(), D::Minus1).unwrap();
        probs.matmul(&vr).unwrap()
    }

    /// Across several query chunks (t > QUERY_CHUNK), GQA and a sliding window: the chunked forward
    /// and the recomputing backward equal candle's autograd through the unchunked formula; plain,
    /// and with Gemma's own query scale and Gemma 2's soft cap (tight enough to bend the scores).
    #[test]
    fn chunked_attention_and_backward_match_autograd() {
        let d = 8;
        chunked_attention_case(&ScoreRule::causal(d, Some(300)));
        chunked_attention_case(&ScoreRule { scale: 0.3, softcap: Some(1.5), window: Some(300) });
    }

    fn chunked_attention_case(rule: &ScoreRule) {
        let (b, h, kv, t, d) = (1, 4, 2, QUERY_CHUNK + 100, 8);
        let dev = Device::Cpu;
        let q = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap()).unwrap();
        let k = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, kv, t, d), &dev).unwrap()).unwrap();
        let v = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, kv, t, d), &dev).unwrap()).unwrap();
        let mask = causal_mask(t, t, 0, Some(300), &dev).unwrap();
        let d_ctx = Tensor::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap();

        let reference = unchunked(q.as_tensor(), k.as_tensor(), v.as_tensor(), &mask, 2, rule);
        let grads = (&reference * &d_ctx).unwrap().sum_all().unwrap().backward().unwrap();
        // the same in f64: the exact answer
        let f64 = |x: &Tensor| Var::from_tensor(&x.to_dtype(DType::F64).unwrap()).unwrap();
        let (q64, k64, v64) = (f64(&q), f64(&k), f64(&v));
        let exact = unchunked(q64.as_tensor(), k64.as_tensor(), v64.as_tensor(), &mask, 2, rule);
        let d_ctx64 = d_ctx.to_dtype(DType::F64).unwrap();
        let grads64 = (&exact * &d_ctx64).unwrap().sum_all().unwrap().backward().unwrap();

        let (ctx, saved) = attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), Some(&mask), rule).unwrap();
        assert_within_reference_error("attention forward", &ctx, &reference, &exact);
        let (dq, dk, dv) =
            attention_backward(q.as_tensor(), k.as_tensor(), v.as_tensor(), None, rule, &saved, &d_ctx)
                .unwrap();
        for (name, ours, var, var64) in [("dq", &dq, &q, &q64), ("dk", &dk, &k, &k64), ("dv", &dv, &v, &v64)]
        {
            let want = grads.get(var.as_tensor()).unwrap();
            let exact = grads64.get(var64.as_tensor()).unwrap();
            assert_within_reference_error(&format!("attention {name} {rule:?}"), ours, want, exact);
        }
    }

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

    /// The CUDA paths against the composed ops on the CPU: the flash kernels and cuDNN's SDPA
    /// (f16, bf16; head_dim 64 and 128) and the fused softmax (f32), forward and backward, over
    /// rows that are not a multiple of the tiles, GQA, a sliding window that cuts and one that
    /// does not, and fewer queries than keys (a KV cache). With `LORA_FT_TEST_NEEDS_CUDNN=1` (the
    /// device scripts) cuDNN must have loaded and taken the training-shaped cases.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_attention_matches_the_composed_cpu_path() {
        use crate::cuda::cudnn_sdpa::{self, Mode};
        let needs_cudnn = std::env::var("LORA_FT_TEST_NEEDS_CUDNN").is_ok_and(|v| v == "1");
        for mode in [Mode::Flash, Mode::Auto] {
            cudnn_sdpa::set_mode(mode);
            cuda_attention_cases(mode == Mode::Auto && needs_cudnn);
        }
        cudnn_sdpa::set_mode(Mode::Auto);
    }

    #[cfg(feature = "cuda")]
    fn cuda_attention_cases(needs_cudnn: bool) {
        let gpu = Device::new_cuda(0).unwrap();
        let cpu = Device::Cpu;
        let rand = |shape: (usize, usize, usize, usize)| Tensor::randn(0f32, 1.0, shape, &cpu).unwrap();
        // the last two: Gemma's head_dim 256 with its query scale (composed path on the GPU), and
        // Gemma 2's soft cap with a query scale the kernels take through q
        let gemma = |d: usize, window, softcap| ScoreRule { scale: 1.0 / 144f64.sqrt(), softcap, window };
        let cases = [
            (64, QUERY_CHUNK + 300, QUERY_CHUNK + 300, ScoreRule::causal(64, Some(400))),
            (128, 300, 300, ScoreRule::causal(128, None)),
            (64, 200, 200, ScoreRule::causal(64, Some(1000))),
            (128, 37, 300, ScoreRule::causal(128, Some(100))),
            (256, 300, 300, gemma(256, Some(100), None)),
            (128, 300, 300, gemma(128, None, None)),
            (128, 300, 300, gemma(128, Some(200), Some(50.0))),
        ];
        for (d, t, s, rule) in cases {
            let window = rule.window;
            let (b, h, kv) = (2, 8, 2);
            let (q, k, v, dc) =
                (rand((b, h, t, d)), rand((b, kv, s, d)), rand((b, kv, s, d)), rand((b, h, t, d)));
            let (want, saved) = attention(&q, &k, &v, None, &rule).unwrap();
            let (wq, wk, wv) = attention_backward(&q, &k, &v, None, &rule, &saved, &dc).unwrap();
            for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-2), (DType::BF16, 5e-2)] {
                let on_gpu = |x: &Tensor| x.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
                let (gq, gk, gv) = (on_gpu(&q), on_gpu(&k), on_gpu(&v));
                let (ctx, saved) = attention(&gq, &gk, &gv, None, &rule).unwrap();
                let on_cudnn = matches!(saved.kernel, Some(KernelSaved::Cudnn { .. }));
                let training_shape =
                    t == s && window.is_none_or(|w| w >= s) && d <= 128 && rule.softcap.is_none();
                if dtype != DType::F32 && needs_cudnn {
                    assert_eq!(
                        on_cudnn, training_shape,
                        "d {d} t {t} s {s} {window:?}: cuDNN taken {on_cudnn}"
                    );
                }
                let (dq, dk, dv) =
                    attention_backward(&gq, &gk, &gv, None, &rule, &saved, &on_gpu(&dc)).unwrap();
                let check = |name: &str, ours: &Tensor, reference: &Tensor| {
                    let ours = ours.to_dtype(DType::F32).unwrap().to_device(&cpu).unwrap();
                    let err = max_rel(&ours, reference);
                    println!("d {d} t {t} s {s} {dtype:?} cudnn {on_cudnn} {name}: {err:.2e}");
                    assert!(err < tol, "d {d} t {t} s {s} {dtype:?} {name}: {err}");
                };
                for (name, ours, reference) in
                    [("context", ctx, &want), ("dq", dq, &wq), ("dk", dk, &wk), ("dv", dv, &wv)]
                {
                    check(name, &ours, reference);
                }
                // both shapes of the backward kernel, whichever this GPU picks by default (called
                // directly, so only where q needs no factor)
                let plain_scale = rule == ScoreRule { window, ..ScoreRule::causal(d, None) };
                if let (Some(KernelSaved::Flash { context, lse }), true) = (&saved.kernel, plain_scale) {
                    let dc = on_gpu(&dc);
                    for shape in crate::cuda::flash::BackwardShape::ALL {
                        let (dq, dk, dv) = crate::cuda::flash::backward(
                            &gq,
                            &gk,
                            &gv,
                            context,
                            lse,
                            &dc,
                            window,
                            Some(shape),
                        )
                        .unwrap();
                        for (name, ours, reference) in [("dq", dq, &wq), ("dk", dk, &wk), ("dv", dv, &wv)] {
                            check(&format!("{shape:?} {name}"), &ours, reference);
                        }
                    }
                }
            }
        }
    }
}
