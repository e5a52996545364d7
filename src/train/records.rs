//! What one optimizer step and one evaluation report: the rows of metrics.jsonl, the scalars of
//! the TensorBoard files.

use serde::Serialize;

/// One logged optimizer step.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    pub step: usize,
    pub epoch: f64,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    /// The f16 loss scale after this step (1 for f32/bf16) and the run's skipped steps so far.
    pub loss_scale: f64,
    pub skipped_steps: usize,
    /// Trained (label ≠ −100) tokens in this optimizer step.
    pub trained_tokens: usize,
    /// All tokens processed in this step, padding included.
    pub tokens: usize,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
    /// GPU memory in use and the run's peak so far (absent on the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_allocated_gib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_peak_gib: Option<f64>,
}

/// One evaluation of the held-out set.
#[derive(Debug, Clone, Serialize)]
pub struct EvalRecord {
    pub step: usize,
    pub eval_loss: f64,
    pub eval_ppl: f64,
    pub eval_tokens: usize,
}
