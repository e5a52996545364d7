//! The fused CUDA optimizer kernels (`crate::cuda::adafactor`) against the composed CPU ops they
//! replace.

use candle_core::Var;
use rand::{rngs::StdRng, Rng, SeedableRng};

use candle_core::{DType, Device, Tensor};

use crate::config::{AdafactorFlavor, AdafactorSection};
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
    vec![("torch", torch.clone(), 0.0), ("torch+wd", torch, 0.1), ("hf", hf, 0.0), ("hf+all", hf_full, 0.1)]
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
