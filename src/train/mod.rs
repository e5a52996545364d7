//! Training, in the order a run goes through it:
//!
//! - `setup.rs`: the run's setup: the device, the model with fresh adapters, the data, the batch
//!   size (fixed, or probed by `auto_batch.rs`), and the checkpoint it resumes from.
//! - `step.rs`: one optimizer step: micro-batches (each rank's shard), forward/backward,
//!   accumulation, the all-reduce, the loss scaler (`loss_scale.rs`), clipping, Adafactor.
//! - `run_loop.rs`: the loop over steps: evaluation, metrics (`metrics.rs`, `plot.rs`, and
//!   `tensorboard/` with `train.report_to = ["tensorboard"]`),
//!   checkpoints (`checkpoint.rs`), a stop on Ctrl-C, the final adapter; `trace.rs` records a run
//!   for replaying it in another stack; `samples.rs` has the model answer `data.eval_prompts`
//!   at the start, at each evaluation and at the end.
//!
//! This file: `lora-ft train` in one process (`run`) or as one rank of several (`run_rank`).

pub mod auto_batch;
pub mod checkpoint;
mod injected_oom;
pub mod loss_scale;
pub mod metrics;
mod outcome;
pub mod plot;
pub mod records;
mod recovery;
mod run_loop;
pub mod samples;
mod setup;
mod step;
pub mod tensorboard;
#[cfg(test)]
mod tests;
pub mod trace;

use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, TrainSection};
use crate::distributed::{Solo, WorldInfo};
use crate::durable;

pub use crate::memory::{is_out_of_memory, Phase};
pub use outcome::{resume_point, Stopped, TrainSummary};
pub use run_loop::{evaluate, oom_report};
pub use setup::{compute_dtype, parse_device, select_device, set_training_policy};
pub use step::{batch_tensor, rank_batch, target_tokens, BatchStream, StepResult, Trainer};

/// This rank stopping because another rank failed: the failure, whatever the rank was doing.
pub fn peer_failure(e: &anyhow::Error) -> Option<&crate::distributed::DistributedError> {
    use crate::distributed::DistributedError;
    e.chain()
        .filter_map(|c| c.downcast_ref::<DistributedError>())
        .find(|d| matches!(d, DistributedError::PeerFailed(_)))
}

pub fn is_peer_failure(e: &anyhow::Error) -> bool {
    peer_failure(e).is_some()
}

/// `lora-ft train CONFIG [--trace DIR]` in one process. A write that runs out of space ends the
/// run with one message: the file, where to free space, and the checkpoint that is intact.
pub fn run(cfg: &Config, trace_dir: Option<&Path>) -> anyhow::Result<TrainSummary> {
    with_disk_full_message(cfg, || {
        setup::train(cfg, trace_dir, parse_device(&cfg.train.device)?, Arc::new(Solo))
    })
}

/// `lora-ft train CONFIG` as one rank of a data-parallel run (`world` from the launcher's
/// variables): joins the other ranks, trains its shard of every batch, and at the end says
/// goodbye, or tells the others why it failed so they stop too.
pub fn run_rank(cfg: &Config, trace_dir: Option<&Path>, world: &WorldInfo) -> anyhow::Result<TrainSummary> {
    let device_spec = rank_device(&cfg.train.device, world)?; // "cpu" or "cuda:LOCAL_RANK"
    let cfg = Config { train: TrainSection { device: device_spec, ..cfg.train.clone() }, ..cfg.clone() };
    let member =
        crate::distributed::join(world, device_spec_is_gpu(&cfg.train.device), agreed_config(&cfg)?)?;
    // one device handle for training and the collective: NCCL runs on the stream training uses
    let device = parse_device(&cfg.train.device).inspect_err(|e| member.fail(e))?;
    let collective = member.collective(&device)?;
    let result =
        with_disk_full_message(&cfg, || setup::train(&cfg, trace_dir, device, Arc::clone(&collective)));
    match result {
        Ok(summary) => collective.finish().map(|()| summary),
        Err(e) if e.downcast_ref::<Stopped>().is_some() => {
            let _ = collective.finish();
            Err(e)
        }
        Err(e) if is_peer_failure(&e) => Err(e),
        Err(e) => {
            collective.abort(&format!("failed: {e:#}"));
            Err(e)
        }
    }
}

fn with_disk_full_message(
    cfg: &Config,
    train: impl FnOnce() -> anyhow::Result<TrainSummary>,
) -> anyhow::Result<TrainSummary> {
    train().map_err(|e| match durable::disk_full_message(&e) {
        Some(text) => anyhow::anyhow!("{text}; {}", resume_point(cfg)),
        None => e,
    })
}

/// The device of a rank for `train.device`: GPU LOCAL_RANK for "cuda" (and "auto" in a CUDA
/// build), the CPU for "cpu".
fn rank_device(spec: &str, world: &WorldInfo) -> anyhow::Result<String> {
    match spec {
        "cpu" => Ok("cpu".into()),
        "auto" if !candle_core::utils::cuda_is_available() => Ok("cpu".into()),
        "auto" | "cuda" => Ok(format!("cuda:{}", world.local_rank)),
        _ => anyhow::bail!(
            "train.device = {spec:?} names one GPU, but this is rank {} of {}: each rank trains on \
             cuda:LOCAL_RANK; set device = \"cuda\" (or \"cpu\")",
            world.rank,
            world.world_size
        ),
    }
}

fn device_spec_is_gpu(spec: &str) -> bool {
    spec.starts_with("cuda")
}

/// What every rank must agree on: the config, less the device (each rank has its own).
fn agreed_config(cfg: &Config) -> anyhow::Result<serde_json::Value> {
    let mut value = serde_json::to_value(cfg)?;
    if let Some(train) = value.get_mut("train").and_then(|t| t.as_object_mut()) {
        train.remove("device");
    }
    Ok(value)
}
