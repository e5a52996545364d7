//! The optimizer's CUDA kernels (`kernels/adafactor.cu`, PTX from build.rs): the Adafactor step
//! and the gradient norm over all parameters in one launch each. The composed tensor ops in
//! `adafactor.rs` and `clip.rs` stay the CPU path and the tests' reference.
//!
//! The kernels update the parameters and the optimizer state in place, through their device
//! addresses, as `Var::set` does: every tensor handed in must stay alive until the launch is queued
//! (the callers hold them), and the launches are ordered on the device's one stream.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CudaDevice, DType, Device, Result, Tensor};

use super::adafactor::{hf_step_size, machine_eps, HF_EPS1};
use crate::config::{AdafactorFlavor, AdafactorSection};
use crate::kernels::suffix;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/adafactor.ptx"));
const MODULE: &str = "lora_ft_adafactor";
const THREADS: u32 = 512;
/// The kernel keeps the sums over the smaller dim in shared memory (`MAX_SMALL` in the .cu).
const MAX_SMALL: usize = 1024;

/// One parameter's device buffers: `p` and `g` `[n, m]`, the factored second moment `row`
/// (n values) and `col` (m values), and hf's first moment when beta1 is set.
pub(super) struct FusedParam<'a> {
    pub p: &'a Tensor,
    pub g: &'a Tensor,
    pub row: &'a Tensor,
    pub col: &'a Tensor,
    pub exp_avg: Option<&'a Tensor>,
}

/// The step's scalars, laid out as `struct Hyper` in the kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct Hyper {
    hf: i32,
    grad_mult: f32,
    w: f32,
    one_minus_w: f32,
    lerp_low: i32,
    eps1: f32,
    eps1_sq: f32,
    eps2: f32,
    step_size: f32,
    scale_parameter: i32,
    inv_clip: f32,
    weight_decay_on: i32,
    decay: f32,
    beta1_on: i32,
    beta1: f32,
    one_minus_beta1: f32,
}

// SAFETY: plain 4-byte fields, no padding, no pointers.
unsafe impl DeviceRepr for Hyper {}

/// The scalars of step `t` (1-based), exactly as `torch_step`/`hf_step` derive them.
pub(super) fn hyper(cfg: &AdafactorSection, weight_decay: f64, t: f64, lr: f64, grad_mult: f64) -> Hyper {
    let hf = cfg.flavor == AdafactorFlavor::Hf;
    let (w, eps1, step_size, decay) = if hf {
        (1.0 - t.powf(cfg.decay_rate), cfg.eps1.unwrap_or(HF_EPS1), hf_step_size(cfg, t, lr), -weight_decay)
    } else {
        let eps1 = cfg.eps1.unwrap_or_else(|| machine_eps(DType::F32));
        (t.powf(cfg.decay_rate), eps1, lr.min(1.0 / t.sqrt()), 1.0 - lr * weight_decay)
    };
    let beta1 = cfg.beta1.unwrap_or(0.0);
    Hyper {
        hf: hf as i32,
        grad_mult: grad_mult as f32,
        w: w as f32,
        one_minus_w: (1.0 - w) as f32,
        lerp_low: (w < 0.5) as i32,
        eps1: eps1 as f32,
        eps1_sq: (eps1 * eps1) as f32,
        eps2: cfg.eps2 as f32,
        step_size: step_size as f32,
        scale_parameter: cfg.scale_parameter as i32,
        inv_clip: (1.0 / cfg.clip_threshold) as f32,
        weight_decay_on: (weight_decay != 0.0) as i32,
        decay: decay as f32,
        beta1_on: cfg.beta1.is_some() as i32,
        beta1: beta1 as f32,
        one_minus_beta1: (1.0 - beta1) as f32,
    }
}

/// Whether the kernels take `t`: a contiguous f32 CUDA tensor of fewer than 2^31 elements.
pub(super) fn fits(t: &Tensor) -> bool {
    matches!(t.device(), Device::Cuda(_))
        && t.dtype() == DType::F32
        && t.is_contiguous()
        && t.elem_count() < i32::MAX as usize
}

