//! Causal attention through cuDNN's fused SDPA (`cudnn_sdpa.cpp`) where cuDNN 9 is found when
//! the program runs; the project's kernels (`flash.rs`) everywhere else. On the H100 cuDNN's
//! Hopper engines run the 2048-token attention of a training step ~3× faster than `flash.rs`
//! (benches/profile_mistral-7b.md).
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

/// How scores are made and masked: s = scale · q·kᵀ, cap · tanh(s / cap) with a soft cap, then
/// causal and, with a window w, key j visible from row i only when i − j < w.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    pub scale: f64,
    pub softcap: Option<f64>,
    pub window: Option<usize>,
}

/// Packed rows (`data.packing`) as cuDNN reads them: `sequences` spans laid back to back in the
/// `[b, t, heads, d]` memory of q, k and v, each at most `longest` tokens; `q_offsets` and
/// `kv_offsets` (`[sequences + 1]` i32) where each starts, in elements of q and of k/v;
/// `seq_lens` (`[sequences]` i32) their lengths. Spans of length 0 may pad `sequences` to a
/// bucket, so that few graphs are built.
pub struct Ragged<'a> {
    pub sequences: usize,
    pub longest: usize,
    pub q_offsets: &'a Tensor,
    pub kv_offsets: &'a Tensor,
    pub seq_lens: &'a Tensor,
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

