//! Causal scaled-dot-product attention with grouped-query heads, an optional sliding window, a
//! query scale of the family's choosing and Gemma 2's soft-capped scores, and its backward.
//! Sequences are padded on the right, so causality alone keeps real tokens from seeing padding
//! and no padding mask is needed.

use candle_core::{DType, Device, Result, Tensor, D};

use super::softcap::{softcap, softcap_backward};
use crate::model::packing::PackedRows;

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

/// What the backward needs beyond q, k, v: on CUDA, the forward's context and row log-sum-exp;
/// on the CPU's fused path the log-sum-exp; the composed path recomputes everything and keeps
/// nothing.
pub struct AttentionSaved {
    kernel: Option<KernelSaved>,
}

impl AttentionSaved {
    /// Nothing kept: a forward no backward follows.
    pub fn nothing() -> Self {
        Self { kernel: None }
    }

    /// The kernel's saved output and statistics (none on the composed path), for offloading.
    pub fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        match &mut self.kernel {
            Some(KernelSaved::Flash { context, lse }) => vec![context, lse],
            Some(KernelSaved::Cudnn { context, stats }) => vec![context, stats],
            Some(KernelSaved::Cpu { lse }) => vec![lse],
            None => Vec::new(),
        }
    }

    /// Which implementation ran the forward: "cudnn", "flash", "cpu" or "composed".
    pub fn kernel_name(&self) -> &'static str {
        match self.kernel {
            Some(KernelSaved::Cudnn { .. }) => "cudnn",
            Some(KernelSaved::Flash { .. }) => "flash",
            Some(KernelSaved::Cpu { .. }) => "cpu",
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
    /// cpu/attention.rs: the row log-sum-exp `[b, h, t]`, natural log.
    Cpu { lse: Tensor },
}

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
fn cpu_visible<'a>(packed: Option<&'a PackedRows>, rule: &ScoreRule) -> super::cpu::attention::Visible<'a> {
    super::cpu::attention::Visible { spans: packed.map(|p| p.spans()), window: rule.window }
}

/// cuDNN's attention graphs built so far in this process and the seconds that took (none without
/// CUDA): each new shape builds a forward and a backward graph.
pub fn graph_builds() -> (u64, f64) {
    #[cfg(feature = "cuda")]
    return crate::cuda::cudnn_sdpa::graph_builds();
    #[cfg(not(feature = "cuda"))]
    (0, 0.0)
}

/// The rule as cuDNN takes it (scale, cap and window are its graph's own).
#[cfg(feature = "cuda")]
fn cudnn_rule(rule: &ScoreRule) -> crate::cuda::cudnn_sdpa::Rule {
    crate::cuda::cudnn_sdpa::Rule { scale: rule.scale, softcap: rule.softcap, window: rule.window }
}

/// q as the flash kernels take it: times `query_factor` where the rule's scale is not theirs.
#[cfg(feature = "cuda")]
fn flash_query(q: &Tensor, rule: &ScoreRule) -> Result<Tensor> {
    let factor = rule.query_factor(q.dim(D::Minus1)?);
    if (factor - 1.0).abs() < 1e-12 {
        return Ok(q.clone());
    }
    q * factor
}

/// Whether our flash kernels take the call: head_dim 64 or 128, no soft cap.
#[cfg(feature = "cuda")]
fn flash_takes(q: &Tensor, rule: &ScoreRule) -> bool {
    rule.softcap.is_none() && crate::cuda::flash::supported(q)
}

/// The fused kernels' forward where one takes the call: cuDNN (head_dim up to 256, soft caps
/// and windows included), else our flash kernels (64, 128, no cap; packed rows through their
/// spans); `None` for the composed path (f32, other head dims, or a soft cap cuDNN refused).
#[cfg(feature = "cuda")]
fn kernel_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rule: &ScoreRule,
    packed: Option<&PackedRows>,
) -> Result<Option<(Tensor, AttentionSaved)>> {
    let d = q.dim(D::Minus1)?;
    let half = matches!(q.dtype(), DType::F16 | DType::BF16);
    if !q.device().is_cuda() || !half || d % 8 != 0 || d > 256 {
        return Ok(None);
    }
    let columns = packed.map(|p| ragged_columns(p, q, k)).transpose()?;
    let ragged = columns.as_deref().map(cudnn_ragged);
    if let Some((context, stats)) =
        crate::cuda::cudnn_sdpa::forward(q, k, v, &cudnn_rule(rule), ragged.as_ref())?
    {
        let saved = AttentionSaved { kernel: Some(KernelSaved::Cudnn { context: context.clone(), stats }) };
        return Ok(Some((context, saved)));
    }
    if !flash_takes(q, rule) || (packed.is_some() && q.dim(2)? != k.dim(2)?) {
        return Ok(None);
    }
    let spans = packed.map(|p| p.token_spans(q.device())).transpose()?;
    let (context, lse) =
        crate::cuda::flash::forward(&flash_query(q, rule)?, k, v, rule.window, spans.as_ref())?;
    Ok(Some((context.clone(), AttentionSaved { kernel: Some(KernelSaved::Flash { context, lse }) })))
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

/// Packed rows' spans as cuDNN's ragged columns for these q and k widths.
#[cfg(feature = "cuda")]
fn ragged_columns(
    p: &PackedRows,
    q: &Tensor,
    k: &Tensor,
) -> Result<std::sync::Arc<crate::model::packing::RaggedColumns>> {
    let d = q.dim(D::Minus1)?;
    p.ragged(q.dim(1)? * d, k.dim(1)? * d, q.device())
}

#[cfg(feature = "cuda")]
fn cudnn_ragged(c: &crate::model::packing::RaggedColumns) -> crate::cuda::cudnn_sdpa::Ragged<'_> {
    crate::cuda::cudnn_sdpa::Ragged {
        sequences: c.sequences,
        longest: c.longest,
        q_offsets: &c.q_offsets,
        kv_offsets: &c.kv_offsets,
        seq_lens: &c.seq_lens,
    }
}

