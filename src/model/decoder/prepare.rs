//! The first step's one-time costs, paid while the model loads: the fused attention of every
//! score rule the model's layers use (the causal one, and a window or soft cap where the family
//! has them) built and run once at the run's first shape on a thread of its own, as packed rows
//! where the run packs them (cuDNN's ragged graphs have kernels of their own). On a fresh
//! machine that is cuDNN's graph building and the driver's compiling of its kernels, a large part
//! of the first step, overlapped here with reading and quantizing the weights (timings in
//! benches/code_notes.md).

use std::path::Path;
use std::thread::JoinHandle;

use candle_core::{DType, Device};

use crate::arch::{Architecture, ModelConfig};

/// Rows × tokens at most that the warm-up runs: a longer first shape is warmed at this many
/// tokens (the same kernels; its own graph is built at the first step), so that the warm-up never
/// holds long-row attention buffers beside the weights being loaded.
const MOST_TOKENS: usize = 32_768;

/// Starts the warm-up of the model at `config` for steps of `(seq, batch)` (of packed rows with
/// `packed`) in `dtype` on `device`; `None` where there is nothing to warm (the CPU, f32: no fused kernels). Join the
/// handle once the weights are loaded, before this thread runs anything else on the device (the
/// warm-up may fall back on cuBLAS, whose handle is the device's one, not safe from two threads
/// at once; loading uses only the project's kernels and copies); a failure is logged, never fatal
/// (the step then pays the cost).
pub fn spawn(
    config: &Path,
    dtype: DType,
    device: &Device,
    (seq, batch): (usize, usize),
    packed: bool,
) -> Option<JoinHandle<()>> {
    if !device.is_cuda() || dtype == DType::F32 || seq == 0 || batch == 0 {
        return None;
    }
    let arch = ModelConfig::from_file(config).and_then(|c| Architecture::from_config(&c));
    let arch = match arch {
        Ok(arch) => arch,
        Err(e) => {
            tracing::debug!("attention warm-up skipped: {e:#}");
            return None;
        }
    };
    let device = device.clone();
    let seq = seq.min(MOST_TOKENS / batch.min(MOST_TOKENS)).max(1);
    let spawned = std::thread::Builder::new().name("attention warm-up".into()).spawn(move || {
        let started = std::time::Instant::now();
        if let Err(e) = run(&arch, dtype, &device, (seq, batch), packed) {
            tracing::debug!("attention warm-up failed (the first step builds its graphs): {e}");
        }
        tracing::debug!("attention warm-up: {:.2} s", started.elapsed().as_secs_f64());
    });
    spawned.ok()
}

#[cfg(feature = "cuda")]
fn run(
    arch: &Architecture,
    dtype: DType,
    device: &Device,
    (seq, batch): (usize, usize),
    packed: bool,
) -> candle_core::Result<()> {
    use crate::model::ops::attention::{prepare, ScoreRule};
    let mut windows: Vec<Option<usize>> = (0..arch.num_layers).map(|l| arch.window(l)).collect();
    windows.sort();
    windows.dedup();
    for window in windows {
        let rule = ScoreRule { scale: arch.query_scale, softcap: arch.attention_softcap, window };
        let heads = (arch.num_heads, arch.num_kv_heads, arch.head_dim);
        prepare(device, dtype, (batch, seq), heads, &rule, packed)?;
    }
    device.synchronize()
}

#[cfg(not(feature = "cuda"))]
fn run(_: &Architecture, _: DType, _: &Device, _: (usize, usize), _: bool) -> candle_core::Result<()> {
    Ok(())
}
