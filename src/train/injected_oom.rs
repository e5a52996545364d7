//! Out-of-memory failures on demand, for the tests of the retry (recovery.rs) on a machine whose
//! memory never runs out.

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
