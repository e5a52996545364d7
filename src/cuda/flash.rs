//! The FlashAttention-style kernels of `src/cuda/flash_attention.cu` (CUDA only; f16/bf16, head_dim
//! 64 or 128). Scores never reach global memory: the forward returns the context and the row
//! log-sum-exp, and the backward recomputes the probabilities from them. `attention.rs` keeps the
//! composed chunked version as the CPU path, the f32 path and the tests' reference.
//!
//! Packed rows (`data.packing`) pass their spans (`PackedRows::token_spans`): each token's
//! sequence as (start, end) within its row. Attention then stays inside each sequence, and the
//! kernels skip every tile of keys outside the sequences of its queries.

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC_SMEM;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaView, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use std::cell::Cell;
use std::thread::LocalKey;

use candle_core::{bail, DType, Result, Tensor, WithDType};
use half::{bf16, f16};

use crate::cuda::{blocks, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("flash_attention");
const THREADS: u32 = 128;
/// Query rows per forward block (4 warps × 32).
const BLOCK_ROWS: usize = 128;
/// Keys per shared-memory stage of the forward (`KV_TILE`); the backward's threads and query
/// rows per step (`BWD_THREADS`, `BWD_Q`); the smem row padding (`PAD`) of the .cu file.
const KV_TILE: usize = 32;
const BWD_THREADS: u32 = 256;
const BWD_Q: usize = 64;
const PAD: usize = 8;

/// The backward kernel's two shapes (flash_attention.cu): 128 keys a block with Q and dO
/// double-buffered where a block may take ~180 KiB of shared memory (H100, A100), 64 keys
/// single-buffered where it may take ~100 KiB (RTX 3090/4090, A6000, L40S).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackwardShape {
    Keys128,
    Keys64,
}

impl BackwardShape {
    #[cfg(test)]
    pub const ALL: [BackwardShape; 2] = [BackwardShape::Keys128, BackwardShape::Keys64];

    fn keys(self) -> usize {
        match self {
            BackwardShape::Keys128 => 128,
            BackwardShape::Keys64 => 64,
        }
    }

    fn stages(self) -> usize {
        match self {
            BackwardShape::Keys128 => 2,
            BackwardShape::Keys64 => 1,
        }
    }

    /// Dynamic shared memory: the block's K and V, the stages of Q and dO rows, P^T and dS^T
    /// (16-bit), then the stages' lse, delta (f32) and first visible keys (i32).
    fn smem_bytes(self, head_dim: usize) -> u32 {
        let (keys, stages) = (self.keys(), self.stages());
        let tiles = (2 * keys + stages * 2 * BWD_Q) * (head_dim + PAD) + 2 * keys * (BWD_Q + PAD);
        (tiles * 2 + stages * 3 * BWD_Q * 4) as u32
    }

    /// The larger shape where the device's per-block shared memory allows it.
    fn for_device(dev: &candle_core::cuda_backend::CudaDevice, head_dim: usize) -> Result<Self> {
        use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
        let limit = dev.cuda_stream().context().attribute(OPTIN).w()?;
        let big = BackwardShape::Keys128;
        Ok(if big.smem_bytes(head_dim) as i64 <= limit as i64 { big } else { BackwardShape::Keys64 })
    }
}

/// Dynamic shared memory of the forward: the block's Q rows and two stages of a K and a V tile
/// (16-bit).
fn forward_bytes(head_dim: usize) -> u32 {
    ((BLOCK_ROWS + 2 * 2 * KV_TILE) * (head_dim + PAD) * 2) as u32
}

