//! What a run spends before its first step is done: the kernels' loads (`lora-ft bench kernels`)
//! and the first step timed from process start on a cold, a fresh and a warm driver JIT cache
//! (`lora-ft bench train --first-step-cold-warm`).

use std::process::Command;

use serde::Serialize;

/// Seconds from process start to the end of the first training step, each in its own process.
#[derive(Debug, Clone, Serialize)]
pub struct FirstSteps {
    /// `CUDA_CACHE_DISABLE=1`: every PTX the run loads is compiled by the driver.
    pub cold_s: f64,
    /// A new, empty `CUDA_CACHE_PATH`: a fresh machine's first run.
    pub fresh_s: f64,
    /// The same cache as the fresh run left it: every later run on that machine.
    pub warm_s: f64,
}

/// Runs this binary with `args` (a `bench train` at one shape) three times — JIT cache off, a new
/// empty one, that one again — and reads `first_step_s` from each child's first JSON row.
pub fn first_steps(args: &[String]) -> anyhow::Result<FirstSteps> {
    let exe = std::env::current_exe()?;
    let cache = std::env::temp_dir().join(format!("lora-ft-jit-cache-{}", std::process::id()));
    let run = |what: &str, env: &[(&str, &std::ffi::OsStr)]| -> anyhow::Result<f64> {
        let mut cmd = Command::new(&exe);
        cmd.args(args).env_remove("CUDA_CACHE_DISABLE").env_remove("CUDA_CACHE_PATH");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let row = stdout.lines().find(|l| l.starts_with('{')).unwrap_or_default();
        let value: serde_json::Value = serde_json::from_str(row).unwrap_or_default();
        let seconds = value.get("first_step_s").and_then(|s| s.as_f64());
        let stderr = String::from_utf8_lossy(&out.stderr);
        seconds.ok_or_else(|| {
            anyhow::anyhow!(
                "the {what} first-step run printed no first_step_s ({}): {}",
                out.status,
                stderr.trim()
            )
        })
    };
    let _ = std::fs::remove_dir_all(&cache);
    let cold_s = run("cold", &[("CUDA_CACHE_DISABLE", "1".as_ref())])?;
    let fresh_s = run("fresh", &[("CUDA_CACHE_PATH", cache.as_os_str())])?;
    let warm_s = run("warm", &[("CUDA_CACHE_PATH", cache.as_os_str())])?;
    let _ = std::fs::remove_dir_all(&cache);
    Ok(FirstSteps { cold_s, fresh_s, warm_s })
}

/// One module's load, and the totals (`module` "total ours", "total candle").
#[cfg(feature = "cuda")]
pub use crate::cuda::module::LoadTime;

/// Loads every kernel module a training step uses on `device` — ours from their fatbins, then
/// candle's from PTX — timing each, then the totals.
#[cfg(feature = "cuda")]
pub fn kernels(device: &candle_core::Device) -> anyhow::Result<Vec<LoadTime>> {
    use crate::cuda::module::{load_candle, load_ours};
    let candle_core::Device::Cuda(dev) = device else { anyhow::bail!("bench kernels needs a CUDA device") };
    let ours = load_ours(dev)?;
    let candle = load_candle(dev)?;
    let total = |module: &str, kind, rows: &[LoadTime]| LoadTime {
        module: module.into(),
        kind,
        bytes: rows.iter().map(|r| r.bytes).sum(),
        ms: rows.iter().map(|r| r.ms).sum(),
    };
    let kind = if candle.iter().all(|r| r.kind == "fatbin") { "fatbin" } else { "ptx" };
    let totals = [total("total ours", "fatbin", &ours), total("total candle", kind, &candle)];
    Ok(ours.into_iter().chain(candle).chain(totals).collect())
}

/// Without CUDA there are no kernels to load.
#[cfg(not(feature = "cuda"))]
pub fn kernels(_device: &candle_core::Device) -> anyhow::Result<Vec<serde_json::Value>> {
    anyhow::bail!("bench kernels needs a CUDA build (cargo build --features cuda)")
}
