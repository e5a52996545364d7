//! Where a training step's activations wait between the forward and the backward: each decoder
//! layer's input (the checkpoint), on the device or in page-locked host memory, copied on a
//! second stream (`offload.rs`) while the layers compute; or, for the layers the planner keeps
//! (`kept.rs`), everything their backward reads.

pub mod checkpoints;
pub mod kept;
pub mod layer_offload;
#[cfg(feature = "cuda")]
pub mod offload;
pub mod views;

pub use checkpoints::Checkpoints;
pub use kept::{KeptLayers, LayerKind, LayerPlan};
