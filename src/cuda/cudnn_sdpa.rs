//! Causal attention through cuDNN's fused SDPA (`cudnn_sdpa.cpp`) where cuDNN 9 is found when
//! the program runs; the project's kernels (`flash.rs`) everywhere else. cuDNN's Hopper engines
//! run a training step's attention faster than `flash.rs` (benches/profile_mistral-7b.md; numbers
//! in benches/code_notes.md).
//!
//! `LORA_FT_ATTENTION` picks: `auto` (default: cuDNN when it loads and takes the call),
//! `cudnn` (an error when it cannot), or `flash` (the project's kernels). `LORA_FT_CUDNN` names
//! the library file when `libcudnn.so.9` is not on the loader's path. cuDNN takes the training
//! shape — as many queries as keys — with the family's query scale, sliding window and Gemma 2's
//! soft cap; the flash kernels the rest (decoding with a cache).
//!
//! A graph cuDNN refuses in `auto` mode is refused for its kind only: plain causal graphs,
//! windowed ones and soft-capped ones each fall back on their own (plain and windowed to the
//! flash kernels, soft-capped to the composed path), so one unsupported feature never slows the
//! others.

use std::sync::atomic::{AtomicU8, Ordering};

use candle_core::{Result, Tensor};

/// Which attention implementation runs on CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Auto = 0,
    Cudnn = 1,
    Flash = 2,
}

impl Rule {
    /// The kind of graph the rule needs (with packed rows or not), as a bit of `REFUSED_KINDS`.
    fn kind(&self, ragged: bool) -> u8 {
        let kind = match (self.softcap, self.window) {
            (Some(_), _) => 4,
            (None, Some(_)) => 2,
            (None, None) => 1,
        };
        if ragged {
            kind << 4
        } else {
            kind
        }
    }

    fn kind_name(&self) -> &'static str {
        match self.kind(false) {
            4 => "soft-capped",
            2 => "windowed",
            _ => "causal",
        }
    }
}

const UNSET: u8 = u8::MAX;
static MODE: AtomicU8 = AtomicU8::new(UNSET);
/// The kinds of graph (`Rule::kind` bits) cuDNN refused in `auto` mode: those stay off it.
static REFUSED_KINDS: AtomicU8 = AtomicU8::new(0);

fn mode_from_env() -> Mode {
    match std::env::var("LORA_FT_ATTENTION").as_deref() {
        Ok("cudnn") => Mode::Cudnn,
        Ok("flash") => Mode::Flash,
        Ok("auto") | Err(_) => Mode::Auto,
        Ok(other) => {
            tracing::warn!("LORA_FT_ATTENTION={other} is not auto, cudnn or flash: using auto");
            Mode::Auto
        }
    }
}

thread_local! {
    /// `set_mode`'s override, per thread: tests running side by side each keep their own.
    static MODE_OVERRIDE: std::cell::Cell<Option<Mode>> = const { std::cell::Cell::new(None) };
}

/// The mode in force: this thread's `set_mode`, else `LORA_FT_ATTENTION`.
pub fn mode() -> Mode {
    if let Some(m) = MODE_OVERRIDE.get() {
        return m;
    }
    match MODE.load(Ordering::Relaxed) {
        UNSET => {
            let m = mode_from_env();
            let _ = MODE.compare_exchange(UNSET, m as u8, Ordering::Relaxed, Ordering::Relaxed);
            mode()
        }
        1 => Mode::Cudnn,
        2 => Mode::Flash,
        _ => Mode::Auto,
    }
}

/// cuDNN's attention graphs built so far in this process (one forward and one backward per new
/// shape) and the host seconds their building took: what a step of a new shape pays.
pub fn graph_builds() -> (u64, f64) {
    ffi::graph_builds()
}

/// Overrides `LORA_FT_ATTENTION` on this thread (tests and `bench attention`), and forgets
/// earlier refusals.
pub fn set_mode(m: Mode) {
    MODE_OVERRIDE.set(Some(m));
    REFUSED_KINDS.store(0, Ordering::Relaxed);
}

/// Whether cuDNN takes this call: the mode allows it, as many queries as keys, its kind of
/// graph not refused before, and cuDNN loaded.
fn applies(q: &Tensor, k: &Tensor, rule: &Rule, ragged: bool) -> Result<bool> {
    if mode() == Mode::Flash || REFUSED_KINDS.load(Ordering::Relaxed) & rule.kind(ragged) != 0 {
        return Ok(false);
    }
    Ok(q.dim(2)? == k.dim(2)? && ffi::version().is_some())
}

