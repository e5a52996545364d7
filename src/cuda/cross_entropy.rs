//! The fused cross-entropy of `cross_entropy.cu` (CUDA only): `cross_entropy_rows` for logits on
//! the device (`model::ops::loss` keeps the composed ops as the CPU path and the tests'
//! reference), and `OnlineSoftmax`, the per-row state of the loss over a vocabulary that arrives
//! in chunks (`model::ops::lm_head`'s streamed lm_head): an online log-sum-exp.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, DType, Device, Result, Tensor, WithDType};

use super::{address, blocks, by_dtype, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("cross_entropy");
const THREADS: u32 = 512;
/// The online softmax's statistics and the gradient accumulator.
const STATS: DType = DType::F32;

/// `struct SoftCap` of the kernel: the cap and its inverse as candle's affine takes it.
#[repr(C)]
#[derive(Clone, Copy)]
struct SoftCap {
    inv_cap: f32,
    cap: f32,
}

// SAFETY: two f32, laid out as the kernel's struct.
unsafe impl DeviceRepr for SoftCap {}

/// logits `[rows, vocab]`, targets `[rows]` u32 → per-row losses `[rows]` (f32) and, with
/// `grad_scale`, d(grad_scale · Σ loss)/d(logits) in the logits' dtype; with `softcap`, of the
/// logits capped first (Gemma 2), the capped ones never written.
pub fn cross_entropy_rows(
    logits: &Tensor,
    targets: &Tensor,
    grad_scale: Option<f64>,
    softcap: Option<f64>,
) -> Result<(Tensor, Option<Tensor>)> {
    by_dtype!(logits.dtype(), rows_typed(logits, targets, grad_scale, softcap))
}

fn rows_typed<T: CudaDType + WithDType + DeviceRepr>(
    logits: &Tensor,
    targets: &Tensor,
    grad_scale: Option<f64>,
    softcap: Option<f64>,
) -> Result<(Tensor, Option<Tensor>)> {
    let (logits, targets) = (logits.contiguous()?, targets.contiguous()?);
    let (rows, vocab) = logits.dims2()?;
    if targets.dtype() != DType::U32 || targets.elem_count() != rows {
        bail!(
            "cross-entropy: {rows} rows need {rows} u32 targets, got {:?} {:?}",
            targets.dtype(),
            targets.dims()
        );
    }
    let dev = cuda_device(&logits)?;
    let loss = unsafe { dev.alloc::<f32>(rows)? };
    let d_logits = match grad_scale {
        Some(_) => Some(unsafe { dev.alloc::<T>(rows * vocab)? }),
        None => None,
    };
    let func = KERNELS.function(&dev, &format!("cross_entropy_rows_{}", suffix(T::DTYPE)?))?;
    {
        let (ls, ts) = (logits.storage_and_layout().0, targets.storage_and_layout().0);
        let (lv, tv) = (view::<T>(&ls, &logits)?, view::<u32>(&ts, &targets)?);
        let (vocab_i, scale) = (vocab as i32, grad_scale.unwrap_or(0.0) as f32);
        let mut l = func.builder();
        l.arg(&lv).arg(&tv).arg(&loss);
        let null = 0u64; // no gradient asked: the kernel stops after the loss
        match &d_logits {
            Some(d) => l.arg(d),
            None => l.arg(&null),
        };
        let cap = match softcap {
            Some(cap) => SoftCap { inv_cap: (1.0 / cap) as f32, cap: cap as f32 },
            None => SoftCap { inv_cap: 0.0, cap: 0.0 },
        };
        l.arg(&vocab_i).arg(&scale).arg(&cap);
        unsafe { l.launch(blocks(rows, THREADS)) }.w()?;
    }
    let d_logits = d_logits.map(|d| wrap(d, &dev, &[rows, vocab]));
    Ok((wrap(loss, &dev, &[rows]), d_logits))
}

/// The online softmax's per-row state, and the f32 gradient accumulator when one is asked.
pub struct OnlineSoftmax {
    max: Tensor,
    sum: Tensor,
    z_target: Tensor,
    alpha: Tensor,
    acc: Option<Tensor>,
}

impl OnlineSoftmax {
    /// The state of `n` rows (`hidden` wide); with `grads`, the gradient accumulator too.
    pub fn new(n: usize, hidden: usize, grads: bool, device: &Device) -> Result<Self> {
        Ok(Self {
            max: Tensor::full(f32::NEG_INFINITY, n, device)?,
            sum: Tensor::zeros(n, STATS, device)?,
            z_target: Tensor::zeros(n, STATS, device)?,
            alpha: Tensor::zeros(n, STATS, device)?,
            acc: if grads { Some(Tensor::zeros((n, hidden), STATS, device)?) } else { None },
        })
    }

    /// Folds in the logits of vocabulary rows `start..start + w.rows` (hidden rows `hs`,
    /// targets `tgt`): the target logit where it falls in the chunk, the running max and sum,
    /// and the accumulator rescaled by exp(m_old − m_new) plus Σ exp(z − m_new)·w.
    pub fn add_chunk(&self, hs: &Tensor, w: &Tensor, tgt: &Tensor, start: usize) -> Result<()> {
        let logits = hs.matmul(&w.t()?)?.contiguous()?;
        by_dtype!(logits.dtype(), chunk_typed(self, &logits, w, tgt, start))
    }

    /// Each row's loss, log Σ exp − z_target (f32).
    pub fn loss(&self) -> Result<Tensor> {
        let dev = cuda_device(&self.max)?;
        let n = self.max.elem_count();
        let loss = Tensor::zeros(n, STATS, &self.max.device().clone())?;
        let stream = dev.cuda_stream();
        let func = KERNELS.function(&dev, "streamed_loss")?;
        let ptr = |t: &Tensor| address(t, &stream);
        let (m, s, z, out, rows) =
            (ptr(&self.max)?, ptr(&self.sum)?, ptr(&self.z_target)?, ptr(&loss)?, n as i32);
        let mut l = func.builder();
        l.arg(&m).arg(&s).arg(&z).arg(&out).arg(&rows);
        unsafe { l.launch(blocks(n.div_ceil(256), 256)) }.w()?;
        Ok(loss)
    }

    /// d(grad_scale · Σ loss)/d(hidden rows): (acc / sum − w_target) · grad_scale, in the
    /// weights' dtype.
    pub fn d_rows(&self, w_target: &Tensor, grad_scale: f64) -> Result<Tensor> {
        by_dtype!(w_target.dtype(), finish_typed(self, w_target, grad_scale))
    }
}

fn chunk_typed<T: CudaDType + WithDType + DeviceRepr>(
    stats: &OnlineSoftmax,
    logits: &Tensor,
    w: &Tensor,
    tgt: &Tensor,
    start: usize,
) -> Result<()> {
    let dev = cuda_device(logits)?;
    let stream = dev.cuda_stream();
    let (n, chunk) = logits.dims2()?;
    let sfx = suffix(T::DTYPE)?;
    let ptr = |t: &Tensor| address(t, &stream);
    let (lg, tg, z) = (ptr(logits)?, ptr(tgt)?, ptr(&stats.z_target)?);
    let (start, chunk_i, rows) = (start as i32, chunk as i32, n as i32);
    let func = KERNELS.function(&dev, &format!("target_logit_{sfx}"))?;
    let mut l = func.builder();
    l.arg(&lg).arg(&tg).arg(&z).arg(&start).arg(&chunk_i).arg(&rows);
    unsafe { l.launch(blocks(n.div_ceil(256), 256)) }.w()?;

    let (m, s, a, write_exp) =
        (ptr(&stats.max)?, ptr(&stats.sum)?, ptr(&stats.alpha)?, stats.acc.is_some() as i32);
    let func = KERNELS.function(&dev, &format!("online_softmax_chunk_{sfx}"))?;
    let mut l = func.builder();
    l.arg(&lg).arg(&m).arg(&s).arg(&a).arg(&chunk_i).arg(&write_exp);
    unsafe { l.launch(blocks(n, THREADS)) }.w()?;

    let Some(acc) = &stats.acc else { return Ok(()) };
    let part = logits.matmul(w)?.contiguous()?; // Σ_v exp(z_v − m_new) · w_v
    let (ac, pt, len, cols) = (ptr(acc)?, ptr(&part)?, part.elem_count() as i64, part.dim(1)? as i32);
    let func = KERNELS.function(&dev, &format!("rescale_add_{sfx}"))?;
    let mut l = func.builder();
    l.arg(&ac).arg(&pt).arg(&a).arg(&len).arg(&cols);
    unsafe { l.launch(elementwise(part.elem_count())) }.w()?;
    Ok(())
}

fn finish_typed<T: CudaDType + WithDType + DeviceRepr>(
    stats: &OnlineSoftmax,
    w_target: &Tensor,
    grad_scale: f64,
) -> Result<Tensor> {
    let Some(acc) = &stats.acc else { bail!("the streamed loss kept no gradient") };
    let dev = cuda_device(acc)?;
    let stream = dev.cuda_stream();
    let d_rows = Tensor::zeros(acc.shape(), T::DTYPE, acc.device())?;
    let ptr = |t: &Tensor| address(t, &stream);
    let (ac, wt, s, out) = (ptr(acc)?, ptr(w_target)?, ptr(&stats.sum)?, ptr(&d_rows)?);
    let (len, cols, scale) = (acc.elem_count() as i64, acc.dim(1)? as i32, grad_scale as f32);
    let func = KERNELS.function(&dev, &format!("streamed_finish_{}", suffix(T::DTYPE)?))?;
    let mut l = func.builder();
    l.arg(&ac).arg(&wt).arg(&s).arg(&out).arg(&len).arg(&cols).arg(&scale);
    unsafe { l.launch(elementwise(acc.elem_count())) }.w()?;
    Ok(d_rows)
}

fn elementwise(len: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    blocks(len.div_ceil(256).min(65535 * 4), 256)
}
