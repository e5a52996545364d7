//! What a model is: its config.json as written (`config.rs`), and the one typed description of
//! its architecture that the layers branch on, with the family declarations that map the one onto
//! the other (`family.rs`). Adding a family: an entry in `FAMILIES`, its config mapping, its tests.

pub mod config;
pub mod family;

pub use config::ModelConfig;
pub use family::{Activation, Architecture, Family, RopeScaling, RopeSpec, FAMILIES};