/// The mode in force (`LORA_FT_ATTENTION` until `set_mode`).
pub fn mode() -> Mode {
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

/// Overrides `LORA_FT_ATTENTION` for the rest of the process (tests and `bench attention`), and
/// forgets earlier refusals.
pub fn set_mode(m: Mode) {
    MODE.store(m as u8, Ordering::Relaxed);
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
        let fallback =
            if rule.softcap.is_some() || ragged { "the composed path" } else { "the flash kernels" };
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

#[cfg(lora_ft_cudnn)]
mod ffi {
    use std::ffi::{c_char, c_void, CStr, CString};
    use std::sync::OnceLock;

    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{bail, DType, Result, Tensor, WithDType};
    use half::{bf16, f16};

    use super::{Ragged, Rule};
    use crate::cuda::{cuda_device, view, wrap};

    #[repr(C)]
    #[derive(Default)]
    struct SdpaDesc {
        batch: i64,
        heads: i64,
        kv_heads: i64,
        seq: i64,
        head_dim: i64,
        bf16: i32,
        scale: f32,
        softcap: f32,
        window: i64,
        ragged: i64,
        q: [i64; 4],
        k: [i64; 4],
        v: [i64; 4],
        o: [i64; 4],
        d_o: [i64; 4],
        dq: [i64; 4],
        dk: [i64; 4],
        dv: [i64; 4],
    }

    type Ptr = *mut c_void;

    #[repr(C)]
    struct RaggedPtrs {
        q_offsets: Ptr,
        kv_offsets: Ptr,
        seq_lens: Ptr,
    }

    extern "C" {
        fn lft_cudnn_load(path: *const c_char, err: *mut c_char, len: usize) -> i64;
        fn lft_cudnn_sdpa_workspace(
            d: *const SdpaDesc,
            backward: i32,
            stream: Ptr,
            bytes: *mut i64,
            err: *mut c_char,
            len: usize,
        ) -> i32;
        fn lft_cudnn_sdpa_forward(
            d: *const SdpaDesc,
            r: *const RaggedPtrs,
            stream: Ptr,
            q: Ptr,
            k: Ptr,
            v: Ptr,
            o: Ptr,
            stats: Ptr,
            workspace: Ptr,
            err: *mut c_char,
            len: usize,
        ) -> i32;
        fn lft_cudnn_sdpa_backward(
            d: *const SdpaDesc,
            r: *const RaggedPtrs,
            stream: Ptr,
            q: Ptr,
            k: Ptr,
            v: Ptr,
            o: Ptr,
            d_o: Ptr,
            stats: Ptr,
            dq: Ptr,
            dk: Ptr,
            dv: Ptr,
            workspace: Ptr,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }

    const ERR_LEN: usize = 1024;

    fn message(buf: &[u8]) -> String {
        CStr::from_bytes_until_nul(buf).map_or_else(|_| "?".into(), |m| m.to_string_lossy().into_owned())
    }

    static LOADED: OnceLock<std::result::Result<i64, String>> = OnceLock::new();

    fn load() -> &'static std::result::Result<i64, String> {
        LOADED.get_or_init(|| {
            let path = std::env::var("LORA_FT_CUDNN").unwrap_or_default();
            let c_path = CString::new(path).map_err(|e| e.to_string())?;
            let mut err = [0u8; ERR_LEN];
            let version = unsafe { lft_cudnn_load(c_path.as_ptr(), err.as_mut_ptr().cast(), ERR_LEN) };
            if version < 90000 {
                let why =
                    if version == 0 { message(&err) } else { format!("cuDNN {version} is older than 9.0") };
                tracing::info!("cuDNN not loaded ({why}): attention runs on the flash kernels");
                return Err(why);
            }
            tracing::info!("cuDNN {version} loaded: attention runs on its fused SDPA");
            Ok(version)
        })
    }

    /// cuDNN's version (e.g. 91900) when it loaded.
    pub fn version() -> Option<i64> {
        load().as_ref().ok().copied()
    }

    pub fn why_not() -> String {
        match load() {
            Ok(_) => "queries and keys differ in length, or cuDNN refused this kind of graph before".into(),
            Err(why) => why.clone(),
        }
    }

    fn strides(t: &Tensor) -> Result<[i64; 4]> {
        let (_, l) = t.storage_and_layout();
        let s = l.stride();
        if s.len() != 4 || s[3] != 1 || l.start_offset() % 8 != 0 || s[..3].iter().any(|x| x % 8 != 0) {
            bail!("cuDNN attention needs [b, h, rows, d] with unit, 16-byte aligned rows, got {s:?}");
        }
        Ok([s[0] as i64, s[1] as i64, s[2] as i64, 1])
    }

    /// (b, h, t, d) strides of `[b, t, h, d]` memory.
    fn thd_strides(h: usize, t: usize, d: usize) -> [i64; 4] {
        [(t * h * d) as i64, d as i64, (h * d) as i64, 1]
    }

    fn desc(q: &Tensor, k: &Tensor, rule: &Rule, ragged: Option<&Ragged>) -> Result<SdpaDesc> {
        let (b, h, t, d) = q.dims4()?;
        let kv = k.dim(1)?;
        let (batch, seq) = ragged.map_or((b, t), |r| (r.sequences, r.longest));
        Ok(SdpaDesc {
            batch: batch as i64,
            heads: h as i64,
            kv_heads: kv as i64,
            seq: seq as i64,
            ragged: ragged.map_or(0, |r| r.sequences as i64),
            head_dim: d as i64,
            bf16: i32::from(q.dtype() == DType::BF16),
            scale: rule.scale as f32,
            softcap: rule.softcap.unwrap_or(0.0) as f32,
            // a window as long as the sequence cuts nothing: the plain graph
            window: rule.window.filter(|&w| w < seq).unwrap_or(0) as i64,
            q: strides(q)?,
            k: strides(k)?,
            // the context is written as [b, t, h, d], the layout the output projection reads
            o: thd_strides(h, t, d),
            ..Default::default()
        })
    }

    /// The graph's workspace from the pool (counted like every other allocation), or the reason
    /// cuDNN refused the graph.
    fn workspace(
        dev: &candle_core::CudaDevice,
        d: &SdpaDesc,
        backward: bool,
    ) -> Result<std::result::Result<Option<CudaSlice<u8>>, String>> {
        let stream = dev.cuda_stream();
        let mut bytes = 0i64;
        let mut err = [0u8; ERR_LEN];
        let rc = unsafe {
            lft_cudnn_sdpa_workspace(
                d,
                i32::from(backward),
                stream.cu_stream() as Ptr,
                &mut bytes,
                err.as_mut_ptr().cast(),
                ERR_LEN,
            )
        };
        if rc != 0 {
            return Ok(Err(format!("cuDNN refused the graph: {}", message(&err))));
        }
        Ok(Ok(if bytes > 0 { Some(unsafe { dev.alloc::<u8>(bytes as usize)? }) } else { None }))
    }

    fn check(rc: i32, err: &[u8], what: &str) -> Result<()> {
        if rc != 0 {
            bail!("cuDNN attention {what}: {}", message(err));
        }
        Ok(())
    }

    pub type Outcome<T> = Result<std::result::Result<T, String>>;

    /// The device address of `t`'s first element. The caller holds `t` (and so its memory) across
    /// the call, and everything runs on the device's one stream, so no guard outlives this.
    fn address<T: CudaDType>(t: &Tensor, stream: &Arc<CudaStream>) -> Result<Ptr> {
        let (storage, _) = t.storage_and_layout();
        let v = view::<T>(&storage, t)?;
        let (p, _sync) = v.device_ptr(stream);
        Ok(p as Ptr)
    }

    fn slice_address<T>(x: &CudaSlice<T>, stream: &Arc<CudaStream>) -> Ptr {
        x.device_ptr(stream).0 as Ptr
    }

    pub fn forward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        rule: &Rule,
        r: Option<&Ragged>,
    ) -> Outcome<(Tensor, Tensor)> {
        match q.dtype() {
            DType::F16 => forward_typed::<f16>(q, k, v, rule, r),
            DType::BF16 => forward_typed::<bf16>(q, k, v, rule, r),
            dt => bail!("cuDNN attention takes f16 or bf16, not {dt:?}"),
        }
    }

    /// `x` itself where cuDNN can read its strides (a `[b, t, h, d]` view included), else a copy;
    /// for packed rows always the `[b, h, t, d]` view of `[b, t, h, d]` memory.
    fn readable(x: &Tensor, ragged: bool) -> Result<Tensor> {
        if ragged {
            let thd = x.transpose(1, 2)?;
            return match thd.is_contiguous() && strides(x).is_ok() {
                true => Ok(x.clone()),
                false => thd.contiguous()?.transpose(1, 2),
            };
        }
        if strides(x).is_ok() {
            return Ok(x.clone());
        }
        x.contiguous()
    }

    /// The device addresses of a packed call's columns (held by the caller across the call).
    fn ragged_ptrs(r: Option<&Ragged>, stream: &Arc<CudaStream>) -> Result<Option<RaggedPtrs>> {
        let Some(r) = r else { return Ok(None) };
        Ok(Some(RaggedPtrs {
            q_offsets: address::<i32>(r.q_offsets, stream)?,
            kv_offsets: address::<i32>(r.kv_offsets, stream)?,
            seq_lens: address::<i32>(r.seq_lens, stream)?,
        }))
    }

    fn forward_typed<T: CudaDType + WithDType + DeviceRepr>(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        rule: &Rule,
        r: Option<&Ragged>,
    ) -> Outcome<(Tensor, Tensor)> {
        let packed = r.is_some();
        let (q, k, v) = (readable(q, packed)?, readable(k, packed)?, readable(v, packed)?);
        let mut d = desc(&q, &k, rule, r)?;
        d.v = strides(&v)?;
        let dev = cuda_device(&q)?;
        let ws = match workspace(&dev, &d, false)? {
            Ok(ws) => ws,
            Err(why) => return Ok(Err(why)),
        };
        let (b, h, t, hd) = q.dims4()?;
        let stream = dev.cuda_stream();
        let out = unsafe { dev.alloc::<T>(b * h * t * hd)? };
        let stats_shape = [d.batch as usize, h, d.seq as usize];
        let stats = unsafe { dev.alloc::<f32>(stats_shape.iter().product())? };
        let rp = ragged_ptrs(r, &stream)?;
        let rp = rp.as_ref().map_or(std::ptr::null(), |p| p as *const RaggedPtrs);
        let mut err = [0u8; ERR_LEN];
        let (qp, kp, vp) =
            (address::<T>(&q, &stream)?, address::<T>(&k, &stream)?, address::<T>(&v, &stream)?);
        let (op, sp) = (slice_address(&out, &stream), slice_address(&stats, &stream));
        let wp = ws.as_ref().map_or(std::ptr::null_mut(), |w| slice_address(w, &stream));
        let (s, e) = (stream.cu_stream() as Ptr, err.as_mut_ptr().cast());
        let rc = unsafe { lft_cudnn_sdpa_forward(&d, rp, s, qp, kp, vp, op, sp, wp, e, ERR_LEN) };
        check(rc, &err, "forward")?;
        drop(ws);
        let context = wrap(out, &dev, &[b, t, h, hd]).transpose(1, 2)?;
        Ok(Ok((context, wrap(stats, &dev, &stats_shape))))
    }

    pub fn backward(
        qkv: (&Tensor, &Tensor, &Tensor),
        saved: (&Tensor, &Tensor),
        d_context: &Tensor,
        rule: &Rule,
        r: Option<&Ragged>,
    ) -> Outcome<(Tensor, Tensor, Tensor)> {
        match qkv.0.dtype() {
            DType::F16 => backward_typed::<f16>(qkv, saved, d_context, rule, r),
            DType::BF16 => backward_typed::<bf16>(qkv, saved, d_context, rule, r),
            dt => bail!("cuDNN attention takes f16 or bf16, not {dt:?}"),
        }
    }

    fn backward_typed<T: CudaDType + WithDType + DeviceRepr>(
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        (context, stats): (&Tensor, &Tensor),
        d_context: &Tensor,
        rule: &Rule,
        r: Option<&Ragged>,
    ) -> Outcome<(Tensor, Tensor, Tensor)> {
        let packed = r.is_some();
        let (q, k, v, stats) =
            (readable(q, packed)?, readable(k, packed)?, readable(v, packed)?, stats.contiguous()?);
        let (context, d_context) = (readable(context, packed)?, readable(d_context, packed)?);
        let (b, h, t, hd) = q.dims4()?;
        let kvh = k.dim(1)?;
        let mut d = desc(&q, &k, rule, r)?;
        d.v = strides(&v)?;
        d.o = strides(&context)?;
        d.d_o = strides(&d_context)?;
        // gradients in the projections' [b, t, h, d] layout, returned as [b, h, t, d] views
        d.dq = thd_strides(h, t, hd);
        d.dk = thd_strides(kvh, t, hd);
        d.dv = d.dk;
        let dev = cuda_device(&q)?;
        let ws = match workspace(&dev, &d, true)? {
            Ok(ws) => ws,
            Err(why) => return Ok(Err(why)),
        };
        let stream = dev.cuda_stream();
        let dq = unsafe { dev.alloc::<T>(b * h * t * hd)? };
        let dk = unsafe { dev.alloc::<T>(b * kvh * t * hd)? };
        let dv = unsafe { dev.alloc::<T>(b * kvh * t * hd)? };
        let mut err = [0u8; ERR_LEN];
        let (qp, kp, vp) =
            (address::<T>(&q, &stream)?, address::<T>(&k, &stream)?, address::<T>(&v, &stream)?);
        let (op, dop) = (address::<T>(&context, &stream)?, address::<T>(&d_context, &stream)?);
        let sp = address::<f32>(&stats, &stream)?;
        let [dqp, dkp, dvp] = [&dq, &dk, &dv].map(|x| slice_address(x, &stream));
        let wp = ws.as_ref().map_or(std::ptr::null_mut(), |w| slice_address(w, &stream));
        let (s, e) = (stream.cu_stream() as Ptr, err.as_mut_ptr().cast());
        let rp = ragged_ptrs(r, &stream)?;
        let rp = rp.as_ref().map_or(std::ptr::null(), |p| p as *const RaggedPtrs);
        let rc = unsafe {
            lft_cudnn_sdpa_backward(&d, rp, s, qp, kp, vp, op, dop, sp, dqp, dkp, dvp, wp, e, ERR_LEN)
        };
        check(rc, &err, "backward")?;
        drop(ws);
        let heads = |x, n| wrap(x, &dev, &[b, t, n, hd]).transpose(1, 2);
        Ok(Ok((heads(dq, h)?, heads(dk, kvh)?, heads(dv, kvh)?)))
    }
}

/// Built without the cuDNN headers (`CUDNN_INCLUDE` unset): the flash kernels only.
#[cfg(not(lora_ft_cudnn))]
mod ffi {
    use candle_core::{Result, Tensor};

    use super::{Ragged, Rule};

    pub type Outcome<T> = Result<std::result::Result<T, String>>;

    pub fn version() -> Option<i64> {
        None
    }

    pub fn why_not() -> String {
        "this binary was built without the cuDNN headers".into()
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
