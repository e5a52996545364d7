//! What a run trains on, as far as memory goes: the settings the planner predicts a run's memory
//! from.

use super::optimizer_state::OptimizerState;
use crate::model::activations::LayerPlan;
use crate::model::LoraSpec;

/// What a run trains on, as far as memory goes.
#[derive(Debug, Clone)]
pub struct RunShape {
    /// Bytes of the compute dtype (2 for f16/bf16, 4 for f32).
    pub dtype_bytes: usize,
    /// NF4 storage of the projections (`Some(double_quant)`), or dense (`None`).
    pub nf4: Option<bool>,
    /// The adapters: their rank and target modules size them, dropout on keeps each
    /// projection's dropped input for its backward.
    pub lora: LoraSpec,
    /// The optimizer (`optim.name`), whose state lives beside the adapters.
    pub optimizer: OptimizerState,
    /// Embedding table in host memory (an untied model on a GPU, see model/ops/embedding.rs).
    pub embeddings_on_host: bool,
    /// Rows of logits per loss chunk.
    pub loss_chunk_rows: usize,
    /// Gradient accumulation over micro-batches: the f32 gradients live through the next
    /// micro-batch's backward.
    pub accumulates_gradients: bool,
    /// Checkpoints and an untied lm_head wait in host memory (`train.host_offload`).
    pub host_offload: bool,
    /// Attention on the fused kernels wherever one takes a layer (CUDA in f16/bf16: cuDNN's SDPA
    /// up to head_dim 256 with windows and soft caps, else the flash kernels at head_dim 64 or
    /// 128). `false`: the composed path on every layer (f32, or a GPU without cuDNN for Gemma 2's
    /// soft caps), which holds one query chunk's scores (`[batch, heads, 512, seq]`) and their
    /// soft cap's f32 temporaries in the backward.
    pub fused_attention: bool,
    /// The loss on the fused cross-entropy kernel (CUDA, ops/loss.rs `fused_chunk`), Gemma 2's
    /// final-logit cap inside it: a chunk's logits and their gradient and nothing else. `false`:
    /// the composed cap, as the CPU and CUDA builds before the kernel took it run it, with a
    /// capped copy, the f32 tanh and its chain rule's temporaries per logit.
    pub fused_loss: bool,
    /// The gated MLP in row tiles of `MLP_TILE_VALUES` (`train.mlp_tiles`, layer/tiles.rs).
    pub mlp_tiles: bool,
    /// Where the layers' activations wait for the backward (`keep::layer_plan` picks it for a
    /// budget, model/activations/kept.rs): the last `kept` on the device instead of being
    /// recomputed (selective checkpointing), the highest `complete` of those with n1, n2 and the
    /// gated product too; `offloaded` in page-locked host memory (`host_offload` on,
    /// layer_offload.rs), one every `stride` layers from `stride` below the last down, so the
    /// kept layers above each are freed before its backward; and with `host_offload`, an untied
    /// lm_head on the device all the same where `lm_head_resident`. `LayerPlan::NONE`: every
    /// layer checkpointed.
    pub layers: LayerPlan,
    /// Bytes of page-locked host memory the offloaded layers may take (`keep::host_budget`: half
    /// the host's available memory); 0: none offloaded.
    pub host_budget: u64,
}

impl RunShape {
    /// LoRA dropout on: each projection keeps its own dropped input for its backward.
    pub(crate) fn lora_dropout(&self) -> bool {
        self.lora.dropout > 0.0
    }

    /// This run with `plan`'s layers kept, offloaded and spaced, and its lm_head placement.
    pub fn planned(&self, plan: &LayerPlan) -> Self {
        Self { layers: *plan, ..self.clone() }
    }
}
