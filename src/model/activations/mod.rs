//! Where a training step's activations wait between the forward and the backward: each decoder
//! layer's input (the checkpoint), on the device or in page-locked host memory, copied on a
//! second stream (`offload.rs`) while the layers compute.

pub mod checkpoints;
#[cfg(feature = "cuda")]
pub mod offload;

pub use checkpoints::Checkpoints;
