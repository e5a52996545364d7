//! The AdamW kernels: `adamw.cu` (torch's AdamW) and `adamw8bit.cu` (bitsandbytes' 8-bit
//! AdamW, compiled with fast math as bitsandbytes is), each one launch over every parameter. The
//! CPU paths in `optim::adamw` and `optim::blockwise8` are their references; `optim` derives
//! the scalars and hands over the quantization maps.
//!
//! The kernels update parameters and state in place through their device addresses, as
//! `Var::set` does: the callers hold every tensor until the launch is queued on the device's
//! one stream.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CudaDevice, DType, Device, Result, Tensor};

use super::suffix;

pub static KERNELS: super::module::Kernels = super::module::kernels!("adamw");
pub static KERNELS_8BIT: super::module::Kernels = super::module::kernels!("adamw8bit");

/// One parameter of the AdamW step: `p`, its gradient and f32 moments, all of `p`'s size.
pub struct AdamwParam<'a> {
    pub p: &'a Tensor,
    pub g: &'a Tensor,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
}

/// The AdamW step's scalars, laid out as `struct AdamwHyper` in adamw.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AdamwHyper {
    pub grad_mult: f32,
    pub decay: f32,
    pub weight_decay_on: i32,
    pub w: f32,
    pub one_minus_w: f32,
    pub lerp_low: i32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub inv_bias_correction2_sqrt: f32,
    pub eps: f32,
    pub step_size: f32,
}

// SAFETY: plain 4-byte fields, no padding, no pointers.
unsafe impl DeviceRepr for AdamwHyper {}

/// One parameter of the 8-bit step: codes and per-block absmax, or f32 moments.
pub enum Param8<'a> {
    Blockwise {
        p: &'a Tensor,
        g: &'a Tensor,
        state1: &'a Tensor,
        state2: &'a Tensor,
        absmax1: &'a Tensor,
        absmax2: &'a Tensor,
    },
    Full {
        p: &'a Tensor,
        g: &'a Tensor,
        exp_avg: &'a Tensor,
        exp_avg_sq: &'a Tensor,
    },
}

/// The 8-bit step's scalars, laid out as `struct Adam8Hyper` in adamw8bit.cu: the kernel
/// derives the bias corrections from `step` (1-based) itself, as bitsandbytes' does.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Adam8Hyper {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub lr: f32,
    pub weight_decay: f32,
    pub grad_mult: f32,
    pub step: i32,
}

/// Elements per quantization block (the kernel's `BLOCK`).
const BLOCK: usize = 256;

// SAFETY: plain 4-byte fields, no padding, no pointers.
unsafe impl DeviceRepr for Adam8Hyper {}

/// One AdamW step of every parameter, in place.
pub fn adamw_step(params: &[AdamwParam], h: &AdamwHyper) -> Result<()> {
    let Some(first) = params.first() else { return Ok(()) };
    let dev = super::cuda_device(first.p)?;
    let mut words = Vec::with_capacity(5 * params.len());
    for fp in params {
        let n = fp.p.elem_count();
        same_size("AdamW", n, &[fp.g, fp.exp_avg, fp.exp_avg_sq])?;
        dtypes("AdamW", first.g.dtype(), fp.g, &[fp.p, fp.exp_avg, fp.exp_avg_sq])?;
        for t in [fp.p, fp.g, fp.exp_avg, fp.exp_avg_sq] {
            words.push(address(t, &dev)?);
        }
        words.push(n as u64);
    }
    let desc = dev.clone_htod(&words)?;
    let name = format!("adamw_step_{}", suffix(first.g.dtype())?);
    let func = KERNELS.function(&dev, &name)?;
    let mut b = func.builder();
    b.arg(&desc).arg(h);
    unsafe { b.launch(super::blocks(params.len(), 512)) }.w()?;
    Ok(())
}

