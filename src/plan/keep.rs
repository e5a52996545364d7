//! Which layers a step keeps for its backward within a memory budget (`train.checkpointing =
//! "auto"`): as many of the last layers' activations on the GPU as the budget holds, and with
//! host offload, more in page-locked host memory, as many as the host budget and the PCIe link
//! allow (model/activations/kept.rs places them, layer_offload.rs moves them).

use super::{estimate, RunShape};
use crate::arch::ModelConfig;
use crate::model::activations::LayerPlan;

/// GPU FLOPs a layer's forward runs per byte the copy engine moves to or from the host in the
/// same time: the f16 GEMM rate over the copy rate each way, as measured on a PCIe 5 GPU
/// (scripts/bench/pcie_bandwidth.py; numbers in benches/code_notes.md), less for the layer's other
/// kernels. An offloaded layer's copy out hides behind the forward of the `stride` layers after
/// it. A GPU on PCIe 4 computes slower too, so the ratio errs to the safe side there.
/// `LORA_FT_OFFLOAD_FLOPS_PER_BYTE` sets another (a GPU with a faster or slower link).
pub const OFFLOAD_FLOPS_PER_BYTE: f64 = 12_000.0;

fn offload_flops_per_byte() -> f64 {
    let Ok(text) = std::env::var("LORA_FT_OFFLOAD_FLOPS_PER_BYTE") else { return OFFLOAD_FLOPS_PER_BYTE };
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => v,
        _ => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "LORA_FT_OFFLOAD_FLOPS_PER_BYTE={text:?} is not a positive number: planning with \
                     {OFFLOAD_FLOPS_PER_BYTE}"
                )
            });
            OFFLOAD_FLOPS_PER_BYTE
        }
    }
}

/// The plan at `(seq, batch)` within `budget` bytes: first the most last layers kept on the
/// device alone; then, with host offload and a host budget, the mix of kept and offloaded
/// layers with the fewest recomputed — the offloaded layers' one in flight costs the device a
/// layer or two of the kept ones. An lm_head that host offload would stream stays on the device
/// where that recomputes no more layers: streaming reads the whole head over the PCIe link once
/// a step, longer than the loss's own GEMMs at short rows (benches/code_notes.md).
pub fn layer_plan(m: &ModelConfig, run: &RunShape, shape: (usize, usize), budget: u64) -> LayerPlan {
    let streamed_run = run.planned(&LayerPlan { lm_head_resident: false, ..run.layers });
    let streamed = plan_for(m, &streamed_run, shape, budget);
    if !streamed_run.streams_lm_head(m) {
        return streamed;
    }
    let layers = m.num_hidden_layers;
    let resident_run = run.planned(&LayerPlan { lm_head_resident: true, ..run.layers });
    let resident = plan_for(m, &resident_run, shape, budget);
    match resident.whole(layers) >= streamed.whole(layers) {
        true => LayerPlan { lm_head_resident: true, ..resident },
        false => streamed,
    }
}

/// `layer_plan` with lm_head where `run` says.
pub(super) fn plan_for(m: &ModelConfig, run: &RunShape, shape: (usize, usize), budget: u64) -> LayerPlan {
    with_head_prefetch(m, run, shape, layers_for(m, run, shape, budget))
}

/// `plan` with as many of a streamed lm_head's chunks prefetched during the forward as the loss's
/// moment leaves under the plan's peak (none where the head is not streamed), starting as many
/// layers before the forward's end as their copy takes at `OFFLOAD_FLOPS_PER_BYTE`. The peak
/// stays what it was: the chunks are counted in the loss's moment, which was below it by that
/// much. Prefetching hides part of the head's copy behind the forward, so the loss waits on
/// the link less (measurements in benches/code_notes.md).
fn with_head_prefetch(m: &ModelConfig, run: &RunShape, shape: (usize, usize), plan: LayerPlan) -> LayerPlan {
    let plan = LayerPlan { lm_head_prefetch: 0, lm_head_prefetch_lead: 0, ..plan };
    if !run.streams_lm_head(m) {
        return plan;
    }
    let planned = run.planned(&LayerPlan { lm_head_resident: false, ..plan });
    let chunk = super::estimate::head_chunk_bytes(m, run).max(1);
    let prefetch = ((estimate(m, &planned, shape).loss_headroom() / chunk) as usize)
        .min(super::estimate::head_chunks(m));
    if prefetch == 0 {
        return plan;
    }
    let bytes = prefetch as u64 * chunk;
    let lead = ((bytes as f64 * offload_flops_per_byte() / layer_forward_flops(m, shape)).ceil() as usize)
        .clamp(1, m.num_hidden_layers.max(1));
    LayerPlan { lm_head_prefetch: prefetch, lm_head_prefetch_lead: lead, ..plan }
}