/// Lets `func` take `bytes` of dynamic shared memory (past the 48 KiB default).
fn allow_smem(func: &CudaFunction, bytes: u32) -> Result<()> {
    func.set_attribute(MAX_DYNAMIC_SMEM, bytes as i32).w()
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Dims {
    batch: i32,
    heads: i32,
    kv_heads: i32,
    q_len: i32,
    kv_len: i32,
    q_pos0: i32,
    window: i32,
    scale_log2: f32,
}
unsafe impl DeviceRepr for Dims {}

/// Element strides of a `[b, h, rows, d]` tensor (unit stride along d).
#[repr(C)]
#[derive(Clone, Copy)]
struct Strides {
    b: i64,
    h: i64,
    row: i64,
}
unsafe impl DeviceRepr for Strides {}

/// Whether the kernels take these tensors: CUDA, f16 or bf16, head_dim 64 or 128.
pub fn supported(q: &Tensor) -> bool {
    q.device().is_cuda()
        && matches!(q.dtype(), DType::F16 | DType::BF16)
        && matches!(q.dims().last(), Some(64 | 128))
}

fn strides(t: &Tensor) -> Result<Strides> {
    let (_, l) = t.storage_and_layout();
    let s = l.stride();
    if s.len() != 4 || s[3] != 1 || l.start_offset() % 8 != 0 || s[..3].iter().any(|x| x % 8 != 0) {
        bail!("flash attention needs [b, h, rows, d] with unit, 16-byte aligned rows, got {:?}", s);
    }
    Ok(Strides { b: s[0] as i64, h: s[1] as i64, row: s[2] as i64 })
}

fn dims(q: &Tensor, k: &Tensor, window: Option<usize>) -> Result<Dims> {
    let (b, h, t, d) = q.dims4()?;
    let (kb, kv, s, kd) = k.dims4()?;
    if kb != b || kd != d || kv == 0 || h % kv != 0 || t > s {
        bail!("flash attention: q {:?} and k {:?} do not match", q.dims(), k.dims());
    }
    let scale_log2 = (1.0 / (d as f64).sqrt() * std::f64::consts::LOG2_E) as f32;
    let window = window.map_or(0, |w| w as i32);
    let i = |x: usize| x as i32;
    Ok(Dims {
        batch: i(b),
        heads: i(h),
        kv_heads: i(kv),
        q_len: i(t),
        kv_len: i(s),
        q_pos0: i(s - t),
        window,
        scale_log2,
    })
}

// Forward and backward launches that took packed rows' spans: the tests read them to know that
// the flash kernels, not the composed path, ran a packed batch.
thread_local! {
    /// Per thread: tests running side by side count their own.
    static PACKED_FORWARDS: Cell<usize> = const { Cell::new(0) };
    static PACKED_BACKWARDS: Cell<usize> = const { Cell::new(0) };
}

/// How many (forward, backward) launches took packed rows so far on this thread.
pub fn packed_launches() -> (usize, usize) {
    (PACKED_FORWARDS.get(), PACKED_BACKWARDS.get())
}

/// Packed rows' spans (`[b · t, 2]` i32, `PackedRows::token_spans`) checked against q `[b, h,
/// t, d]` and k `[b, kv, s, d]`: packed rows attend within the row, so t = s.
fn check_spans(spans: &Tensor, q: &Tensor, k: &Tensor) -> Result<()> {
    let (b, _, t, _) = q.dims4()?;
    let s = k.dim(2)?;
    if spans.dtype() != DType::I32 || spans.dims() != [b * t, 2] || t != s || !spans.is_contiguous() {
        bail!(
            "flash attention: packed rows' spans {:?} {:?} do not fit q {:?} and k {:?}",
            spans.dtype(),
            spans.dims(),
            q.dims(),
            k.dims()
        );
    }
    Ok(())
}

/// The spans' device memory, or none: the kernels take a null pointer for rows of one sequence.
enum SpansArg<'a> {
    Packed(CudaView<'a, i32>),
    None(u64),
}

impl SpansArg<'_> {
    /// Pushes the argument; a packed launch adds one to `count`.
    fn push<'b>(&'b self, l: &mut LaunchArgs<'b>, count: &'static LocalKey<Cell<usize>>) {
        match self {
            SpansArg::Packed(view) => {
                count.set(count.get() + 1);
                l.arg(view);
            }
            SpansArg::None(null) => {
                l.arg(null);
            }
        }
    }
}

/// The kernels' name ending: packed rows have their own instantiation.
fn packed_tail(spans: Option<&Tensor>) -> &'static str {
    if spans.is_some() {
        "_packed"
    } else {
        ""
    }
}

