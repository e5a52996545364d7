//! 8-bit AdamW: the quantizer, the state against bitsandbytes' (tests/golden/adamw8bit.*, from
//! scripts/golden/adamw8bit.py on a GPU), and the step against 32-bit AdamW.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};

use super::*;
use crate::optim::blockwise8::quantize;
use crate::quant::dynamic::{dynamic_map, unsigned_dynamic_map};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/adamw8bit");

#[test]
fn quantize_takes_the_nearest_code() {
    for (map, signed) in [(*dynamic_map(), true), (*unsigned_dynamic_map(), false)] {
        assert!(map.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
        for (i, &v) in map.iter().enumerate() {
            assert_eq!(quantize(&map, signed, v) as usize, i, "code {i} ({v:e}) maps to itself");
        }
        // between two codes: the nearer one, checked on a grid of values in [-1, 1] / [0, 1]
        let lo = if signed { -1.0f32 } else { 0.0 };
        for k in 0..=20_000 {
            let x = lo + (1.0 - lo) * k as f32 / 20_000.0;
            let got = map[quantize(&map, signed, x) as usize];
            let best = map.iter().map(|c| (c - x).abs()).fold(f32::MAX, f32::min);
            // (a value on the midpoint of two codes may take either: the search's rule decides)
            assert!(
                (got - x).abs() <= best + 4.0 * f32::EPSILON,
                "{x:e}: code {got:e}, nearest is {best:e} away"
            );
        }
    }
    let signed = *dynamic_map();
    assert_eq!((signed[127], signed[255], signed[0]), (0.0, 1.0, -0.992_968_75));
    assert_eq!(unsigned_dynamic_map()[0], 0.0);
}

fn vars(shapes: &[&[usize]], seed: u64) -> (Vec<Var>, Vec<Vec<Tensor>>) {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = |s: &[usize], scale: f32| {
        let v: Vec<f32> = (0..s.iter().product()).map(|_| rng.random_range(-1.0..1.0) * scale).collect();
        Tensor::from_vec(v, s, &Device::Cpu).unwrap()
    };
    let params = shapes.iter().map(|s| Var::from_tensor(&t(s, 0.05)).unwrap()).collect();
    let grads = (0..5).map(|_| shapes.iter().map(|s| t(s, 1e-3)).collect()).collect();
    (params, grads)
}

/// The step bitsandbytes' kernels take, in f64: from moments (m, v) and gradient g at step t,
/// s1 = β1·m + (1−β1)·g, s2 = β2·v + (1−β2)·g², p' = (p − lr·√(1−β2ᵗ)/(1−β1ᵗ) · s1/(√s2 +
/// eps·√(1−β2ᵗ))) · (1 − lr·wd) — torch's AdamW in exact arithmetic, except that the decay
/// multiplies after the update instead of before. The settings are the f32 values the step
/// takes (0.999 as f32 is 1.3e-8 off, which moves 1 − β2² by 1.3e-5 of itself). Returns (p',
/// the update's size).
fn adamw_step_f64(
    p: f32,
    g: f32,
    m: f64,
    v: f64,
    t: i32,
    (lr, wd): (f64, f64),
    cfg: &AdamwSection,
) -> (f64, f64) {
    let f32_of = |x: f64| x as f32 as f64;
    let (b1, b2, g) = (f32_of(cfg.beta1), f32_of(cfg.beta2), g as f64);
    let (lr, wd) = (f32_of(lr), f32_of(wd));
    let (s1, s2) = (b1 * m + (1.0 - b1) * g, b2 * v + (1.0 - b2) * g * g);
    let c2 = (1.0 - b2.powi(t)).sqrt();
    let step = lr * c2 / (1.0 - b1.powi(t)) * s1 / (s2.sqrt() + f32_of(cfg.eps) * c2);
    ((p as f64 - step) * (1.0 - lr * wd), step.abs())
}

/// Each step is AdamW on the state it read: the parameters after every one of five steps equal
/// `adamw_step_f64` from that step's dequantized 8-bit moments (code · absmax, the values the
/// kernel reads) or its 32-bit ones (a parameter below 4096 elements), to f32 rounding: the
/// result's own rounding (ε·|p'|); the update's chain of about a dozen f32 operations (the
/// moments' FMAs, the square root, the division, the step size's product and the final FMA:
/// ≤ 16 ε·|update| together); and the bias corrections, whose βᵗ the step computes in f32 (one
/// ulp, ε/2, of a value near 1) before 1 − βᵗ cancels: relative errors (ε/2)/(1 − β1ᵗ) and,
/// under the square root, half of (ε/2)/(1 − β2ᵗ) — ~7.5e-6 at step 2. All doubled. So the
/// 8-bit state's quantization is the only way the trajectory departs from 32-bit AdamW's; and
/// from the first step's zero state, where nothing is quantized yet, it is 32-bit AdamW's own
/// (checked against `crate::optim::AdamW` within that bound plus the decay's order,
/// lr·wd·|update|).
#[test]
fn each_step_is_adamw_on_the_state_it_read() {
    let shapes: [&[usize]; 2] = [&[16, 300], &[20, 30]];
    let (cfg, (lr, wd)) = (AdamwSection::default(), (1e-3, 0.01));
    let (p8, grads) = vars(&shapes, 1);
    let p32: Vec<Var> =
        p8.iter().map(|v| Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap()).collect();
    let mut eight = AdamW8bit::new(p8, &cfg, wd).unwrap();
    let mut full = crate::optim::AdamW::new(p32, &cfg, wd).unwrap();
    let values = |t: &Tensor| -> Vec<f32> {
        t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap()
    };
    let (signed, unsigned) = (dynamic_map(), unsigned_dynamic_map());
    for (k, g) in grads.iter().enumerate() {
        let state: HashMap<String, Tensor> = eight.state_tensors().into_iter().collect();
        let before: Vec<Vec<f32>> = eight.params().iter().map(|v| values(v.as_tensor())).collect();
        eight.step(g, lr).unwrap();
        full.step(g, lr).unwrap();
        for (i, var) in eight.params().iter().enumerate() {
            let n = before[i].len();
            // the moments the step read: dequantized codes, or the f32 moments themselves
            let (m, v): (Vec<f64>, Vec<f64>) = match state.get(&format!("param.{i}.state1")) {
                Some(c1) => {
                    let get = |key: &str| values(&state[&format!("param.{i}.{key}")]);
                    let (c1, c2) = (c1.to_dtype(DType::F32).unwrap(), &state[&format!("param.{i}.state2")]);
                    let (c1, c2) = (values(&c1), values(&c2.to_dtype(DType::F32).unwrap()));
                    let (a1, a2) = (get("absmax1"), get("absmax2"));
                    (0..n)
                        .map(|j| {
                            let b = j / BLOCK;
                            (
                                (signed[c1[j] as usize] * a1[b]) as f64,
                                (unsigned[c2[j] as usize] * a2[b]) as f64,
                            )
                        })
                        .unzip()
                }
                None => {
                    let get = |key: &str| values(&state[&format!("param.{i}.{key}")]);
                    let (m, v) = (get("exp_avg"), get("exp_avg_sq"));
                    (m.iter().map(|&x| x as f64).collect(), v.iter().map(|&x| x as f64).collect())
                }
            };
            let gv = values(&g[i]);
            let (after, adamw) = (values(var.as_tensor()), values(full.params()[i].as_tensor()));
            let eps = f32::EPSILON as f64;
            let t = k as i32 + 1;
            for j in 0..n {
                let (want, update) = adamw_step_f64(before[i][j], gv[j], m[j], v[j], t, (lr, wd), &cfg);
                let corrections =
                    (eps / 2.0) / (1.0 - cfg.beta1.powi(t)) + (eps / 4.0) / (1.0 - cfg.beta2.powi(t));
                let bound = 2.0 * (eps * want.abs() + (16.0 * eps + corrections) * update);
                let err = (after[j] as f64 - want).abs();
                assert!(
                    err <= bound,
                    "step {} param {i}[{j}]: {err:e} from AdamW on its state, bound {bound:e}",
                    k + 1
                );
                if k == 0 {
                    let err = (after[j] as f64 - adamw[j] as f64).abs();
                    let bound = bound + lr * wd * update;
                    assert!(
                        err <= bound,
                        "step 1 param {i}[{j}]: {err:e} from 32-bit AdamW, bound {bound:e}"
                    );
                }
            }
        }
    }
    // the 8-bit parameter keeps codes; the 600-element one (< 4096) keeps f32 moments
    let names: Vec<String> = eight.state_tensors().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "param.0.state1",
            "param.0.state2",
            "param.0.absmax1",
            "param.0.absmax2",
            "param.1.exp_avg",
            "param.1.exp_avg_sq"
        ]
    );
}

