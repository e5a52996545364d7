//! The fused cross-entropy of `kernels/cross_entropy.cu` (CUDA only). `loss.rs` calls it for
//! CUDA logits and keeps the composed ops as the CPU path and the tests' reference.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, DType, Result, Tensor, WithDType};

use crate::cuda::{blocks, by_dtype, cuda_device, suffix, view, wrap};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/cross_entropy.ptx"));
const MODULE: &str = "lora_ft_cross_entropy";
const THREADS: u32 = 512;

/// logits `[rows, vocab]`, targets `[rows]` u32 → per-row losses `[rows]` (f32) and, with
/// `grad_scale`, d(grad_scale · Σ loss)/d(logits) in the logits' dtype.
pub fn cross_entropy_rows(
    logits: &Tensor,
    targets: &Tensor,
    grad_scale: Option<f64>,
) -> Result<(Tensor, Option<Tensor>)> {
    by_dtype!(logits.dtype(), rows_typed(logits, targets, grad_scale))
}

fn rows_typed<T: CudaDType + WithDType + DeviceRepr>(
    logits: &Tensor,
    targets: &Tensor,
    grad_scale: Option<f64>,
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
    let func =
        dev.get_or_load_custom_func(&format!("cross_entropy_rows_{}", suffix(T::DTYPE)?), MODULE, PTX)?;
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
        l.arg(&vocab_i).arg(&scale);
        unsafe { l.launch(blocks(rows, THREADS)) }.w()?;
    }
    let d_logits = d_logits.map(|d| wrap(d, &dev, &[rows, vocab]));
    Ok((wrap(loss, &dev, &[rows]), d_logits))
}