fn layers_for(m: &ModelConfig, run: &RunShape, (seq, batch): (usize, usize), budget: u64) -> LayerPlan {
    let (layers, lm_head_resident) = (m.num_hidden_layers, run.layers.lm_head_resident);
    let peak = |plan: LayerPlan| estimate(m, &run.planned(&plan), (seq, batch)).peak();
    let fits = |kept, offloaded, stride| {
        peak(LayerPlan { kept, offloaded, stride, lm_head_resident, ..LayerPlan::NONE }) <= budget
    };
    let kept = (0..=layers).rev().find(|&k| fits(k, 0, 1)).unwrap_or(0);
    let alone = LayerPlan { kept, ..LayerPlan::NONE };
    if kept == layers {
        // every layer kept: memory left over keeps the cheap kernels' outputs too, clear of the
        // 2% by which the estimates can fall short of a measured peak (plan/tests.rs
        // `within_band`; a measured peak went over without it: benches/code_notes.md)
        let with = |complete| LayerPlan { complete, lm_head_resident, ..alone };
        let complete = (0..=layers).rev().find(|&c| peak(with(c)) <= budget - budget / 50).unwrap_or(0);
        return LayerPlan { complete, ..alone };
    }
    if !run.host_offload || run.host_budget == 0 {
        return alone;
    }
    let none = LayerPlan { lm_head_resident, ..LayerPlan::NONE };
    let layer_bytes = estimate(m, &run.planned(&none), (seq, batch)).kept_layer_bytes.max(1);
    let stride = offload_stride(m, (seq, batch), layer_bytes);
    let positions = LayerPlan { stride, ..LayerPlan::NONE }.offload_positions(layers).count();
    let room = ((run.host_budget / layer_bytes) as usize).min(positions);
    for k in (0..=kept).rev() {
        let offloaded = room.min(layers - k);
        if offloaded == 0 {
            break;
        }
        if fits(k, offloaded, stride) {
            // fewer kept on the device only ever means as many or fewer whole layers
            return match k + offloaded > kept {
                true => LayerPlan { kept: k, offloaded, stride, offload_room: room, ..LayerPlan::NONE },
                false => alone,
            };
        }
    }
    alone
}

/// Layers from one offloaded layer to the next: enough forward FLOPs between two for the first
/// one's copy out (`layer_bytes`) at `OFFLOAD_FLOPS_PER_BYTE`.
pub fn offload_stride(m: &ModelConfig, shape: (usize, usize), layer_bytes: u64) -> usize {
    ((layer_bytes as f64 * offload_flops_per_byte() / layer_forward_flops(m, shape)).ceil() as usize).max(1)
}

/// One decoder layer's forward FLOPs at `(seq, batch)`: the projections, and causal attention's
/// two products over seq / 2 keys on average.
fn layer_forward_flops(m: &ModelConfig, (seq, batch): (usize, usize)) -> f64 {
    let (h, i) = (m.hidden_size as f64, m.intermediate_size as f64);
    let (q, kv) = ((m.num_attention_heads * m.head_dim()) as f64, (m.num_kv_heads() * m.head_dim()) as f64);
    let params = h * (2.0 * q + 2.0 * kv) + 3.0 * h * i;
    let tokens = (seq * batch) as f64;
    2.0 * params * tokens + 2.0 * q * seq as f64 * tokens
}

/// Page-locked host memory offloaded activations may take: half the memory the host has
/// available now (`MemAvailable`), 0 where that is unknown (not Linux).
pub fn host_budget() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else { return 0 };
    text.lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024 / 2)
}