#[test]
fn resuming_from_saved_state_is_exact() {
    let shapes: [&[usize]; 2] = [&[16, 300], &[20, 30]];
    let cfg = AdamwSection::default();
    let (straight_p, grads) = vars(&shapes, 2);
    let first_p: Vec<Var> =
        straight_p.iter().map(|v| Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap()).collect();
    let mut straight = AdamW8bit::new(straight_p, &cfg, 0.01).unwrap();
    let mut first = AdamW8bit::new(first_p, &cfg, 0.01).unwrap();
    for g in &grads[..2] {
        straight.step(g, 1e-3).unwrap();
        first.step(g, 1e-3).unwrap();
    }
    let saved: HashMap<String, Tensor> = first.state_tensors().into_iter().collect();
    let params = first.params().iter().map(|v| Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap());
    let mut resumed = AdamW8bit::new(params.collect(), &cfg, 0.01).unwrap();
    resumed.load_state(&saved, first.step_count()).unwrap();
    for g in &grads[2..] {
        straight.step(g, 1e-3).unwrap();
        resumed.step(g, 1e-3).unwrap();
    }
    let flat = |v: &Var| -> Vec<f32> { v.as_tensor().flatten_all().unwrap().to_vec1().unwrap() };
    for (a, b) in straight.params().iter().zip(resumed.params()) {
        assert_eq!(flat(a), flat(b));
    }
    let mut adamw =
        crate::optim::AdamW::new(vec![Var::zeros((16, 300), DType::F32, &Device::Cpu).unwrap()], &cfg, 0.0)
            .unwrap();
    let err = adamw.load_state(&saved, 2).unwrap_err().to_string();
    assert!(err.contains("is not part of AdamW's state"), "{err}");
}

