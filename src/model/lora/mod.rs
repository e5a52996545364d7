//! LoRA: every projection is a frozen base weight (dense or NF4) plus an optional trained
//! low-rank update (`linear.rs`); the projections that read one input share one LoRA GEMM
//! (`group.rs`), with their weights cast for the compute dtype in one go (`weights.rs`); dropout on the LoRA input (`dropout.rs`); PEFT's names (`spec.rs`).

pub mod dropout;
pub mod group;
pub mod linear;
pub mod spec;
pub mod weights;

pub use linear::{BaseWeight, DropoutSeed, LoraAdapter, LoraGrad, LoraLinear};
pub use spec::{module_path, LoraSpec, PROJECTIONS};