/// cuDNN could not take a call it should have: an error in `cudnn` mode, else a warning and
/// the fallback for this kind of graph from now on.
fn refused(rule: &Rule, ragged: bool, what: &str) -> Result<()> {
    if mode() == Mode::Cudnn {
        candle_core::bail!("LORA_FT_ATTENTION=cudnn, but {what}");
    }
    let kind = rule.kind(ragged);
    if REFUSED_KINDS.fetch_or(kind, Ordering::Relaxed) & kind == 0 {
        // packed rows too: the flash kernels take their spans
        let fallback = if rule.softcap.is_some() { "the composed path" } else { "the flash kernels" };
        let packed = if ragged { " of packed rows" } else { "" };
        tracing::warn!(
            "cuDNN attention unavailable for {} scores{packed} ({what}); using {fallback}",
            rule.kind_name()
        );
    }
    Ok(())
}

/// q `[b, h, t, d]`, k/v `[b, kv, t, d]` → (context `[b, h, t, d]` (a view of `[b, t, h, d]`,
/// as `flash::forward`), stats `[b, h, t]` f32: the row log-sum-exp of the (capped) scores in
/// natural-log units), or `None` where cuDNN does not take the call.
///
/// With `ragged` (packed rows) the stats are `[sequences, h, longest]`. Soft caps of packed rows
/// are not sent (cuDNN's score modifier turns its padding mask off).
pub fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rule: &Rule,
    ragged: Option<&Ragged>,
) -> Result<Option<(Tensor, Tensor)>> {
    if ragged.is_some() && rule.softcap.is_some() {
        return Ok(None);
    }
    if !applies(q, k, rule, ragged.is_some())? {
        if mode() == Mode::Cudnn {
            refused(rule, ragged.is_some(), &format!("cuDNN does not take this call ({})", ffi::why_not()))?;
        }
        return Ok(None);
    }
    match ffi::forward(q, k, v, rule, ragged)? {
        Ok(out) => Ok(Some(out)),
        Err(why) => refused(rule, ragged.is_some(), &why).map(|_| None),
    }
}

/// The backward of `forward`'s output under the same rule: (dq, dk, dv) with dk/dv summed to
/// the kv heads (`[b, h, t, d]` views of `[b, t, h, d]` memory, the projections' layout), or
/// `None` where cuDNN refuses the graph (the caller then falls back on `stats`).
pub fn backward(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (context, stats): (&Tensor, &Tensor),
    d_context: &Tensor,
    rule: &Rule,
    ragged: Option<&Ragged>,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    match ffi::backward((q, k, v), (context, stats), d_context, rule, ragged)? {
        Ok(grads) => Ok(Some(grads)),
        Err(why) => refused(rule, ragged.is_some(), &why).map(|_| None),
    }
}

#[path = "cudnn_sdpa_rule.rs"]
mod rule;
pub use rule::{Ragged, Rule};

#[cfg(lora_ft_cudnn)]
#[path = "cudnn_sdpa_ffi.rs"]
mod ffi;

/// Built without the cuDNN headers (`CUDNN_INCLUDE` unset): the flash kernels only.
#[cfg(not(lora_ft_cudnn))]
mod ffi {
    use candle_core::{Result, Tensor};

    use super::rule::{Ragged, Rule};

    pub type Outcome<T> = Result<std::result::Result<T, String>>;

    pub fn version() -> Option<i64> {
        None
    }

    pub fn why_not() -> String {
        "this binary was built without the cuDNN headers".into()
    }

    pub fn graph_builds() -> (u64, f64) {
        (0, 0.0)
    }

    pub fn forward(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Rule,
        _: Option<&Ragged>,
    ) -> Outcome<(Tensor, Tensor)> {
        Ok(Err(why_not()))
    }

    pub fn backward(
        _: (&Tensor, &Tensor, &Tensor),
        _: (&Tensor, &Tensor),
        _: &Tensor,
        _: &Rule,
        _: Option<&Ragged>,
    ) -> Outcome<(Tensor, Tensor, Tensor)> {
        Ok(Err(why_not()))
    }
}
