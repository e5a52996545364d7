//! The optimizer's CUDA kernels (`adafactor.cu`, a fatbin from build.rs): the Adafactor step
//! and the gradient norm over all parameters in one launch each. The composed tensor ops in
//! `adafactor.rs` and `clip.rs` stay the CPU path and the tests' reference.
//!
//! The kernels update the parameters and the optimizer state in place, through their device
//! addresses, as `Var::set` does: every tensor handed in must stay alive until the launch is queued
//! (the callers hold them), and the launches are ordered on the device's one stream.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CudaDevice, DType, Device, Result, Tensor};

use super::suffix;

pub static KERNELS: super::module::Kernels = super::module::kernels!("adafactor");
const THREADS: u32 = 512;
/// The kernel keeps the sums over the smaller dim in shared memory (`MAX_SMALL` in the .cu).
const MAX_SMALL: usize = 1024;

/// One parameter's device buffers: `p` and `g` `[n, m]`, the factored second moment `row`
/// (n values) and `col` (m values), and hf's first moment when beta1 is set.
pub struct FusedParam<'a> {
    pub p: &'a Tensor,
    pub g: &'a Tensor,
    pub row: &'a Tensor,
    pub col: &'a Tensor,
    pub exp_avg: Option<&'a Tensor>,
}

/// The step's scalars, laid out as `struct Hyper` in the kernel (`optim::adafactor` derives them
/// from the config and the step).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Hyper {
    pub hf: i32,
    pub grad_mult: f32,
    pub w: f32,
    pub one_minus_w: f32,
    pub lerp_low: i32,
    pub eps1: f32,
    pub eps1_sq: f32,
    pub eps2: f32,
    pub step_size: f32,
    pub scale_parameter: i32,
    pub inv_clip: f32,
    pub weight_decay_on: i32,
    pub decay: f32,
    pub beta1_on: i32,
    pub beta1: f32,
    pub one_minus_beta1: f32,
}

// SAFETY: plain 4-byte fields, no padding, no pointers.
unsafe impl DeviceRepr for Hyper {}

/// Whether the kernels take `t`: a contiguous f32 CUDA tensor of fewer than 2^31 elements.
pub fn fits(t: &Tensor) -> bool {
    matches!(t.device(), Device::Cuda(_))
        && t.dtype() == DType::F32
        && t.is_contiguous()
        && t.elem_count() < i32::MAX as usize
}

/// Whether the kernels take gradient `g`: contiguous on CUDA, f32, f16 or bf16 (the backward
/// hands them over in the compute dtype; the kernels widen them to f32, which is exact).
pub fn fits_grad(g: &Tensor) -> bool {
    matches!(g.device(), Device::Cuda(_))
        && matches!(g.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && g.is_contiguous()
        && g.elem_count() < i32::MAX as usize
}

/// Whether one launch takes all of `grads`: each fits and all share a dtype.
pub fn fits_grads<'a>(mut grads: impl Iterator<Item = &'a Tensor>) -> bool {
    let Some(first) = grads.next() else { return true };
    fits_grad(first) && grads.all(|g| fits_grad(g) && g.dtype() == first.dtype())
}

/// Whether the step kernel takes parameter `p`: 2-D with its smaller dim in shared memory.
pub fn fits_parameter(p: &Tensor) -> bool {
    fits(p) && p.rank() == 2 && p.dims().iter().min().is_some_and(|&d| d > 0 && d <= MAX_SMALL)
}

/// `Σ (g · inv_scale)²` of each gradient.
pub fn grad_sumsq(grads: &[Tensor], inv_scale: f32) -> Result<Vec<f32>> {
    let dev = device(&grads[0])?;
    let descriptors = grads
        .iter()
        .map(|g| Ok([0, address(g, &dev)?, 0, 0, 0, shape_word(1, g.elem_count())]))
        .collect::<Result<Vec<_>>>()?;
    let desc = dev.clone_htod(descriptors.as_flattened())?;
    let sums = dev.alloc_zeros::<f32>(grads.len())?;
    let name = format!("grad_sumsq_{}", suffix(grads[0].dtype())?);
    let func = KERNELS.function(&dev, &name)?;
    let mut b = func.builder();
    b.arg(&desc).arg(&inv_scale).arg(&sums);
    unsafe { b.launch(one_block_each(grads.len())) }.w()?;
    dev.clone_dtoh(&sums)
}

/// One Adafactor step of every parameter, in place.
pub fn step(params: &[FusedParam], h: &Hyper) -> Result<()> {
    let Some(first) = params.first() else { return Ok(()) };
    let dev = device(first.p)?;
    let descriptors = params.iter().map(|fp| descriptor(fp, &dev)).collect::<Result<Vec<_>>>()?;
    let desc = dev.clone_htod(descriptors.as_flattened())?;
    let name = format!("adafactor_step_{}", suffix(first.g.dtype())?);
    let func = KERNELS.function(&dev, &name)?;
    let mut b = func.builder();
    b.arg(&desc).arg(h);
    unsafe { b.launch(one_block_each(params.len())) }.w()?;
    Ok(())
}

fn descriptor(fp: &FusedParam, dev: &CudaDevice) -> Result<[u64; 6]> {
    let (n, m) = fp.p.dims2()?;
    for (name, t, len) in [("gradient", fp.g, n * m), ("row", fp.row, n), ("col", fp.col, m)] {
        let fits = if name == "gradient" { fits_grad(t) } else { fits(t) };
        if !fits || t.elem_count() != len {
            bail!("fused Adafactor: the {name} of a [{n}, {m}] parameter is {:?} {:?}", t.dtype(), t.dims());
        }
    }
    let exp_avg = match fp.exp_avg {
        Some(e) if fits(e) && e.elem_count() == n * m => address(e, dev)?,
        Some(e) => bail!("fused Adafactor: exp_avg of a [{n}, {m}] parameter is {:?}", e.dims()),
        None => 0,
    };
    let (p, g) = (address(fp.p, dev)?, address(fp.g, dev)?);
    Ok([p, g, address(fp.row, dev)?, address(fp.col, dev)?, exp_avg, shape_word(n, m)])
}

fn shape_word(n: usize, m: usize) -> u64 {
    ((n as u64) << 32) | m as u64
}

fn device(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        _ => bail!("the fused optimizer runs on CUDA tensors only"),
    }
}

/// The device address of `t`'s first element.
fn address(t: &Tensor, dev: &CudaDevice) -> Result<u64> {
    crate::cuda::address(t, &dev.cuda_stream())
}

fn one_block_each(count: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (count as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}
