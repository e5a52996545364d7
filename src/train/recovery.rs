//! A step that runs out of GPU memory before anything of it was applied runs again instead of
//! stopping the run. `train.checkpointing = "auto"` plans to the budget's edge, and what the plan
//! does not count is the memory pool's own cut: with freed memory kept for reuse (memory.rs
//! `retain_freed_memory`), blocks cut to an earlier shape's buffers can leave a larger one no
//! room on a card the size of the plan's (measured: a longer shape after a shorter one, see
//! benches/code_notes.md and benches/issue20_checkpointing_cold_start.md). So the
//! step runs again first with the pool trimmed, the same plan; then, if it runs out again, with
//! one layer's activations fewer kept at its shapes from then on, until it fits or no layer is left
//! to give up (`KeptLayers::keep_fewer`: the other shapes keep their plans). A shape is trimmed
//! once: where a later step of it runs out again, it gives up a layer at once
//! (`KeptLayers::trimmed_before`), so that a run settles on a plan its card holds instead of
//! trimming the pool step after step.

use super::step::{may_run_again, StepResult, Trainer};
use crate::data::Batch;

impl Trainer {
    /// `step`, run again where it ran out of GPU memory in its forward and backward (see the
    /// module's text); `note` hears what each retry changed, in the words of the log.
    pub fn step_recovering(
        &mut self,
        step: usize,
        micro_batches: &[Batch],
        mut note: impl FnMut(String),
    ) -> anyhow::Result<Option<StepResult>> {
        let mut result = self.step(step, micro_batches);
        let mut trimmed = false;
        while result.as_ref().is_err_and(may_run_again) {
            let layers = self.model.layers.len();
            // a shape trimmed in an earlier step that runs out again gives up a layer at once
            let what = if !trimmed && !self.model.kept_layers().trimmed_before() {
                "runs again with the memory pool trimmed"
            } else if self.model.kept_layers().keep_fewer(layers) {
                "the steps of its shape from now on keep one layer's activations fewer on the GPU, and this one runs again"
            } else {
                break;
            };
            trimmed = true;
            self.model.drop_prefetched();
            crate::memory::trim_pool(self.model.device());
            note(format!("step {}: out of GPU memory in its forward and backward; {what}", step + 1));
            result = self.step(step, micro_batches);
        }
        result
    }
}

/// `LORA_FT_INJECT_OOM=2*2,5`: the last micro-batch of each listed step (1-based) fails as the GPU
/// running out of memory, after the micro-batches before it computed their gradients, as many
/// times as `*N` says (once without it): how a test runs the retries on a machine that cannot run
/// out (tests/oom_retry.rs). An item that is not `S` or `S*N` is left out.
pub(super) fn injected_oom(step: usize, last_micro_batch: bool) -> candle_core::Result<()> {
    static LIST: std::sync::OnceLock<Vec<(usize, usize)>> = std::sync::OnceLock::new();
    static FAILED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    // read once: the steps' path asks at every micro-batch
    let list = LIST.get_or_init(|| {
        let text = std::env::var("LORA_FT_INJECT_OOM").unwrap_or_default();
        text.split(',')
            .filter_map(|item| {
                let (at, times) = item.trim().split_once('*').unwrap_or((item.trim(), "1"));
                Some((at.parse::<usize>().ok()?, times.parse::<usize>().ok()?))
            })
            .collect()
    });
    let Some(&(_, times)) = list.iter().find(|&&(at, _)| at == step) else { return Ok(()) };
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    if !last_micro_batch || failed.iter().filter(|&&s| s == step).count() >= times {
        return Ok(());
    }
    failed.push(step);
    Err(candle_core::Error::Msg(format!(
        "CUDA_ERROR_OUT_OF_MEMORY at step {step} (injected by LORA_FT_INJECT_OOM)"
    )))
}
