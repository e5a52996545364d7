//! `lora-ft bench`: measurements to set beside the reference stack's, printed as JSON lines.

use std::time::Instant;

use candle_core::{DType, Device};
use serde::Serialize;

use crate::memory::{device_memory, pool_memory, reset_peak, GIB};
use crate::model::CausalLm;
use crate::quant::Quantization;

/// What loading a model cost.
#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub model: String,
    pub quantization: String,
    pub dtype: String,
    pub load_s: f64,
    /// Bytes of the tensors the model holds (embeddings, norms, lm_head, quantized projections).
    pub model_gib: f64,
    /// Allocated in the memory pool after loading, and its peak while loading (`None` on the CPU).
    pub allocated_gib: Option<f64>,
    pub peak_allocated_gib: Option<f64>,
    /// Growth of the device's used memory across the load (driver view; `None` on the CPU).
    pub device_used_gib: Option<f64>,
}

/// Loads `model` (HF folder, Hub id or .gguf) and reports time and memory.
pub fn load(
    model: &str,
    quantization: Quantization,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<LoadReport> {
    let files = crate::hub::resolve(model, "main")?;
    let before = device_memory(device);
    reset_peak(device);
    let started = Instant::now();
    let lm = CausalLm::load(&files.config, &files.weights, dtype, quantization, device)?;
    let after = device_memory(device);
    let load_s = started.elapsed().as_secs_f64();
    let pool = pool_memory(device);
    let used = before.zip(after).map(|(b, a)| (a.used as f64 - b.used as f64) / GIB);
    Ok(LoadReport {
        model: model.to_string(),
        quantization: format!("{quantization:?}"),
        dtype: format!("{dtype:?}"),
        load_s,
        model_gib: lm.base_size_in_bytes() as f64 / GIB,
        allocated_gib: pool.map(|p| p.allocated as f64 / GIB),
        peak_allocated_gib: pool.map(|p| p.peak_allocated as f64 / GIB),
        device_used_gib: used,
    })
}
