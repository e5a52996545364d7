//! The planner against the peaks measured for issue 18's families and the ready configs.

use super::*;

#[test]
fn ready_configs_are_within_the_band_of_their_measured_peaks() {
    let run = RunShape { lora: LoraSpec { dropout: 0.05, ..offload_run().lora }, ..offload_run() };
    for (name, peaks) in READY_CONFIG_PEAKS {
        within_band(name, &bench_model(name), &capped_by_ops(name, &run), &peaks);
    }
}

#[test]
fn issue18_families_are_within_the_band_of_the_measured_peaks() {
    for (name, peaks) in ISSUE18_PEAKS {
        within_band(name, &bench_model(name), &capped_by_ops(name, &offload_run()), &peaks);
    }
    let composed = RunShape { fused_attention: false, fused_loss: false, ..offload_run() };
    within_band(
        "gemma2-9b (composed attention)",
        &bench_model("gemma2-9b"),
        &composed,
        &GEMMA2_COMPOSED_PEAKS,
    );
}
