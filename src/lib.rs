//! lora-ft: QLoRA fine-tuning of Llama/Mistral decoders on candle.
//!
//! Data flow: `config` → `hub`/`gguf` (model source) → `model` (decoder with LoRA, checkpointed
//! explicit backward) ← `data` (chat-templated, masked batches) → `train` (loop, `optim`) →
//! `peft_adapter` (the adapter as PEFT writes it) → `merge` (merged model, GGUF file), `generate`
//! (chat).
//!
//! `fixtures`, `testing` and `model::reference` (the tests' demo model, tolerance rule and
//! autograd oracle) are compiled for tests only: `cargo test` turns on the `testing` feature
//! through the crate's dev-dependency on itself.

pub mod arch;
pub mod bench;
pub mod cache;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod distributed;
pub mod durable;
pub mod eval;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
pub mod generate;
pub mod gguf;
pub mod hub;
pub mod memory;
pub mod merge;
pub mod model;
pub mod optim;
pub mod peft_adapter;
pub mod plan;
pub mod profile;
pub mod quant;
pub mod serve;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod train;
