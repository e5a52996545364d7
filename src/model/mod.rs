//! The decoder (Llama / Mistral family) with LoRA adapters and a hand-written, checkpointed
//! backward. candle's autograd serves only as the test oracle (see DESIGN.md).

pub mod attention;
pub mod checkpoints;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cudnn_sdpa;
pub mod decoder;
pub mod dropout;
pub mod embedding;
#[cfg(feature = "cuda")]
mod flash;
#[cfg(feature = "cuda")]
mod fused;
pub mod layer;
pub mod linear;
pub mod lm_head;
pub mod lora_group;
pub mod loss;
#[cfg(feature = "cuda")]
mod loss_cuda;
#[cfg(feature = "cuda")]
pub mod offload;
pub mod ops;
#[cfg(feature = "cuda")]
mod ops_cuda;
pub mod product_sum;
#[cfg(feature = "cuda")]
mod product_sum_cuda;
/// The autograd test oracle (also used by `benches/layer_backward.rs`).
#[doc(hidden)]
pub mod reference;

pub use config::ModelConfig;
pub use decoder::{module_path, CausalLm, LoraSpec, TrainOutput};
pub use layer::{KvCache, PROJECTIONS};
