//! LoRA dropout on the GPU (dropout.cu): the same counter-based mask as the CPU path.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, DType, Result, Tensor, WithDType};
use half::{bf16, f16};

use super::{blocks, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("dropout");
const THREADS: u32 = 256;

pub fn dropout(x: &Tensor, seed: u64, drop_below: u32, keep_scale: f32) -> Result<Tensor> {
    match x.dtype() {
        DType::F32 => typed::<f32>(x, seed, drop_below, keep_scale),
        DType::F16 => typed::<f16>(x, seed, drop_below, keep_scale),
        DType::BF16 => typed::<bf16>(x, seed, drop_below, keep_scale),
        dt => bail!("dropout takes f32, f16 or bf16, not {dt:?}"),
    }
}

fn typed<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    seed: u64,
    below: u32,
    scale: f32,
) -> Result<Tensor> {
    let x = x.contiguous()?;
    let n = x.elem_count();
    let dev = cuda_device(&x)?;
    let out = unsafe { dev.alloc::<T>(n)? };
    let func = KERNELS.function(&dev, &format!("dropout_{}", suffix(T::DTYPE)?))?;
    {
        let guard = x.storage_and_layout().0;
        let xv = view::<T>(&guard, &x)?;
        let n_i = n as i64;
        let mut l = func.builder();
        l.arg(&xv).arg(&out).arg(&n_i).arg(&seed).arg(&below).arg(&scale);
        let grid = n.div_ceil(THREADS as usize).clamp(1, 65_535);
        unsafe { l.launch(blocks(grid, THREADS)) }.w()?;
    }
    Ok(wrap(out, &dev, x.dims()))
}
