//! The fused CUDA AdamW steps (`crate::cuda::adamw`) against the CPU paths they replace, and the
//! 8-bit one against bitsandbytes' golden run.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::config::{AdamwSection, OptimName, OptimSection};
use crate::optim::adamw8bit::tests::gpu_param_bound;
use crate::optim::Optimizer;

/// LoRA-like shapes: 8-bit state with whole and partial 256-blocks, exactly min_8bit_size, and
/// below it (32-bit state).
const SHAPES: [(usize, usize); 5] = [(16, 300), (300, 16), (16, 256), (5, 7), (64, 70)];

fn values(shape: (usize, usize), scale: f32, rng: &mut StdRng, device: &Device) -> Tensor {
    let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.random_range(-1.0..1.0) * scale).collect();
    Tensor::from_vec(v, shape, device).unwrap()
}

/// Three steps on fixed gradients of `grad_dtype`; the parameters and state afterwards, on the CPU.
fn train(device: &Device, cfg: &OptimSection, wd: f64, grad_dtype: DType) -> Vec<(String, Tensor)> {
    let mut rng = StdRng::seed_from_u64(11);
    let params: Vec<Var> =
        SHAPES.iter().map(|&s| Var::from_tensor(&values(s, 0.05, &mut rng, device)).unwrap()).collect();
    let mut opt = Optimizer::new(params.clone(), cfg, wd).unwrap();
    for step in 0..3 {
        let mut grads: Vec<Tensor> =
            SHAPES.iter().map(|&s| values(s, 1e-3, &mut rng, device).to_dtype(grad_dtype).unwrap()).collect();
        if step == 0 {
            // a block of zero gradients: absmax 0 at the first step
            grads[0] = grads[0].zeros_like().unwrap();
        }
        opt.step_scaled(&grads, 0.5, 2e-3).unwrap();
    }
    let mut out: Vec<(String, Tensor)> =
        params.iter().enumerate().map(|(i, p)| (format!("param.{i}"), p.as_tensor().clone())).collect();
    out.extend(opt.state_tensors());
    out.into_iter().map(|(n, t)| (n, t.to_device(&Device::Cpu).unwrap())).collect()
}

#[test]
fn fused_adamw_steps_match_the_cpu_steps() {
    let gpu = Device::new_cuda(0).unwrap();
    let adamw = AdamwSection::default();
    for name in [OptimName::Adamw, OptimName::Adamw8bit] {
        for (wd, grad_dtype) in
            [(0.0, DType::F32), (0.01, DType::F32), (0.01, DType::F16), (0.0, DType::BF16)]
        {
            let cfg = OptimSection::adamw(name, &adamw);
            let what = format!("{} wd {wd} {grad_dtype:?}", name.as_str());
            let want = train(&Device::Cpu, &cfg, wd, grad_dtype);
            let got = train(&gpu, &cfg, wd, grad_dtype);
            assert_eq!(want.len(), got.len(), "{what}");
            for ((key, w), (_, g)) in want.iter().zip(&got) {
                if w.dtype() == DType::U8 {
                    let (w, g): (Vec<u8>, Vec<u8>) = (w.to_vec1().unwrap(), g.to_vec1().unwrap());
                    let differ = w.iter().zip(&g).filter(|(a, b)| a != b).count();
                    println!("{what} {key}: {differ} of {} codes differ", w.len());
                    assert_eq!(differ, 0, "{what} {key}");
                    continue;
                }
                let w = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let g = g.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                if key.contains("absmax") {
                    assert_eq!(w, g, "{what} {key}");
                    continue;
                }
                let scale = w.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
                let diff = w.iter().zip(&g).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                println!("{what} {key}: {:.2e}", diff / scale);
                // f32 moments: rounding order (fma), a few ulp of their scale; parameters of the
                // 8-bit step: the GPU's approximate powf, sqrt and division (gpu_param_bound)
                let gpu_math = match (name, key.matches('.').count() == 1) {
                    (OptimName::Adamw8bit, true) => gpu_param_bound(adamw.beta1, adamw.beta2, &[2e-3; 3]),
                    _ => 0.0,
                };
                let allowed = gpu_math + 16.0 * f32::EPSILON * scale;
                assert!(diff <= allowed, "{what} {key}: {diff} of {scale}, allowed {allowed}");
            }
        }
    }
}

#[test]
fn fused_8bit_step_matches_bitsandbytes() {
    use crate::optim::adamw8bit::tests::{compare, golden, replay};
    let (tensors, meta) = golden();
    let gpu = Device::new_cuda(0).unwrap();
    let tensors: HashMap<String, Tensor> = tensors;
    for config in meta["configs"].as_object().unwrap().keys() {
        replay(&tensors, &meta, config, &gpu, |step, opt| compare(&tensors, &meta, config, step, opt));
    }
}

/// On CUDA a step the fused kernel cannot take (here a transposed, non-contiguous gradient) is
/// an error naming why, not a silent round trip of every parameter and its state through host
/// memory.
#[test]
fn cuda_8bit_step_refuses_what_the_fused_kernel_cannot_take() {
    let gpu = Device::new_cuda(0).unwrap();
    let p = Var::from_tensor(&Tensor::zeros((64, 64), DType::F32, &gpu).unwrap()).unwrap();
    let g = Tensor::ones((64, 64), DType::F32, &gpu).unwrap().t().unwrap();
    let mut opt = crate::optim::adamw8bit::AdamW8bit::new(vec![p], &AdamwSection::default(), 0.0).unwrap();
    let e = opt.step(&[g], 1e-3).unwrap_err().to_string();
    assert!(e.contains("fused CUDA step takes contiguous f32 parameters"), "{e}");
    assert_eq!(opt.step_count(), 0, "a refused step is not counted");
}
