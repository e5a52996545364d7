//! cuDNN's fused SDPA through `cudnn_sdpa.cpp` (built when the cuDNN headers are found): the
//! descriptors, the library's loading and the calls, for `cudnn_sdpa.rs`.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, DType, Result, Tensor, WithDType};
use half::{bf16, f16};

use super::rule::{Ragged, Rule};
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
    total_tokens: i64,
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
    fn lft_cudnn_sdpa_graph_builds(builds: *mut u64, seconds: *mut f64);
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
            let why = if version == 0 { message(&err) } else { format!("cuDNN {version} is older than 9.0") };
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

/// The graphs built so far (each shape's forward and backward once) and the host seconds that took.
pub fn graph_builds() -> (u64, f64) {
    let (mut builds, mut seconds) = (0u64, 0f64);
    unsafe { lft_cudnn_sdpa_graph_builds(&mut builds, &mut seconds) };
    (builds, seconds)
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
        // packed rows: every token of the batch, which bounds cuDNN's workspace (not
        // sequences x longest)
        total_tokens: ragged.map_or(0, |_| (b * t) as i64),
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
    let (qp, kp, vp) = (address::<T>(&q, &stream)?, address::<T>(&k, &stream)?, address::<T>(&v, &stream)?);
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
    let (qp, kp, vp) = (address::<T>(&q, &stream)?, address::<T>(&k, &stream)?, address::<T>(&v, &stream)?);
    let (op, dop) = (address::<T>(&context, &stream)?, address::<T>(&d_context, &stream)?);
    let sp = address::<f32>(&stats, &stream)?;
    let [dqp, dkp, dvp] = [&dq, &dk, &dv].map(|x| slice_address(x, &stream));
    let wp = ws.as_ref().map_or(std::ptr::null_mut(), |w| slice_address(w, &stream));
    let (s, e) = (stream.cu_stream() as Ptr, err.as_mut_ptr().cast());
    let rp = ragged_ptrs(r, &stream)?;
    let rp = rp.as_ref().map_or(std::ptr::null(), |p| p as *const RaggedPtrs);
    let rc =
        unsafe { lft_cudnn_sdpa_backward(&d, rp, s, qp, kp, vp, op, dop, sp, dqp, dkp, dvp, wp, e, ERR_LEN) };
    check(rc, &err, "backward")?;
    drop(ws);
    let heads = |x, n| wrap(x, &dev, &[b, t, n, hd]).transpose(1, 2);
    Ok(Ok((heads(dq, h)?, heads(dk, kvh)?, heads(dv, kvh)?)))
}
