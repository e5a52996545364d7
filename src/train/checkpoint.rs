//! Checkpoints: `<run>/checkpoints/step-N/` with the adapter (PEFT layout, so any checkpoint can
//! be exported or loaded by PEFT directly), the optimizer state and the data position. The
//! folder is written under a temporary name, fsynced and renamed, so a crash or a full disk never
//! leaves half of one; `newest_complete` finds where a run resumes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::durable;
use crate::model::{CausalLm, LoraSpec};
use crate::peft_adapter::write_adapter_files;

pub const OPTIMIZER_STATE: &str = "optimizer.safetensors";
pub const TRAINER_STATE: &str = "trainer_state.json";

/// Where the run stands: enough to continue on the same batch with the same schedule.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps taken.
    pub step: usize,
    pub total_steps: usize,
    /// The epoch the next batch comes from, and its index within that epoch (in batches of
    /// `batch_size × world_size` rows; kept for older lora-ft, `rows_in_epoch` is what resume reads).
    pub epoch: u64,
    pub batch_in_epoch: usize,
    pub seed: u64,
    /// The f16 loss scaler (absent in checkpoints of f32/bf16 runs written before it existed).
    #[serde(default)]
    pub loss_scaler: Option<crate::train::loss_scale::LossScaler>,
    /// Rows per micro-batch (absent in checkpoints written before it was recorded): a run with
    /// `batch_size = "auto"` resumes with it rather than probing again, as `batch_in_epoch`
    /// counts batches of this size.
    #[serde(default)]
    pub batch_size: Option<usize>,
    /// Rows of the epoch's order trained so far, by all ranks together (absent in checkpoints
    /// written before several GPUs): a run resumed with another number of ranks, or another
    /// batch size, continues the same order from here.
    #[serde(default)]
    pub rows_in_epoch: Option<usize>,
    /// Ranks of the run that wrote it, and the rows of one optimizer step over all of them
    /// (`batch_size × world_size × grad_accum`).
    #[serde(default)]
    pub world_size: Option<usize>,
    #[serde(default)]
    pub rows_per_step: Option<usize>,
    /// `optim.name` of the run (absent in checkpoints written before AdamW: Adafactor's).
    #[serde(default)]
    pub optimizer: Option<crate::config::OptimName>,
}

impl TrainerState {
    /// Row of the epoch's order where training goes on; a checkpoint of older lora-ft counts
    /// batches of its own batch size (`global_batch` when it did not record one).
    pub fn resume_row(&self, global_batch: usize) -> usize {
        self.rows_in_epoch.unwrap_or(self.batch_in_epoch * self.batch_size.unwrap_or(global_batch))
    }

    /// The optimizer whose state the checkpoint holds.
    pub fn optimizer(&self) -> crate::config::OptimName {
        self.optimizer.unwrap_or_default()
    }
}

pub fn checkpoint_dir(run_dir: &Path, step: usize) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step-{step}"))
}

/// Writes checkpoint `state.step` whole or not at all (`durable::write_dir_atomic`): a failed
/// save (a full disk) leaves no trace and every older checkpoint as it was.
pub fn save(
    run_dir: &Path,
    model: &CausalLm,
    spec: &LoraSpec,
    base_model: &str,
    optimizer_state: Vec<(String, Tensor)>,
    state: &TrainerState,
) -> anyhow::Result<PathBuf> {
    let dir = checkpoint_dir(run_dir, state.step);
    durable::write_dir_atomic(&dir, |tmp| {
        write_adapter_files(model, spec, base_model, tmp)?;
        let opt: HashMap<String, Tensor> = optimizer_state.into_iter().collect();
        durable::write_safetensors(&opt, &tmp.join(OPTIMIZER_STATE))?;
        durable::write(&tmp.join(TRAINER_STATE), serde_json::to_string_pretty(state)?.as_bytes())
    })?;
    Ok(dir)
}

/// Keeps the newest `keep` checkpoints (0 keeps all). Called after a save succeeded, so a
/// failed save never costs an older checkpoint.
pub fn prune(run_dir: &Path, keep: usize) -> anyhow::Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let mut steps: Vec<usize> = list(run_dir)?;
    steps.sort_unstable();
    for step in steps.iter().take(steps.len().saturating_sub(keep)) {
        let dir = checkpoint_dir(run_dir, *step);
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing old checkpoint {}", dir.display()))?;
    }
    Ok(())
}

/// The newest checkpoint whose files are all there and readable, with its state. A partial or
/// corrupt one (a kill during a copy outside lora-ft, a full disk) is skipped with a warning.
pub fn newest_complete(run_dir: &Path) -> anyhow::Result<Option<(PathBuf, TrainerState)>> {
    let mut steps = list(run_dir)?;
    steps.sort_unstable();
    for step in steps.into_iter().rev() {
        let dir = checkpoint_dir(run_dir, step);
        match read_complete(&dir, step) {
            Ok(state) => return Ok(Some((dir, state))),
            Err(e) => tracing::warn!("skipping checkpoint {}: {e:#}", dir.display()),
        }
    }
    Ok(None)
}

fn read_complete(dir: &Path, step: usize) -> anyhow::Result<TrainerState> {
    for name in [crate::peft_adapter::ADAPTER_WEIGHTS, OPTIMIZER_STATE] {
        let file = dir.join(name);
        // the header and every tensor's bounds against the file's length, without reading the
        // data: resume reads it once, after this check
        // SAFETY: a read-only map of a file this process does not write while it is mapped.
        unsafe { candle_core::safetensors::MmapedSafetensors::new(&file) }
            .with_context(|| format!("{}: not safetensors", file.display()))?;
    }
    crate::peft_adapter::read_adapter_config(dir)?;
    let file = dir.join(TRAINER_STATE);
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let state: TrainerState =
        serde_json::from_str(&text).with_context(|| format!("{}: not a trainer state", file.display()))?;
    anyhow::ensure!(
        state.step == step,
        "{} says step {}, the folder step {step}",
        file.display(),
        state.step
    );
    Ok(state)
}

/// Steps of the complete checkpoints in a run directory.
pub fn list(run_dir: &Path) -> anyhow::Result<Vec<usize>> {
    let dir = run_dir.join("checkpoints");
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut steps = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let name = entry?.file_name();
        if let Some(step) = name.to_str().and_then(|n| n.strip_prefix("step-")).and_then(|s| s.parse().ok()) {
            steps.push(step);
        }
    }
    Ok(steps)
}