/// bitsandbytes' golden run (scripts/golden/adamw8bit.py on the GPU machine).
pub(crate) fn golden() -> (HashMap<String, Tensor>, serde_json::Value) {
    let file = format!("{GOLDEN}.safetensors");
    let tensors = candle_core::safetensors::load(&file, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{file}: {e} (scripts/golden/adamw8bit.py writes it on a GPU)"));
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{GOLDEN}.json")).unwrap()).unwrap();
    assert_eq!(meta["device"], "cuda", "the golden must come from bitsandbytes' CUDA kernels");
    (tensors, meta)
}

/// How far the parameters of a GPU 8-bit step (bitsandbytes' kernel, or ours built as it is,
/// with `--use_fast_math`) may be from the CPU's after steps of learning rates `lrs`: 1% of the
/// most Adam can move a parameter in those steps. An update is at most
/// lr·c2/c1·(1-β1)/sqrt(1-β2)·Σ_k<t (β1/sqrt β2)^k (each past gradient bounds sqrt(v) from
/// below). The GPU takes the bias corrections from `__powf` and divides and takes roots
/// approximately; near t = 1, 1-β2^t amplifies those errors by β2^t/(1-β2^t) (~10³), and they
/// reach ~0.1% of that on bitsandbytes' golden run (8.0e-6 of 9.0e-3 after three steps, H100).
/// A different formula (weight decay after instead of before, eps outside the correction, a
/// missing bias correction) moves the parameters by 10% of the update or more: 1% tells those
/// apart from the approximations.
pub(crate) fn gpu_param_bound(beta1: f64, beta2: f64, lrs: &[f64]) -> f32 {
    let reach: f64 = lrs
        .iter()
        .enumerate()
        .map(|(k, lr)| {
            let t = (k + 1) as f64;
            let (c1, c2) = (1.0 - beta1.powf(t), (1.0 - beta2.powf(t)).sqrt());
            let past: f64 = (0..k + 1).map(|j| (beta1 / beta2.sqrt()).powi(j as i32)).sum();
            lr * c2 / c1 * (1.0 - beta1) / (1.0 - beta2).sqrt() * past
        })
        .sum();
    (0.01 * reach) as f32
}

/// Runs `opt` through the golden's steps of `config`, calling `check(step, opt)` after each.
pub(crate) fn replay(
    tensors: &HashMap<String, Tensor>,
    meta: &serde_json::Value,
    config: &str,
    device: &Device,
    mut check: impl FnMut(usize, &AdamW8bit),
) {
    let c = &meta["configs"][config];
    let names: Vec<String> =
        meta["params"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().into()).collect();
    let cfg = AdamwSection {
        beta1: c["betas"][0].as_f64().unwrap(),
        beta2: c["betas"][1].as_f64().unwrap(),
        eps: c["eps"].as_f64().unwrap(),
    };
    let on = |t: &Tensor| t.to_device(device).unwrap();
    let params =
        names.iter().map(|n| Var::from_tensor(&on(&tensors[&format!("init.{n}")])).unwrap()).collect();
    let mut opt = AdamW8bit::new(params, &cfg, c["weight_decay"].as_f64().unwrap()).unwrap();
    for (k, lr) in c["lrs"].as_array().unwrap().iter().enumerate() {
        let grads: Vec<Tensor> = names.iter().map(|n| on(&tensors[&format!("grad.{}.{n}", k + 1)])).collect();
        opt.step(&grads, lr.as_f64().unwrap()).unwrap();
        check(k + 1, &opt);
    }
}

/// Compares `opt`'s state and parameters after `step` with bitsandbytes': codes and absmax bit
/// for bit, 32-bit moments to 1 ulp, parameters within `gpu_param_bound` (the GPU's
/// approximate powf/sqrt/division in the update) plus an ulp of their scale per step; prints
/// the parameters' gap.
pub(crate) fn compare(
    tensors: &HashMap<String, Tensor>,
    meta: &serde_json::Value,
    config: &str,
    step: usize,
    opt: &AdamW8bit,
) {
    let names: Vec<String> =
        meta["params"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().into()).collect();
    let ours: HashMap<String, Tensor> = opt.state_tensors().into_iter().collect();
    let host = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap();
    for (i, n) in names.iter().enumerate() {
        let key = format!("{config}.step{step}.{n}");
        for kind in ["state1", "state2"] {
            if let Some(want) = tensors.get(&format!("{key}.{kind}")) {
                let want: Vec<u8> = want.flatten_all().unwrap().to_vec1().unwrap();
                let got: Vec<u8> = host(&ours[&format!("param.{i}.{kind}")]).to_vec1().unwrap();
                let differ: Vec<usize> = (0..want.len()).filter(|&j| want[j] != got[j]).collect();
                assert!(
                    differ.is_empty(),
                    "{key}.{kind}: {} codes differ, first at {:?}",
                    differ.len(),
                    &differ[..differ.len().min(5)]
                );
            }
        }
        for kind in ["absmax1", "absmax2", "exp_avg", "exp_avg_sq"] {
            let Some(want) = tensors.get(&format!("{key}.{kind}")) else { continue };
            let want: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
            let got: Vec<f32> = host(&ours[&format!("param.{i}.{kind}")]).to_vec1().unwrap();
            let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs();
            let worst = want.iter().zip(&got).map(|(a, b)| ulps(*a, *b)).max().unwrap();
            let allowed = if kind.starts_with("absmax") { 0 } else { 1 };
            assert!(worst <= allowed, "{key}.{kind}: {worst} ulps apart");
        }
        let want: Vec<f32> = tensors[&key].flatten_all().unwrap().to_vec1().unwrap();
        let got: Vec<f32> = host(opt.params()[i].as_tensor()).to_vec1().unwrap();
        let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
        let err = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let c = &meta["configs"][config];
        let lrs: Vec<f64> =
            c["lrs"].as_array().unwrap()[..step].iter().map(|v| v.as_f64().unwrap()).collect();
        let (beta1, beta2) = (c["betas"][0].as_f64().unwrap(), c["betas"][1].as_f64().unwrap());
        let allowed = gpu_param_bound(beta1, beta2, &lrs) + step as f32 * scale * f32::EPSILON;
        println!("{key}: params {err:e} apart, allowed {allowed:e}");
        assert!(err <= allowed, "{key}: params {err:e} apart, allowed {allowed:e}");
    }
}

#[test]
fn state_matches_bitsandbytes() {
    let (tensors, meta) = golden();
    let flat = |t: &Tensor| -> Vec<u32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    };
    assert_eq!(flat(&tensors["qmap1"]), dynamic_map().map(f32::to_bits).to_vec(), "signed map");
    assert_eq!(flat(&tensors["qmap2"]), unsigned_dynamic_map().map(f32::to_bits).to_vec(), "unsigned map");
    for config in meta["configs"].as_object().unwrap().keys() {
        replay(&tensors, &meta, config, &Device::Cpu, |step, opt| {
            compare(&tensors, &meta, config, step, opt)
        });
    }
}
