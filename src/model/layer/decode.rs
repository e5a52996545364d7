//! A decode step of the layer on CUDA with an NF4 base and at most 8 rows: `run`'s
//! `Cache::Slots` pass with each group of projections that reads one input (q/k/v, o, gate/up,
//! down) as one `lora::decode` group (its adapters' first product, then one NF4 GEMV launch
//! adding their LoRA terms, the biases and the residual stream).

use candle_core::{Result, Tensor};

use super::{DecodeRows, DecoderLayer, LayerInput, Pass, SlotCache, DOWN, GATE, K, O, Q, UP, V};
use crate::model::lora::decode::{applies, project_group};
use crate::model::lora::linear::LoraLinear;
use crate::model::ops::{gated, rms_norm};

impl DecoderLayer {
    /// `forward_slots` through the fused projections, or `None` where they do not apply (the
    /// CPU, more than 8 rows, a dense base, dropout on): then `run` takes the step.
    pub(super) fn forward_slots_fused(
        &self,
        x: &Tensor,
        input: &LayerInput,
        cache: &SlotCache,
        rows: &DecodeRows,
    ) -> Result<Option<Tensor>> {
        let (b, t, hidden) = x.dims3()?;
        let x2 = x.reshape((b * t, hidden))?;
        let members = |ps: &[usize]| ps.iter().map(|&p| &self.proj[p]).collect::<Vec<&LoraLinear>>();
        let (qkv, o, gate_up, down) =
            (members(&[Q, K, V]), members(&[O]), members(&[GATE, UP]), members(&[DOWN]));
        // each group's input is a fresh contiguous tensor of x's rows and dtype
        let fits = |g: &[&LoraLinear]| applies(g, b, x.dtype(), x.device());
        if t != 1 || input.dropout_seed.is_some() || ![&qkv, &o, &gate_up, &down].iter().all(|g| fits(g)) {
            return Ok(None);
        }
        let eps = self.rms_norm_eps;
        let n1 = rms_norm(&x2, &self.input_layernorm, eps)?;
        let [q, k, v]: [Tensor; 3] = project_group(&qkv, &n1, None)?
            .try_into()
            .map_err(|_| candle_core::Error::Msg("q, k and v from one launch".into()))?;
        let (q, _) = self.head_norm(q, self.q_norm.as_ref(), Pass::Forward)?;
        let (k, _) = self.head_norm(k, self.k_norm.as_ref(), Pass::Forward)?;
        let rule = &input.scores;
        let q = self.heads(&q, (b, 1, self.n_heads), rule)?;
        let k = self.heads(&k, (b, 1, self.n_kv_heads), rule)?;
        let v = self.heads(&v, (b, 1, self.n_kv_heads), rule)?;
        let context = self.attention_of_slots((&q, &k, &v), input, cache, rows)?;
        let context = context.transpose(1, 2)?.reshape((b, self.n_heads * self.head_dim))?.contiguous()?;
        let h1 = self.sublayer_fused(&x2, &o, &context, self.attn_out_norm.as_ref())?;
        let n2 = rms_norm(&h1, &self.post_attention_layernorm, eps)?;
        let [gate, up]: [Tensor; 2] = project_group(&gate_up, &n2, None)?
            .try_into()
            .map_err(|_| candle_core::Error::Msg("gate and up from one launch".into()))?;
        let act = gated(&gate, &up, self.activation)?;
        let out = self.sublayer_fused(&h1, &down, &act, self.mlp_out_norm.as_ref())?;
        Ok(Some(out.reshape((b, t, hidden))?))
    }

    /// residual + proj(x), the sum in the GEMV; residual + norm(proj(x)) with an output norm.
    fn sublayer_fused(
        &self,
        residual: &Tensor,
        proj: &[&LoraLinear],
        x: &Tensor,
        out_norm: Option<&Tensor>,
    ) -> Result<Tensor> {
        match out_norm {
            None => Ok(project_group(proj, x, Some(residual))?.remove(0)),
            Some(w) => residual + rms_norm(&project_group(proj, x, None)?.remove(0), w, self.rms_norm_eps)?,
        }
    }
}
