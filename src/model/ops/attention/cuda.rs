//! The attention op's CUDA paths: cuDNN's fused attention (soft caps, windows and packed rows'
//! ragged columns included) and, where cuDNN refuses, our flash kernels; `None` hands the call
//! back to the composed path (composed.rs) or the CPU's.

use candle_core::{DType, Result, Tensor, D};

use super::rule::ScoreRule;
use super::saved::{AttentionSaved, KernelSaved};
use crate::model::packing::PackedRows;

/// The rule as cuDNN takes it (scale, cap and window are its graph's own).
fn cudnn_rule(rule: &ScoreRule) -> crate::cuda::cudnn_sdpa::Rule {
    crate::cuda::cudnn_sdpa::Rule { scale: rule.scale, softcap: rule.softcap, window: rule.window }
}

/// q as the flash kernels take it: times `query_factor` where the rule's scale is not theirs.
fn flash_query(q: &Tensor, rule: &ScoreRule) -> Result<Tensor> {
    let factor = rule.query_factor(q.dim(D::Minus1)?);
    if (factor - 1.0).abs() < 1e-12 {
        return Ok(q.clone());
    }
    q * factor
}

/// Whether our flash kernels take the call: head_dim 64 or 128, no soft cap.
fn flash_takes(q: &Tensor, rule: &ScoreRule) -> bool {
    rule.softcap.is_none() && crate::cuda::flash::supported(q)
}

/// The fused kernels' forward where one takes the call: cuDNN (head_dim up to 256, soft caps
/// and windows included), else our flash kernels (64, 128, no cap; packed rows through their
/// spans); `None` for the composed path (f32, other head dims, or a soft cap cuDNN refused).
pub(super) fn kernel_forward(
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

/// Packed rows' spans as cuDNN's ragged columns for these q and k widths.
fn ragged_columns(
    p: &PackedRows,
    q: &Tensor,
    k: &Tensor,
) -> Result<std::sync::Arc<crate::model::packing::RaggedColumns>> {
    let d = q.dim(D::Minus1)?;
    p.ragged(q.dim(1)? * d, k.dim(1)? * d, q.device())
}

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
pub(super) fn kernel_backward(
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
