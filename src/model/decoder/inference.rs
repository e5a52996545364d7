//! The decoder in eval mode: logits for generation (from KV caches, the last position alone, or
//! rows that each continue their own caches) and the loss without gradients. The `_of` forwards
//! run other layers over the model's embeddings, norm and head: copies of its layers that carry
//! another adapter (several adapters served over one base).

use candle_core::{DType, Tensor};

use super::CausalLm;
use crate::model::layer::{DecoderLayer, KvCache};
use crate::model::ops::rms_norm;

impl CausalLm {
    /// Eval-mode logits `[b, t, vocab]` (f32). With `caches`, continues from the cached positions.
    pub fn forward(&self, input_ids: &Tensor, caches: Option<&mut [KvCache]>) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let x = self.eval_layers(&self.layers, input_ids, caches)?;
        let h = rms_norm(&x.reshape((b * t, self.arch.hidden_size))?, &self.norm, self.arch.rms_norm_eps)?;
        let logits = self.lm_head.logits(&h, self.arch.final_logit_softcap)?;
        logits.to_dtype(DType::F32)?.reshape((b, t, self.arch.vocab_size))
    }

    /// `forward`'s logits `[b, vocab]` of each row's last position alone (what generation
    /// samples from): lm_head reads one row of each instead of all t.
    pub fn forward_last(
        &self,
        input_ids: &Tensor,
        caches: Option<&mut [KvCache]>,
    ) -> candle_core::Result<Tensor> {
        self.forward_last_of(&self.layers, input_ids, caches)
    }

    /// `forward_last` through `layers` (the model's, or copies of them with another adapter).
    pub fn forward_last_of(
        &self,
        layers: &[DecoderLayer],
        input_ids: &Tensor,
        caches: Option<&mut [KvCache]>,
    ) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let x = self.eval_layers(layers, input_ids, caches)?.narrow(1, t - 1, 1)?;
        let h = rms_norm(&x.reshape((b, self.arch.hidden_size))?, &self.norm, self.arch.rms_norm_eps)?;
        self.lm_head.logits(&h, self.arch.final_logit_softcap)?.to_dtype(DType::F32)
    }

    /// `forward_last` of rows that each continue their own caches (`caches[l][r]`: layer l, row
    /// r; of any lengths), one new token each (`input_ids` `[b, 1]`): prompts generated together,
    /// each weight read once for all of them.
    pub fn forward_last_rows(
        &self,
        input_ids: &Tensor,
        caches: &mut [Vec<KvCache>],
    ) -> candle_core::Result<Tensor> {
        self.forward_last_rows_of(&self.layers, input_ids, caches)
    }

    /// `forward_last_rows` through `layers` (the model's, or copies of them with another adapter).
    pub fn forward_last_rows_of(
        &self,
        layers: &[DecoderLayer],
        input_ids: &Tensor,
        caches: &mut [Vec<KvCache>],
    ) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        if t != 1 || caches.len() != layers.len() || layers.len() != self.layers.len() {
            candle_core::bail!("forward_last_rows takes one token a row and a cache a layer");
        }
        let no_masks = vec![None; layers.len()];
        let mut x = self.embed(input_ids)?;
        for (l, layer) in layers.iter().enumerate() {
            x = layer.forward_rows(&x, &self.layer_input((&no_masks, None), 0, None, l), &mut caches[l])?;
        }
        let h = rms_norm(&x.reshape((b, self.arch.hidden_size))?, &self.norm, self.arch.rms_norm_eps)?;
        self.lm_head.logits(&h, self.arch.final_logit_softcap)?.to_dtype(DType::F32)
    }

    /// The decoder layers' output `[b, t, hidden]` in eval mode, from the cached positions on.
    fn eval_layers(
        &self,
        layers: &[DecoderLayer],
        input_ids: &Tensor,
        mut caches: Option<&mut [KvCache]>,
    ) -> candle_core::Result<Tensor> {
        let t = input_ids.dim(1)?;
        let offset = caches.as_ref().map_or(0, |c| c[0].len());
        let masks = self.attention_masks(t, offset, None)?;
        let mut x = self.embed(input_ids)?;
        if layers.len() != self.layers.len() {
            candle_core::bail!("{} layers for a model of {}", layers.len(), self.layers.len());
        }
        for (l, layer) in layers.iter().enumerate() {
            let cache = caches.as_mut().map(|c| &mut c[l]);
            x = layer.forward(&x, &self.layer_input((&masks, None), offset, None, l), cache)?;
        }
        Ok(x)
    }
}