/// The fused kernels' backward for a forward they ran; `None` where cuDNN refuses the backward
/// graph and the flash kernels do not take the call (the composed path recomputes instead).
#[cfg(feature = "cuda")]
fn kernel_backward(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (rule, packed): (&ScoreRule, Option<&PackedRows>),
    kernel: &KernelSaved,
    d_context: &Tensor,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    // packed rows' spans, made (once per batch) only where the flash kernels run
    let spans = || packed.map(|p| p.token_spans(q.device())).transpose();
    let flash = |context: &Tensor, lse: &Tensor| -> Result<(Tensor, Tensor, Tensor)> {
        let spans = spans()?;
        let (dq, dk, dv) = crate::cuda::flash::backward(
            &flash_query(q, rule)?,
            k,
            v,
            context,
            lse,
            d_context,
            (rule.window, spans.as_ref()),
            None,
        )?;
        let factor = rule.query_factor(q.dim(D::Minus1)?);
        let dq = if (factor - 1.0).abs() < 1e-12 { dq } else { (dq * factor)? };
        Ok((dq, dk, dv))
    };
    match kernel {
        KernelSaved::Cpu { .. } => Ok(None),
        KernelSaved::Flash { context, lse } => flash(context, lse).map(Some),
        KernelSaved::Cudnn { context, stats } => {
            let columns = packed.map(|p| ragged_columns(p, q, k)).transpose()?;
            let ragged = columns.as_deref().map(cudnn_ragged);
            let rule_c = cudnn_rule(rule);
            let cudnn = crate::cuda::cudnn_sdpa::backward(
                (q, k, v),
                (context, stats),
                d_context,
                &rule_c,
                ragged.as_ref(),
            )?;
            match cudnn {
                Some(grads) => Ok(Some(grads)),
                None if !flash_takes(q, rule) => Ok(None),
                // cuDNN refused the backward graph of packed rows: its statistic is laid out per
                // span, so the flash forward recomputes context and lse for the flash backward
                // (one forward more, far less than the composed path with its [b, 1, t, t] mask)
                None if packed.is_some() => {
                    let (context, lse) = crate::cuda::flash::forward(
                        &flash_query(q, rule)?,
                        k,
                        v,
                        rule.window,
                        spans()?.as_ref(),
                    )?;
                    flash(&context, &lse).map(Some)
                }
                // cuDNN refused the backward graph: the flash kernel takes the statistic in log2
                // units
                None => flash(context, &(stats * std::f64::consts::LOG2_E)?).map(Some),
            }
        }
    }
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
        if let Some(out) = kernel_forward(q, k, v, rule, packed)? {
            return Ok(out);
        }
    }
    if cpu_takes(q.device(), q.dtype(), rule) {
        // masked by position and span as the CUDA kernels are: `mask` says the same
        let (context, lse) = super::cpu::attention::forward(q, k, v, cpu_visible(packed, rule), rule.scale)?;
        return Ok((context, AttentionSaved { kernel: Some(KernelSaved::Cpu { lse }) }));
    }
    composed_forward(q, k, v, (mask, packed), rule)
}

/// The composed forward (the reference of the fused paths): chunked scores with the mask.
pub(crate) fn composed_forward(
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
        if let Some(grads) = kernel_backward((q, k, v), (rule, packed), kernel, d_context)? {
            return Ok(grads);
        }
    }
    if let Some(KernelSaved::Cpu { lse }) = &saved.kernel {
        let visible = cpu_visible(packed, rule);
        return super::cpu::attention::backward((q, k, v), visible, rule.scale, lse, d_context);
    }
    composed_backward((q, k, v), (mask, packed), rule, d_context)
}

/// The composed backward (the reference of the fused paths), recomputing the probabilities.
pub(crate) fn composed_backward(
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

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
