//! How a model's training steps run: which layers keep their activations, the gated MLP's row
//! tiles, and whether checkpoints wait in host memory. The run's setup hands the model one
//! policy, resolved with the run (`CausalLm::set_training_policy`); the steps read it.

use candle_core::Device;

use super::super::activations::KeptLayers;
use super::super::layer::tiles::MLP_TILE_VALUES;

/// What a training step of the model keeps and where: the policy of the run, set as a whole.
#[derive(Debug, Clone)]
pub struct TrainingPolicy {
    /// The last layers whose activations stay from the forward to the backward at a step's
    /// shape (selective checkpointing); the others are recomputed.
    pub kept_layers: KeptLayers,
    /// Values of one row tile of the gated MLP (layer/tiles.rs): `MLP_TILE_VALUES` with
    /// `train.mlp_tiles`, `usize::MAX` for all rows at once.
    pub mlp_tile_values: usize,
    /// Checkpoints and offloaded layers wait in page-locked host memory during the step (CUDA;
    /// checkpoints.rs); ignored off CUDA.
    pub offload_checkpoints: bool,
}

impl TrainingPolicy {
    /// A freshly loaded model's: every layer recomputed, the MLP in tiles, checkpoints in host
    /// memory on a GPU.
    pub fn loaded_on(device: &Device) -> Self {
        Self {
            kept_layers: KeptLayers::none(),
            mlp_tile_values: MLP_TILE_VALUES,
            offload_checkpoints: device.is_cuda(),
        }
    }
}