/// Whether the kernels take gradient `g`: contiguous on CUDA, f32, f16 or bf16 (the backward
/// hands them over in the compute dtype; the kernels widen them to f32, which is exact).
pub(super) fn fits_grad(g: &Tensor) -> bool {
    matches!(g.device(), Device::Cuda(_))
        && matches!(g.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && g.is_contiguous()
        && g.elem_count() < i32::MAX as usize
}

/// Whether one launch takes all of `grads`: each fits and all share a dtype.
pub(super) fn fits_grads<'a>(mut grads: impl Iterator<Item = &'a Tensor>) -> bool {
    let Some(first) = grads.next() else { return true };
    fits_grad(first) && grads.all(|g| fits_grad(g) && g.dtype() == first.dtype())
}

/// Whether the step kernel takes parameter `p`: 2-D with its smaller dim in shared memory.
pub(super) fn fits_parameter(p: &Tensor) -> bool {
    fits(p) && p.rank() == 2 && p.dims().iter().min().is_some_and(|&d| d > 0 && d <= MAX_SMALL)
}

/// `Σ (g · inv_scale)²` of each gradient.
pub(super) fn grad_sumsq(grads: &[Tensor], inv_scale: f32) -> Result<Vec<f32>> {
    let dev = device(&grads[0])?;
    let descriptors = grads
        .iter()
        .map(|g| Ok([0, address(g, &dev)?, 0, 0, 0, shape_word(1, g.elem_count())]))
        .collect::<Result<Vec<_>>>()?;
    let desc = dev.clone_htod(descriptors.as_flattened())?;
    let sums = dev.alloc_zeros::<f32>(grads.len())?;
    let name = format!("grad_sumsq_{}", suffix(grads[0].dtype())?);
    let func = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
    let mut b = func.builder();
    b.arg(&desc).arg(&inv_scale).arg(&sums);
    unsafe { b.launch(one_block_each(grads.len())) }.w()?;
    dev.clone_dtoh(&sums)
}

/// One Adafactor step of every parameter, in place.
pub(super) fn step(params: &[FusedParam], h: &Hyper) -> Result<()> {
    let Some(first) = params.first() else { return Ok(()) };
    let dev = device(first.p)?;
    let descriptors = params.iter().map(|fp| descriptor(fp, &dev)).collect::<Result<Vec<_>>>()?;
    let desc = dev.clone_htod(descriptors.as_flattened())?;
    let name = format!("adafactor_step_{}", suffix(first.g.dtype())?);
    let func = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
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
    crate::kernels::address(t, &dev.cuda_stream())
}

