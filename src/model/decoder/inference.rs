//! The decoder in eval mode: logits for generation (from KV caches, the last position alone, or
//! sequences that each continue their own slot of the engine's cache) and the loss without gradients. The `_of` forwards
//! run other layers over the model's embeddings, norm and head: copies of its layers that carry
//! another adapter (several adapters served over one base).

use candle_core::{DType, Tensor};

use super::CausalLm;
use crate::model::layer::{DecodeRows, DecoderLayer, KvCache, SlotCache};
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

    /// Logits `[b, vocab]` of one new token for each of the sequences in `rows` (`input_ids`
    /// `[b, 1]`), each continuing its own slot of `caches` (one per layer), through `layers` (the
    /// model's, or copies of them with another adapter): sequences decoded together, each weight
    /// read once for all of them.
    pub fn forward_slots_of(
        &self,
        layers: &[DecoderLayer],
        input_ids: &Tensor,
        caches: &[SlotCache],
        rows: &DecodeRows,
    ) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        if t != 1 || caches.len() != layers.len() || layers.len() != self.layers.len() {
            candle_core::bail!("forward_slots_of takes one token a row and a cache a layer");
        }
        let no_masks = vec![None; layers.len()];
        let mut x = self.embed(input_ids)?;
        for (l, layer) in layers.iter().enumerate() {
            x = layer.forward_slots(
                &x,
                &self.layer_input((&no_masks, None), 0, None, l),
                &caches[l],
                rows,
            )?;
        }
        let h = rms_norm(&x.reshape((b, self.arch.hidden_size))?, &self.norm, self.arch.rms_norm_eps)?;
        self.lm_head.logits(&h, self.arch.final_logit_softcap)?.to_dtype(DType::F32)
    }

    /// A KV cache for `slots` sequences of up to `capacity` positions each, in the model's
    /// dtype on its device (`forward_slots_of`'s).
    pub fn slot_caches(&self, slots: usize, capacity: usize) -> candle_core::Result<Vec<SlotCache>> {
        let heads = (self.arch.num_kv_heads, self.arch.head_dim);
        (0..self.layers.len())
            .map(|_| SlotCache::new((slots, capacity), heads, self.dtype, &self.device))
            .collect()
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
