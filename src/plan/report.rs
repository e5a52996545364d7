//! `lora-ft estimate`'s report: the parts of the predicted peak, the planner's choice of kept,
//! offloaded and complete layers, and the largest batch per sequence length.

use super::{estimate, largest_batch, layer_plan, RunShape};
use crate::arch::ModelConfig;

/// `lora-ft estimate`'s report: the parts of the peak at the config's batch and sequence
/// length, then the largest batch within `budget` bytes at each sequence length. With `auto`
/// (`train.checkpointing = "auto"`), the parts are those of the layers the planner keeps within
/// the budget, and each largest batch is the one that fits with every layer recomputed.
pub fn report(
    m: &ModelConfig,
    run: &RunShape,
    (seq, batch): (usize, usize),
    budget: u64,
    auto: bool,
) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let plan = match auto {
        true => layer_plan(m, run, (seq, batch), budget),
        false => run.layers,
    };
    let e = estimate(m, &run.planned(&plan), (seq, batch));
    let mut out = format!("predicted peak GPU memory at batch {batch} x {seq} tokens:\n");
    let kept_line = format!("kept activations ({} of {} layers)", e.kept_layers, m.num_hidden_layers);
    let mut parts = vec![
        ("base weights", e.base_weights),
        ("LoRA + optimizer state", e.lora_and_optimizer),
        ("checkpointed activations", e.checkpoints),
        (kept_line.as_str(), e.kept_activations),
        ("one layer's recompute + backward", e.layer_recompute),
        ("loss buffers (not at the same time)", e.loss_chunk),
        ("gradients (at the backward's end)", e.gradients),
        ("workspace", e.workspace),
    ];
    if e.offloaded_layers > 0 {
        parts.insert(4, ("one offloaded layer in flight", e.in_flight));
    }
    for (what, bytes) in parts {
        out += &format!("  {what:<36} {:>8.2} GiB\n", gib(bytes));
    }
    out += &format!("  {:<36} {:>8.2} GiB   (budget {:.2} GiB)\n", "peak", gib(e.peak()), gib(budget));
    let recomputed = m.num_hidden_layers.saturating_sub(e.kept_layers + e.offloaded_layers);
    out += &match (auto, e.kept_layers, e.offloaded_layers) {
        (true, 0, 0) => "checkpointing auto: every layer is recomputed in the backward (no room to keep one)\n".into(),
        (true, k, 0) => {
            format!("checkpointing auto: the last {k} layers keep their activations (no recompute), {recomputed} are recomputed\n")
        }
        (true, k, o) => format!(
            "checkpointing auto: {k} layers keep their activations on the GPU and {o} in page-locked host memory \
             ({:.2} GiB of the {:.2} GiB allowed, one every {} layers from the last down), {recomputed} are recomputed\n",
            gib(e.offloaded_host),
            gib(run.host_budget),
            plan.stride
        ),
        (false, ..) => String::new(),
    };
    if auto && plan.complete > 0 {
        out += &format!(
            "the last {} of them keep their norms' outputs and the gated product too (nothing recomputed)\n",
            plan.complete.min(e.kept_layers)
        );
    }
    if plan.lm_head_resident {
        out += "lm_head stays on the GPU at this shape (streamed from host memory where it would cost a layer)\n";
    }
    if plan.lm_head_prefetch > 0 {
        let chunks = super::estimate::head_chunks(m);
        out += &format!(
            "lm_head is streamed from host memory for the loss: its first {} of {chunks} chunks ({:.2} GiB) \
             come in during the last {} layers' forward, in the loss's room under the peak\n",
            plan.lm_head_prefetch.min(chunks),
            gib(plan.lm_head_prefetch as u64 * super::estimate::head_chunk_bytes(m, run)),
            plan.lm_head_prefetch_lead
        );
    }
    out += "\nlargest batch within the budget:\n";
    let mut seqs = vec![512, 1024, 2048, 4096, seq];
    seqs.sort_unstable();
    seqs.dedup();
    for s in seqs {
        let b = largest_batch(m, run, s, budget);
        let peak =
            if b > 0 { format!("{:.2} GiB", gib(estimate(m, run, (s, b)).peak())) } else { "-".into() };
        out += &format!("  seq {s:>5}: batch {b:>4}   (peak {peak})\n");
    }
    out
}
