//! Where a step's time goes: with `LORA_FT_PROFILE=1`, each timed section synchronizes the device
//! before and after and adds its wall time to a per-name total. Off (the default) it costs one
//! branch. Synchronizing stalls the GPU's queue, so a profiled step is slower than a real one;
//! the shares are what to read. Sections do not nest.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use candle_core::Device;

static ENABLED: OnceLock<bool> = OnceLock::new();
static TOTALS: Mutex<BTreeMap<&'static str, (Duration, u64)>> = Mutex::new(BTreeMap::new());

pub fn enabled() -> bool {
    *ENABLED.get_or_init(|| std::env::var_os("LORA_FT_PROFILE").is_some_and(|v| v != "0"))
}

/// Runs `f` as the section `name`.
pub fn section<T, E: From<candle_core::Error>>(
    name: &'static str,
    device: &Device,
    f: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    if !enabled() {
        return f();
    }
    device.synchronize()?;
    let started = Instant::now();
    let out = f()?;
    device.synchronize()?;
    if let Ok(mut totals) = TOTALS.lock() {
        let entry = totals.entry(name).or_default();
        entry.0 += started.elapsed();
        entry.1 += 1;
    }
    Ok(out)
}

/// The totals so far as (name, seconds, calls), largest first; clears them.
pub fn take() -> Vec<(&'static str, f64, u64)> {
    let Ok(mut totals) = TOTALS.lock() else { return Vec::new() };
    let mut rows: Vec<_> = std::mem::take(&mut *totals)
        .into_iter()
        .map(|(name, (time, calls))| (name, time.as_secs_f64(), calls))
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows
}

/// With `LORA_FT_TIMELINE=1`: the steps' timeline, to tell where the GPU waits. `timeline::start`
/// marks a step's call, synchronizes the device and marks its start; each `mark` records an event
/// on the device's stream (CUDA) and the host's clock; `take` reads them back. A mark's GPU time
/// close to its host time says the GPU had caught up with the host there (the host was the
/// bottleneck); the time from one step's last mark to the next one's call is the host's alone.
pub mod timeline {
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;

    use candle_core::{Device, Result};

    struct Mark {
        name: String,
        host: Instant,
        #[cfg(feature = "cuda")]
        event: Option<candle_core::cuda_backend::cudarc::driver::CudaEvent>,
    }

    static ON: OnceLock<bool> = OnceLock::new();
    static MARKS: Mutex<Vec<Mark>> = Mutex::new(Vec::new());

    pub fn enabled() -> bool {
        *ON.get_or_init(|| std::env::var_os("LORA_FT_TIMELINE").is_some_and(|v| v != "0"))
    }

    /// Starts a step: marks the call, then, with the device idle, the start (where both clocks
    /// agree).
    pub fn start(device: &Device) -> Result<()> {
        if !enabled() {
            return Ok(());
        }
        mark(device, || "step called".into())?;
        device.synchronize()?;
        mark(device, || "step".into())
    }

    /// Marks the end of the work queued so far, named `name()` (only called when on).
    pub fn mark(device: &Device, name: impl FnOnce() -> String) -> Result<()> {
        if !enabled() {
            return Ok(());
        }
        #[cfg(feature = "cuda")]
        let event = match device {
            Device::Cuda(d) => {
                let flags = candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
                Some(d.cuda_stream().record_event(Some(flags)).map_err(candle_core::Error::wrap)?)
            }
            _ => None,
        };
        #[cfg(not(feature = "cuda"))]
        let _ = device;
        let m = Mark {
            name: name(),
            host: Instant::now(),
            #[cfg(feature = "cuda")]
            event,
        };
        MARKS.lock().unwrap_or_else(|e| e.into_inner()).push(m);
        Ok(())
    }

    /// The marks so far as (name, GPU ms, host ms), both from the first `step` mark (the GPU's is
    /// the host's where the device has no events). Clears them.
    pub fn take() -> Result<Vec<(String, f64, f64)>> {
        let marks = std::mem::take(&mut *MARKS.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(first) = marks.iter().find(|m| m.name == "step") else { return Ok(Vec::new()) };
        let (t0, mut rows) = (first.host, Vec::with_capacity(marks.len()));
        for m in marks.iter().skip_while(|m| m.name != "step") {
            let host = match m.host >= t0 {
                true => (m.host - t0).as_secs_f64() * 1e3,
                false => -(t0 - m.host).as_secs_f64() * 1e3,
            };
            #[cfg(feature = "cuda")]
            let gpu = match (&first.event, &m.event) {
                (Some(a), Some(b)) => a.elapsed_ms(b).map_err(candle_core::Error::wrap)? as f64,
                _ => host,
            };
            #[cfg(not(feature = "cuda"))]
            let gpu = host;
            rows.push((m.name.clone(), gpu, host));
        }
        Ok(rows)
    }
}

/// With `LORA_FT_PROFILE_RANGE=1`: `range(true)` … `range(false)` brackets what a profiler
/// started with `ncu --profile-from-start off` records (the CUDA profiler API), so a benchmark
/// can hand it the decode steps alone, without loading, quantizing and prefill.
pub fn range(device: &Device, on: bool) -> candle_core::Result<()> {
    static RANGE: OnceLock<bool> = OnceLock::new();
    if !*RANGE.get_or_init(|| std::env::var_os("LORA_FT_PROFILE_RANGE").is_some_and(|v| v != "0")) {
        return Ok(());
    }
    device.synchronize()?;
    #[cfg(not(feature = "cuda"))]
    let _ = on;
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        use candle_core::cuda_backend::cudarc::driver::sys;
        // SAFETY: the profiler API takes no arguments and only marks the context's timeline.
        let result = unsafe {
            if on {
                sys::cuProfilerStart()
            } else {
                sys::cuProfilerStop()
            }
        };
        if result != sys::CUresult::CUDA_SUCCESS {
            candle_core::bail!("cuProfiler{}: {result:?}", if on { "Start" } else { "Stop" });
        }
    }
    Ok(())
}
