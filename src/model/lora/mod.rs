//! LoRA: every projection is a frozen base weight (dense or NF4) plus an optional trained
//! low-rank update (`linear.rs`); the update's weights, cast for the compute dtype in one go
//! (`adapter.rs`); the projections that read one input share one LoRA GEMM (`group.rs`); a decode
//! step's projections as one NF4 GEMV launch with their LoRA terms (`decode.rs`); dropout
//! on the LoRA input (`dropout.rs`); PEFT's names (`spec.rs`).

pub mod adapter;
pub mod decode;
pub mod dropout;
pub mod group;
pub mod linear;
pub mod spec;

pub use adapter::LoraAdapter;
pub use linear::{BaseWeight, DropoutSeed, LoraGrad, LoraLinear};
pub use spec::{module_path, LoraSpec, PROJECTIONS};