/// The 8-bit step's signed map followed by its unsigned one (512 values) on the GPU, uploaded
/// once per optimizer.
pub struct DeviceMaps(candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>);

impl DeviceMaps {
    pub fn new(dev: &CudaDevice, values: &[f32]) -> Result<Self> {
        if values.len() != 512 {
            bail!("fused AdamW8bit: {} map values, expected 512", values.len());
        }
        Ok(Self(dev.clone_htod(values)?))
    }
}

/// One 8-bit AdamW step of every parameter, in place.
pub fn adamw8bit_step(params: &[Param8], h: &Adam8Hyper, qmaps: &DeviceMaps) -> Result<()> {
    let Some(first) = params.first() else { return Ok(()) };
    let (p0, g0) = match first {
        Param8::Blockwise { p, g, .. } | Param8::Full { p, g, .. } => (*p, *g),
    };
    let dev = super::cuda_device(p0)?;
    let mut words = Vec::with_capacity(7 * params.len());
    for fp in params {
        match fp {
            Param8::Blockwise { p, g, state1, state2, absmax1, absmax2 } => {
                let n = p.elem_count();
                same_size("AdamW8bit", n, &[g, state1, state2])?;
                let blocks = n.div_ceil(BLOCK);
                if state1.dtype() != DType::U8 || state2.dtype() != DType::U8 {
                    bail!("fused AdamW8bit: codes must be u8");
                }
                same_size("AdamW8bit absmax", blocks, &[absmax1, absmax2])?;
                dtypes("AdamW8bit", g0.dtype(), g, &[p, absmax1, absmax2])?;
                for t in [*p, *g, *state1, *state2, *absmax1, *absmax2] {
                    words.push(address(t, &dev)?);
                }
                words.push(n as u64);
            }
            Param8::Full { p, g, exp_avg, exp_avg_sq } => {
                let n = p.elem_count();
                same_size("AdamW8bit (32-bit state)", n, &[g, exp_avg, exp_avg_sq])?;
                dtypes("AdamW8bit", g0.dtype(), g, &[p, exp_avg, exp_avg_sq])?;
                for t in [*p, *g, *exp_avg, *exp_avg_sq] {
                    words.push(address(t, &dev)?);
                }
                words.extend([0, 0, n as u64]);
            }
        }
    }
    let desc = dev.clone_htod(&words)?;
    let name = format!("adamw8bit_step_{}", suffix(g0.dtype())?);
    let func = KERNELS_8BIT.function(&dev, &name)?;
    let mut b = func.builder();
    b.arg(&desc).arg(&qmaps.0).arg(h);
    unsafe { b.launch(super::blocks(params.len(), 256)) }.w()?;
    Ok(())
}

/// The kernels are compiled per gradient dtype (one launch, one dtype) over f32 parameters and
/// state: `g` must be `grad_dtype` and every tensor of `f32s` f32.
fn dtypes(what: &str, grad_dtype: DType, g: &Tensor, f32s: &[&Tensor]) -> Result<()> {
    if g.dtype() != grad_dtype {
        bail!(
            "fused {what}: a {:?} gradient beside {grad_dtype:?} ones (one launch takes one dtype)",
            g.dtype()
        );
    }
    if let Some(t) = f32s.iter().find(|t| t.dtype() != DType::F32) {
        bail!("fused {what}: parameters and state are f32, got a {:?} {:?}", t.dtype(), t.dims());
    }
    Ok(())
}

fn same_size(what: &str, n: usize, tensors: &[&Tensor]) -> Result<()> {
    for t in tensors {
        if t.elem_count() != n || !t.is_contiguous() || !matches!(t.device(), Device::Cuda(_)) {
            bail!("fused {what}: a tensor of {:?} {:?} beside {n} elements", t.dtype(), t.dims());
        }
    }
    Ok(())
}

fn address(t: &Tensor, dev: &CudaDevice) -> Result<u64> {
    super::address(t, &dev.cuda_stream())
}
