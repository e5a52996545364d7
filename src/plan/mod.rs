//! The memory planner behind `lora-ft estimate`: a training run's peak GPU memory predicted from
//! the model's config.json and the run's settings, before anything is loaded.
//!
//! The model follows what the trainer keeps (src/model/decoder/, layer.rs): the frozen model
//! and the adapters with their optimizer state stay for the whole run; the forward keeps one
//! f16 input per layer (the checkpoints); the backward's peak is the first layer it reaches —
//! every checkpoint still alive, that layer's recomputed activations, and the three
//! intermediate-size gradients of the gated MLP's backward, or the composed attention's query
//! chunk where a layer runs it — and the loss before it holds one chunk of logits and their
//! gradient (`activations.rs` counts both). Peak = the frozen parts + the larger of those two
//! moments. Checked against the peaks measured on the H100 (benches/train_*.md,
//! benches/issue18/) in this folder's tests. `shape.rs` holds what a run is, `estimate.rs` the
//! prediction, `fits.rs` what fits a budget, `keep.rs` the layers kept whole, `report.rs` the
//! printed plan. `serving.rs` sizes serving: the decoding engine's weights, transients and KV
//! cache, and how many sequences of a length fit.
//!
//! `run.rs` puts a training run together once — the config, the model's config.json and the
//! memory budget — into the `Run` that training, `estimate`, `init` and `bench` read.

mod activations;
mod estimate;
mod fits;
pub mod init;
mod keep;
mod optimizer_state;
mod report;
pub mod run;
pub mod serving;
mod shape;

pub use estimate::{estimate, Estimate};
pub use fits::{check_fits, largest_batch, longest_rows};
pub use keep::{host_budget, layer_plan};
pub use optimizer_state::OptimizerState;
pub use report::report;
pub use shape::RunShape;

#[cfg(test)]
mod serving_tests;
#[cfg(test)]
mod tests;
