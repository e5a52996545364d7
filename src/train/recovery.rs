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