fn one_block_each(count: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (count as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// The fused kernels against the composed CPU ops they replace.
#[cfg(test)]
mod tests {
    use candle_core::Var;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::*;
    use crate::optim::{clip, Adafactor};

    /// LoRA-like shapes in both orientations, odd sizes, and the largest small dim.
    const SHAPES: [(usize, usize); 5] = [(16, 300), (300, 16), (5, 7), (1, 9), (1024, 3)];

    fn values(shape: (usize, usize), rng: &mut StdRng, device: &Device) -> Tensor {
        let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.random_range(-1.0..1.0)).collect();
        Tensor::from_vec(v, shape, device).unwrap()
    }

    /// Three steps on fixed gradients of `grad_dtype`; the parameters and the state afterwards,
    /// on the CPU.
    fn train(
        device: &Device,
        cfg: &AdafactorSection,
        weight_decay: f64,
        grad_dtype: DType,
    ) -> Vec<(String, Tensor)> {
        let mut rng = StdRng::seed_from_u64(7);
        let params: Vec<Var> =
            SHAPES.iter().map(|&s| Var::from_tensor(&values(s, &mut rng, device)).unwrap()).collect();
        let mut opt = Adafactor::new(params.clone(), cfg, weight_decay).unwrap();
        for _ in 0..3 {
            let grads: Vec<Tensor> =
                SHAPES.iter().map(|&s| values(s, &mut rng, device).to_dtype(grad_dtype).unwrap()).collect();
            opt.step_scaled(&grads, 0.25, 3e-2).unwrap();
        }
        let mut out: Vec<(String, Tensor)> =
            params.iter().enumerate().map(|(i, p)| (format!("param.{i}"), p.as_tensor().clone())).collect();
        out.extend(opt.state_tensors());
        out.into_iter().map(|(n, t)| (n, t.to_device(&Device::Cpu).unwrap())).collect()
    }

    fn configs() -> Vec<(&'static str, AdafactorSection, f64)> {
        let torch = AdafactorSection { flavor: AdafactorFlavor::Torch, ..Default::default() };
        let hf = AdafactorSection::default();
        let hf_full = AdafactorSection {
            beta1: Some(0.9),
            relative_step: true,
            scale_parameter: true,
            ..Default::default()
        };
        vec![
            ("torch", torch.clone(), 0.0),
            ("torch+wd", torch, 0.1),
            ("hf", hf, 0.0),
            ("hf+all", hf_full, 0.1),
        ]
    }

    #[test]
    fn fused_step_matches_the_composed_step() {
        let gpu = Device::new_cuda(0).unwrap();
        // f16/bf16: the backward's gradients as they come, widened by the kernel
        let runs =
            configs().into_iter().flat_map(|c| [DType::F32, DType::F16, DType::BF16].map(|d| (c.clone(), d)));
        for ((name, cfg, wd), grad_dtype) in runs {
            let name = format!("{name} {grad_dtype:?}");
            let (want, got) = (train(&Device::Cpu, &cfg, wd, grad_dtype), train(&gpu, &cfg, wd, grad_dtype));
            assert_eq!(want.len(), got.len(), "{name}");
            for ((key, w), (_, g)) in want.iter().zip(&got) {
                let scale = w.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-30);
                let diff = (w - g).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                println!("{name} {key}: {:.2e}", diff / scale);
                // f16/bf16 gradients: the same values, summed in another order (1024-term rows)
                let tol = if grad_dtype == DType::F32 { 2e-6 } else { 5e-6 };
                assert!(diff / scale < tol, "{name} {key}: {diff} of {scale}");
            }
        }
    }

    #[test]
    fn fused_grad_norm_matches_the_composed_norm() {
        let gpu = Device::new_cuda(0).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        let grads: Vec<Tensor> = SHAPES.iter().map(|&s| values(s, &mut rng, &Device::Cpu)).collect();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let grads: Vec<Tensor> = grads.iter().map(|g| g.to_dtype(dtype).unwrap()).collect();
            let want = clip::grad_norm(&grads, 1.0 / 1024.0).unwrap();
            let on_gpu: Vec<Tensor> = grads.iter().map(|g| g.to_device(&gpu).unwrap()).collect();
            let got = clip::grad_norm(&on_gpu, 1.0 / 1024.0).unwrap();
            assert!((got - want).abs() < 1e-6 * want, "{dtype:?}: {got} vs {want}");
        }
    }

    /// An overflowed f16 backward leaves inf in a gradient: the norm must say so, so that the
    /// loss scaler skips the step.
    #[test]
    fn fused_grad_norm_reports_overflow() {
        let gpu = Device::new_cuda(0).unwrap();
        let g = Tensor::new(&[[1f32, f32::INFINITY], [0.5, 0.25]], &gpu).unwrap();
        let ok = Tensor::new(&[[3f32, 4.0]], &gpu).unwrap();
        assert!(!clip::grad_norm(&[ok.clone(), g], 1.0).unwrap().is_finite());
        let nan = Tensor::new(&[f32::NAN, 1.0], &gpu).unwrap().reshape((1, 2)).unwrap();
        assert!(!clip::grad_norm(&[ok, nan], 1.0).unwrap().is_finite());
    }
}
