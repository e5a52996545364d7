//! The decoder with LoRA adapters and a hand-written, checkpointed backward. candle's autograd
//! keeps every intermediate of the step, so it serves only as the test oracle. The rooms, from
//! the bottom floor up (each imports only the floors below it):
//!
//! - `activations/`: where a step's activations wait: the per-layer checkpoints, on the device or
//!   offloaded to page-locked host memory on a copy stream.
//! - `ops/`: each op's forward and backward side by side: norm, rope, mlp (SwiGLU), attention,
//!   embedding, the sums of GEMMs (`product_sum`), and lm_head with the chunked loss.
//! - `lora/`: the projections (frozen base + trained `lora_a`/`lora_b`), their groups, dropout,
//!   and PEFT's names.
//! - `layer.rs`: one decoder layer (attention half, MLP half), forward, recompute, backward.
//! - `decoder.rs`: the causal LM: embeddings → layers → norm → lm_head, checkpointed.
//!
//! What a model is (its config.json, the typed `Architecture` the layers branch on, never on a
//! model's name, and the family declarations) is the room below, `crate::arch`; the CUDA kernels
//! these rooms call live one floor below all of them, in `crate::cuda`.

pub mod activations;
pub mod decoder;
pub mod layer;
pub mod lora;
pub mod ops;
pub mod packing;
/// The autograd test oracle (also used by `benches/layer_backward.rs`).
#[cfg(any(test, feature = "testing"))]
pub mod reference;

pub use decoder::{add_lora_to, lora_params_of, CausalLm, TrainOutput, TrainingPolicy};
pub use layer::DecoderLayer;
pub use layer::{DecodeRows, KvCache, SlotCache};
pub use lora::{module_path, LoraSpec, PROJECTIONS};