fn grid(rows: usize, heads: usize, batch: usize, shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(BLOCK_ROWS) as u32, heads as u32, batch as u32),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes,
    }
}

/// q `[b, h, t, d]`, k/v `[b, kv, s, d]` → (context `[b, h, t, d]` (a view of `[b, t, h, d]`),
/// lse `[b, h, t]` f32 in log2 units). `spans`: packed rows' (`PackedRows::token_spans`), or
/// `None` for rows of one sequence.
pub fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    spans: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    match q.dtype() {
        DType::F16 => forward_typed::<f16>(q, k, v, window, spans),
        DType::BF16 => forward_typed::<bf16>(q, k, v, window, spans),
        dt => bail!("flash attention takes f16 or bf16, not {dt:?}"),
    }
}

fn forward_typed<T: CudaDType + WithDType + DeviceRepr>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    spans: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let d = dims(&q, &k, window)?;
    if let Some(spans) = spans {
        check_spans(spans, &q, &k)?;
    }
    let (sq, sk) = (strides(&q)?, strides(&k)?);
    let dev = cuda_device(&q)?;
    let (b, h, t, hd) = q.dims4()?;
    let out = unsafe { dev.alloc::<T>(b * h * t * hd)? };
    let lse = unsafe { dev.alloc::<f32>(b * h * t)? };
    // The context is written as [b, t, h, d], the layout the output projection reads, and
    // returned as its [b, h, t, d] view: flattening it back costs no copy.
    let so = Strides { b: (t * h * hd) as i64, h: hd as i64, row: (h * hd) as i64 };
    let smem = forward_bytes(hd);
    let tail = packed_tail(spans);
    let func = KERNELS.function(&dev, &format!("flash_forward_{}_{hd}{tail}", suffix(T::DTYPE)?))?;
    allow_smem(&func, smem)?;
    {
        let (qs, ks, vs) = (q.storage_and_layout().0, k.storage_and_layout().0, v.storage_and_layout().0);
        let (qv, kv, vv) = (view::<T>(&qs, &q)?, view::<T>(&ks, &k)?, view::<T>(&vs, &v)?);
        let spans_storage = spans.map(|s| s.storage_and_layout().0);
        let spans_arg = match (&spans_storage, spans) {
            (Some(storage), Some(s)) => SpansArg::Packed(view::<i32>(storage, s)?),
            _ => SpansArg::None(0),
        };
        let mut l = func.builder();
        l.arg(&qv).arg(&kv).arg(&vv).arg(&out).arg(&lse).arg(&d).arg(&sq).arg(&sk).arg(&so);
        spans_arg.push(&mut l, &PACKED_FORWARDS);
        unsafe { l.launch(grid(t, h, b, smem)) }.w()?;
    }
    Ok((wrap(out, &dev, &[b, t, h, hd]).transpose(1, 2)?, wrap(lse, &dev, &[b, h, t])))
}

