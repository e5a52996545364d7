//! The activations a layer's backward reads, listed for where they wait: a layer kept in host
//! memory (model/activations/layer_offload.rs) copies each out after its forward and puts it
//! back, in the same order, before its backward.

use candle_core::Tensor;

use super::LayerSaved;
use crate::model::activations::layer_offload::SavedActivations;

impl SavedActivations for LayerSaved {
    /// Every activation tensor the backward reads, in a fixed order; not the LoRA weights'
    /// compute-dtype copies, which are small and not activations.
    fn activations_mut(&mut self) -> Vec<&mut Tensor> {
        let mut out: Vec<&mut Tensor> = Vec::new();
        let a = &mut self.attn;
        out.push(&mut a.x);
        out.extend(a.n1.as_mut());
        out.extend(a.q_raw.as_mut());
        out.extend(a.k_raw.as_mut());
        out.extend([&mut a.q, &mut a.k, &mut a.v, &mut a.context]);
        out.extend(a.attention.tensors_mut());
        out.extend(a.qkv.as_mut().map(|g| g.activation_mut()));
        out.extend(a.o.as_mut().map(|g| g.activation_mut()));
        out.extend(a.o_out.as_mut());
        let m = &mut self.mlp;
        out.push(&mut m.h1);
        out.extend(m.n2.as_mut());
        if let Some(inner) = m.inner.as_mut() {
            out.extend([&mut inner.gate, &mut inner.up]);
            out.extend(inner.act.as_mut());
            out.extend(inner.gate_up.as_mut().map(|g| g.activation_mut()));
            out.extend(inner.down.as_mut().map(|g| g.activation_mut()));
            out.extend(inner.down_out.as_mut());
        }
        out
    }
}
