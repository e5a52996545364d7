//! AdamW against torch.optim.AdamW (tests/golden/adamw.*, written by scripts/golden/adamw.py):
//! our f32 run against torch's float64 run, each quantity held to 4× the distance between
//! torch's own float32 and float64 runs (at least 4 f32 ulps of the quantity's scale).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, Var};

use super::*;
use crate::testing::GoldenFiles;

struct Golden(GoldenFiles);

impl std::ops::Deref for Golden {
    type Target = GoldenFiles;
    fn deref(&self) -> &GoldenFiles {
        &self.0
    }
}

impl Golden {
    fn load() -> Self {
        Self(GoldenFiles::load("adamw"))
    }

    fn get(&self, name: &str) -> Vec<f64> {
        self.tensor(name).flatten_all().unwrap().to_vec1().unwrap()
    }

    fn f32(&self, name: &str) -> Tensor {
        self.tensors[name].to_dtype(DType::F32).unwrap()
    }

    fn config(&self, name: &str) -> (AdamwSection, f64, Vec<f64>) {
        let c = &self.meta["configs"][name];
        let betas = &c["betas"];
        let section = AdamwSection {
            beta1: betas[0].as_f64().unwrap(),
            beta2: betas[1].as_f64().unwrap(),
            eps: c["eps"].as_f64().unwrap(),
        };
        let lrs = c["lrs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        (section, c["weight_decay"].as_f64().unwrap(), lrs)
    }

    fn vars(&self) -> Vec<Var> {
        self.params().iter().map(|n| Var::from_tensor(&self.f32(&format!("init.{n}"))).unwrap()).collect()
    }

    fn grads(&self, step: usize) -> Vec<Tensor> {
        self.params().iter().map(|n| self.f32(&format!("grad.{step}.{n}"))).collect()
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// Largest error relative to the largest magnitude of `want`.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs())).max(1e-30);
    got.iter().zip(want).fold(0f64, |m, (g, w)| m.max((g - w).abs())) / scale
}

/// Ours against torch's f64, within 4× torch's f32 error (and at least 4 ulps).
fn check(what: &str, ours: &[f64], torch32: &[f64], torch64: &[f64]) {
    let torch_err = rel_err(torch32, torch64);
    let tol = (4.0 * torch_err).max(4.0 * f64::from(f32::EPSILON));
    let err = rel_err(ours, torch64);
    assert!(err <= tol, "{what}: rel err {err:.2e} > {tol:.2e} (torch f32: {torch_err:.2e})");
}

#[test]
fn matches_torch_adamw() {
    let golden = Golden::load();
    let names = golden.params();
    let configs: Vec<String> = golden.meta["configs"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(configs.len(), 3);
    for config in configs {
        let (section, wd, lrs) = golden.config(&config);
        let mut opt = AdamW::new(golden.vars(), &section, wd).unwrap();
        for (k, &lr) in lrs.iter().enumerate() {
            let step = k + 1;
            opt.step(&golden.grads(step), lr).unwrap();
            let state: HashMap<String, Tensor> = opt.state_tensors().into_iter().collect();
            for (i, (var, n)) in opt.params().iter().zip(&names).enumerate() {
                let key = |dt: &str| format!("{config}.{dt}.step{step}.{n}");
                let (want32, want64) = (golden.get(&key("f32")), golden.get(&key("f64")));
                let got = values(var.as_tensor());
                check(&key("ours"), &got, &want32, &want64);
                // the update alone (the parameters move ~lr a step: their own error hides it)
                let init = golden.get(&format!("init.{n}"));
                let delta = |v: &[f64]| v.iter().zip(&init).map(|(a, b)| a - b).collect::<Vec<_>>();
                check(&format!("{} update", key("ours")), &delta(&got), &delta(&want32), &delta(&want64));
                for kind in ["exp_avg", "exp_avg_sq"] {
                    let key = |dt: &str| format!("{config}.{dt}.state{step}.{n}.{kind}");
                    let got = values(&state[&format!("param.{i}.{kind}")]);
                    check(&key("ours"), &got, &golden.get(&key("f32")), &golden.get(&key("f64")));
                }
            }
        }
    }
}

#[test]
fn resuming_from_saved_state_is_exact() {
    let golden = Golden::load();
    let (section, wd, lrs) = golden.config("wd_schedule");
    let mut straight = AdamW::new(golden.vars(), &section, wd).unwrap();
    let mut first = AdamW::new(golden.vars(), &section, wd).unwrap();
    for (k, &lr) in lrs.iter().enumerate().take(2) {
        straight.step(&golden.grads(k + 1), lr).unwrap();
        first.step(&golden.grads(k + 1), lr).unwrap();
    }
    let saved: HashMap<String, Tensor> = first.state_tensors().into_iter().collect();
    let params = first.params().iter().map(|v| Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap());
    let mut resumed = AdamW::new(params.collect(), &section, wd).unwrap();
    resumed.load_state(&saved, first.step_count()).unwrap();
    for (k, &lr) in lrs.iter().enumerate().skip(2) {
        straight.step(&golden.grads(k + 1), lr).unwrap();
        resumed.step(&golden.grads(k + 1), lr).unwrap();
    }
    assert_eq!(resumed.step_count(), 5);
    for (a, b) in straight.params().iter().zip(resumed.params()) {
        assert_eq!(values(a.as_tensor()), values(b.as_tensor()));
    }
}

#[test]
fn load_state_refuses_another_optimizers_state() {
    let dev = Device::Cpu;
    let vars = || vec![Var::zeros((3, 4), DType::F32, &dev).unwrap()];
    let mut opt = AdamW::new(vars(), &AdamwSection::default(), 0.0).unwrap();
    let adafactor = crate::optim::Adafactor::new(vars(), &Default::default(), 0.0).unwrap();
    let theirs: HashMap<String, Tensor> = adafactor.state_tensors().into_iter().collect();
    let err = opt.load_state(&theirs, 3).unwrap_err().to_string();
    assert!(err.contains("is not part of AdamW's state"), "{err}");
    let mut ours: HashMap<String, Tensor> = opt.state_tensors().into_iter().collect();
    ours.insert("param.0.exp_avg_sq".into(), Tensor::zeros(12, DType::F32, &dev).unwrap());
    let err = opt.load_state(&ours, 3).unwrap_err().to_string();
    assert!(err.contains("param.0.exp_avg_sq has shape [12], expected [3, 4]"), "{err}");
    assert_eq!(opt.step_count(), 0);
}
