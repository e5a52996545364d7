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