/// Given the forward's inputs, its context and lse, and d(context), returns (dq, dk, dv) with dk
/// and dv already summed over the query heads of each kv head. `spans`: as the forward's.
/// `shape`: the backward kernel's, or `None` for the larger one the device's shared memory
/// allows (the tests run both).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    context: &Tensor,
    lse: &Tensor,
    d_context: &Tensor,
    (window, spans): (Option<usize>, Option<&Tensor>),
    shape: Option<BackwardShape>,
) -> Result<(Tensor, Tensor, Tensor)> {
    match q.dtype() {
        DType::F16 => backward_typed::<f16>(q, k, v, context, lse, d_context, (window, spans), shape),
        DType::BF16 => backward_typed::<bf16>(q, k, v, context, lse, d_context, (window, spans), shape),
        dt => bail!("flash attention takes f16 or bf16, not {dt:?}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn backward_typed<T: CudaDType + WithDType + DeviceRepr>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    context: &Tensor,
    lse: &Tensor,
    d_context: &Tensor,
    (window, spans): (Option<usize>, Option<&Tensor>),
    shape: Option<BackwardShape>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (q, k, v, lse) = (q.contiguous()?, k.contiguous()?, v.contiguous()?, lse.contiguous()?);
    let d = dims(&q, &k, window)?;
    if let Some(spans) = spans {
        check_spans(spans, &q, &k)?;
    }
    let (sq, sk, so, sdo) = (strides(&q)?, strides(&k)?, strides(context)?, strides(d_context)?);
    let dev = cuda_device(&q)?;
    let (b, h, t, hd) = q.dims4()?;
    let (_, kvh, s, _) = k.dims4()?;
    let suffix = suffix(T::DTYPE)?;
    let delta = unsafe { dev.alloc::<f32>(b * h * t)? };
    let dq = unsafe { dev.alloc::<T>(b * h * t * hd)? };
    // dQ gathers one contribution per key block, in any order: f32 atomics, zero to start.
    let dq_acc = dev.alloc_zeros::<f32>(b * h * t * hd)?;
    let dk = unsafe { dev.alloc::<T>(b * kvh * s * hd)? };
    let dv = unsafe { dev.alloc::<T>(b * kvh * s * hd)? };
    let sdq = Strides { b: (h * t * hd) as i64, h: (t * hd) as i64, row: hd as i64 };
    let sdk = Strides { b: (kvh * s * hd) as i64, h: (s * hd) as i64, row: hd as i64 };
    {
        let guards = [&q, &k, &v, context, &lse, d_context].map(|x| x.storage_and_layout().0);
        let qv = view::<T>(&guards[0], &q)?;
        let kv = view::<T>(&guards[1], &k)?;
        let vv = view::<T>(&guards[2], &v)?;
        let ov = view::<T>(&guards[3], context)?;
        let lv = view::<f32>(&guards[4], &lse)?;
        let dov = view::<T>(&guards[5], d_context)?;
        let spans_storage = spans.map(|s| s.storage_and_layout().0);
        let spans_arg = match (&spans_storage, spans) {
            (Some(storage), Some(s)) => SpansArg::Packed(view::<i32>(storage, s)?),
            _ => SpansArg::None(0),
        };

        let rows = b * h * t;
        let delta_fn = KERNELS.function(&dev, &format!("attention_delta_{suffix}"))?;
        let hd_i = hd as i32;
        let mut l = delta_fn.builder();
        l.arg(&ov).arg(&dov).arg(&delta).arg(&d).arg(&hd_i).arg(&so).arg(&sdo);
        unsafe { l.launch(blocks(rows.div_ceil(THREADS as usize / 32), THREADS)) }.w()?;

        let shape = match shape {
            Some(shape) => shape,
            None => BackwardShape::for_device(&dev, hd)?,
        };
        let (keys, smem) = (shape.keys(), shape.smem_bytes(hd));
        let name = format!("flash_backward_{suffix}_{hd}_k{keys}{}", packed_tail(spans));
        let bwd_fn = KERNELS.function(&dev, &name)?;
        allow_smem(&bwd_fn, smem)?;
        let mut l = bwd_fn.builder();
        l.arg(&qv).arg(&kv).arg(&vv).arg(&dov).arg(&lv).arg(&delta).arg(&dk).arg(&dv).arg(&dq_acc);
        l.arg(&d).arg(&sq).arg(&sk).arg(&sdo).arg(&sdk);
        spans_arg.push(&mut l, &PACKED_BACKWARDS);
        let cfg = LaunchConfig {
            grid_dim: (s.div_ceil(keys) as u32, kvh as u32, b as u32),
            block_dim: (BWD_THREADS, 1, 1),
            shared_mem_bytes: smem,
        };
        unsafe { l.launch(cfg) }.w()?;

        let finish_fn = KERNELS.function(&dev, &format!("attention_dq_finish_{suffix}"))?;
        let mut l = finish_fn.builder();
        l.arg(&dq_acc).arg(&dq).arg(&d).arg(&hd_i).arg(&sdq);
        unsafe { l.launch(blocks((rows * hd / 2).div_ceil(256), 256)) }.w()?;
    }
    Ok((wrap(dq, &dev, &[b, h, t, hd]), wrap(dk, &dev, &[b, kvh, s, hd]), wrap(dv, &dev, &[b, kvh, s, hd])))
}
