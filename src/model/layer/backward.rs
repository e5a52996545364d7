//! A decoder layer's backward (mod.rs holds its forward): d(out) through the MLP half, then the
//! attention half, to d(x) and the LoRA gradients, each activation dropped after its last reader.

use candle_core::{Result, Tensor};

use super::projections::{backward_shared_input, group_backward_before_x};
use super::{
    seed, AttnSaved, DecoderLayer, LayerInput, LayerSaved, MlpInner, MlpSaved, DOWN, GATE, K, O, Q, UP, V,
};
use crate::model::lora::group::LoraGroup;
use crate::model::lora::linear::LoraGrad;
use crate::model::ops::attention::attention_backward_packed;
use crate::model::ops::mlp::gated_backward_with_act;
use crate::model::ops::{gated, gated_backward, rms_norm, rms_norm_backward_add};
use crate::profile::section;

impl DecoderLayer {
    /// The input gradient of projections that read the same input, summed in one buffer, and
    /// their LoRA gradients into `grads`.
    fn backward_shared_input(
        &self,
        x: &Tensor,
        dys: &[(usize, &Tensor)],
        input: &LayerInput,
        group: Option<&LoraGroup>,
        grads: &mut [Option<LoraGrad>; 7],
    ) -> Result<Tensor> {
        let uses: Vec<_> = dys.iter().map(|&(p, dy)| (&self.proj[p], seed(input, p), dy)).collect();
        let (dx, own) = backward_shared_input(x, &uses, group)?;
        for (&(p, _), grad) in dys.iter().zip(own) {
            grads[p] = grad;
        }
        Ok(dx)
    }

    /// Given d(out) `[b, t, hidden]`, returns d(x) and the LoRA gradients in `PROJECTIONS` order
    /// (`None` for projections without an adapter). Only the input gradient and the adapters'
    /// gradients are computed; the frozen weights get none. The working set sits on top of every
    /// checkpoint at the backward's peak, so each activation is dropped after its last reader.
    pub fn backward(
        &self,
        saved: LayerSaved,
        d_out: &Tensor,
        input: &LayerInput,
    ) -> Result<(Tensor, [Option<LoraGrad>; 7])> {
        let (b, t, hidden) = d_out.dims3()?;
        let mut grads: [Option<LoraGrad>; 7] = Default::default();
        let d_h1 = self.mlp_backward(saved.mlp, d_out.reshape((b * t, hidden))?, input, &mut grads)?;
        let dx = self.attention_half_backward(saved.attn, d_h1, (b, t), input, &mut grads)?;
        Ok((dx.reshape((b, t, hidden))?, grads))
    }

    /// d(h1) given d(out) `[n, hidden]`.
    fn mlp_backward(
        &self,
        saved: MlpSaved,
        d_out: Tensor,
        input: &LayerInput,
        grads: &mut [Option<LoraGrad>; 7],
    ) -> Result<Tensor> {
        let MlpSaved { h1, n2, inner } = saved;
        let Some(MlpInner { gate, up, act, gate_up, down, down_out }) = inner else {
            let n2 = n2.ok_or_else(|| candle_core::Error::Msg("the tiled MLP keeps n2".into()))?;
            return self.mlp_backward_tiled(&h1, &n2, &d_out, input, grads);
        };
        let d_down = self.out_norm_backward(down_out.as_ref(), self.mlp_out_norm.as_ref(), &d_out)?;
        drop(down_out);
        let (d_gate, d_up) = match (act, down) {
            // a not kept (a lean layer): down's input gradient needs no a, and the gated backward
            // writes a over it for down's A gradient, instead of a pass of its own over gate and up
            (None, Some(down)) => {
                let (d_act, pending) =
                    group_backward_before_x(&[(&self.proj[DOWN], seed(input, DOWN), &d_down)], &down)?;
                drop((down, d_down));
                let (d_gate, d_up, act) = gated_backward_with_act(&gate, &up, d_act, self.activation)?;
                drop((gate, up));
                grads[DOWN] = pending.finish(&act)?.pop();
                (d_gate, d_up)
            }
            (act, down) => {
                let act = match act {
                    Some(act) => act,
                    None => gated(&gate, &up, self.activation)?,
                };
                let d_act =
                    self.backward_shared_input(&act, &[(DOWN, &d_down)], input, down.as_ref(), grads)?;
                drop((act, down, d_down));
                let grads = gated_backward(&gate, &up, &d_act, self.activation)?;
                drop((gate, up, d_act));
                grads
            }
        };
        let n2 = match n2 {
            Some(n2) => n2,
            None => rms_norm(&h1, &self.post_attention_layernorm, self.rms_norm_eps)?,
        };
        let dn2 =
            self.backward_shared_input(&n2, &[(GATE, &d_gate), (UP, &d_up)], input, gate_up.as_ref(), grads)?;
        drop((n2, d_gate, d_up, gate_up));
        rms_norm_backward_add(&h1, &self.post_attention_layernorm, self.rms_norm_eps, &dn2, &d_out)
    }

    /// d(x) given d(h1) `[n, hidden]`.
    fn attention_half_backward(
        &self,
        saved: AttnSaved,
        d_h1: Tensor,
        (b, t): (usize, usize),
        input: &LayerInput,
        grads: &mut [Option<LoraGrad>; 7],
    ) -> Result<Tensor> {
        let AttnSaved { x, n1, q_raw, k_raw, q, k, v, context, attention, qkv, o, o_out } = saved;
        let d_o = self.out_norm_backward(o_out.as_ref(), self.attn_out_norm.as_ref(), &d_h1)?;
        drop(o_out);
        let d_context = self.backward_shared_input(&context, &[(O, &d_o)], input, o.as_ref(), grads)?;
        drop((context, o, d_o));
        // a [b, h, t, d] view: the kernels read it strided, the composed path copies per chunk
        let d_context = d_context.reshape((b, t, self.n_heads, self.head_dim))?.transpose(1, 2)?;
        let (dq, dk, dv) = section("attention.backward", d_context.device(), || {
            let visible = (input.mask, input.packed);
            attention_backward_packed((&q, &k, &v), visible, &input.scores, &attention, &d_context)
        })?;
        drop((q, k, v, attention, d_context));
        let flat = |x: Tensor, n: usize| x.transpose(1, 2)?.reshape((b * t, n * self.head_dim));
        let dq = flat(input.rope_backward(&dq)?, self.n_heads)?;
        let dq = self.head_norm_backward(q_raw, self.q_norm.as_ref(), dq)?;
        let dk = flat(input.rope_backward(&dk)?, self.n_kv_heads)?;
        let dk = self.head_norm_backward(k_raw, self.k_norm.as_ref(), dk)?;
        let dv = flat(dv, self.n_kv_heads)?;
        let n1 = match n1 {
            Some(n1) => n1,
            None => rms_norm(&x, &self.input_layernorm, self.rms_norm_eps)?,
        };
        let dn1 =
            self.backward_shared_input(&n1, &[(Q, &dq), (K, &dk), (V, &dv)], input, qkv.as_ref(), grads)?;
        drop((n1, dq, dk, dv, qkv));
        rms_norm_backward_add(&x, &self.input_layernorm, self.rms_norm_eps, &dn1, &d_h1)
    }
}
