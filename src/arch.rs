//! What a decoder model is, below every room that reads one (the model, the GGUF import and
//! export, the planner): its config.json as written (`config.rs`), the typed description the
//! layers branch on (`description.rs`), and one declaration per family (`family.rs`'s type, each
//! family a file of `families/`) that says everything lora-ft knows of it, from how its config
//! maps onto the description to its GGUF conventions and training defaults. `read.rs` reads a
//! config.json against the declarations; `gguf_header.rs` is what the GGUF import rules read.

pub mod config;
pub mod description;
pub mod families;
pub mod family;
pub mod gguf_header;
mod read;

pub use config::ModelConfig;
pub use description::{Activation, Architecture, RopeScaling, RopeSpec};
pub use families::FAMILIES;
pub use family::Family;
