//! How a run ends: its summary, a stop by signal after a checkpoint, and the checkpoint a
//! stopped run resumes from.

use std::path::PathBuf;

use super::checkpoint;
use super::records::EvalRecord;
use crate::config::Config;

/// What a finished run reports.
pub struct TrainSummary {
    /// The run's last step.
    pub steps: usize,
    /// The step this invocation started from: a resumed run's checkpoint, 0 for a fresh run.
    pub first_step: usize,
    pub first_loss: f64,
    pub last_loss: f64,
    /// Before the first step.
    pub first_eval: Option<EvalRecord>,
    pub last_eval: Option<EvalRecord>,
    pub adapter_dir: PathBuf,
    pub tokens_per_s: f64,
}

/// The run stopped on SIGINT/SIGTERM after writing a checkpoint of the step in progress.
#[derive(Debug, thiserror::Error)]
#[error("stopped by a signal at step {step} of {total}; checkpoint {}", checkpoint.display())]
pub struct Stopped {
    pub step: usize,
    pub total: usize,
    pub checkpoint: PathBuf,
}

/// The newest complete checkpoint, for a message about a run that stopped.
pub fn resume_point(cfg: &Config) -> String {
    let resumes = match cfg.checkpoint.resume {
        crate::config::ResumeMode::Auto => "the same command resumes from it",
        crate::config::ResumeMode::Never => "checkpoint.resume = \"auto\" resumes from it",
    };
    match checkpoint::newest_complete(&cfg.output.dir) {
        Ok(Some((dir, state))) => format!(
            "the newest complete checkpoint, step {} ({}), is intact: {resumes}",
            state.step,
            dir.display()
        ),
        _ => "no checkpoint was written yet".into(),
    }
}
