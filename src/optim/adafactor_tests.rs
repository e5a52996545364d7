//! Adafactor against torch.optim.Adafactor and transformers' Adafactor
//! (tests/golden/adafactor.*, written by scripts/golden/adafactor_golden.py).

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
        Self(GoldenFiles::load("adafactor"))
    }

    fn get(&self, name: &str) -> &Tensor {
        self.tensor(name)
    }

    fn steps(&self) -> usize {
        self.meta["steps"].as_u64().unwrap() as usize
    }

    fn configs(&self) -> Vec<String> {
        self.meta["configs"].as_object().unwrap().keys().cloned().collect()
    }

    fn config(&self, name: &str) -> (AdafactorSection, f64, Vec<f64>) {
        let c = &self.meta["configs"][name];
        let section = serde_json::from_value(c["section"].clone()).unwrap();
        let lrs = c["lrs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        (section, c["weight_decay"].as_f64().unwrap(), lrs)
    }

    fn vars(&self, dt: &str) -> Vec<Var> {
        self.params().iter().map(|n| Var::from_tensor(self.get(&format!("init.{dt}.{n}"))).unwrap()).collect()
    }

    fn grads(&self, dt: &str, step: usize) -> Vec<Tensor> {
        self.params().iter().map(|n| self.get(&format!("grad.{step}.{dt}.{n}")).clone()).collect()
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// Largest elementwise error relative to the largest magnitude of `want` (so that elements that
/// happen to be near zero do not dominate).
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    let err = got.iter().zip(want).fold(0f64, |m, (g, w)| m.max((g - w).abs()));
    if scale == 0.0 {
        err
    } else {
        err / scale
    }
}

/// Runs every golden config in `dt`, checking params after each step (and, when `delta_tol` is
/// given, the change from the initial params), and the optimizer state after the last step.
fn check_against_golden(dt: &str, tol: f64, delta_tol: Option<f64>) {
    let golden = Golden::load();
    let names = golden.params();
    for config in golden.configs() {
        let (section, wd, lrs) = golden.config(&config);
        let mut opt = Adafactor::new(golden.vars(dt), &section, wd).unwrap();
        for (k, lr) in lrs.iter().enumerate().take(golden.steps()) {
            let step = k + 1;
            opt.step(&golden.grads(dt, step), *lr).unwrap();
            assert_eq!(opt.step_count(), step as u64);
            for (var, n) in opt.params().iter().zip(&names) {
                let got = values(var.as_tensor());
                let want = values(golden.get(&format!("{config}.{dt}.step{step}.{n}")));
                let err = rel_err(&got, &want);
                assert!(err <= tol, "{config} {dt} step {step} {n}: rel err {err:e}");
                if let Some(dtol) = delta_tol {
                    let init = values(golden.get(&format!("init.{dt}.{n}")));
                    let dg: Vec<f64> = got.iter().zip(&init).map(|(a, b)| a - b).collect();
                    let dw: Vec<f64> = want.iter().zip(&init).map(|(a, b)| a - b).collect();
                    let err = rel_err(&dg, &dw);
                    assert!(err <= dtol, "{config} {dt} step {step} {n}: delta rel err {err:e}");
                }
            }
        }
        let state: HashMap<String, Tensor> = opt.state_tensors().into_iter().collect();
        let mut checked = 0;
        for (i, n) in names.iter().enumerate() {
            for kind in ["row", "col", "sq", "exp_avg"] {
                let key = format!("{config}.{dt}.state.{n}.{kind}");
                let ours = state.get(&format!("param.{i}.{kind}"));
                match (golden.tensors.get(&key), ours) {
                    (Some(want), Some(got)) => {
                        assert_eq!(got.dims(), want.dims(), "{key}");
                        let err = rel_err(&values(got), &values(want));
                        assert!(err <= tol, "{key}: rel err {err:e}");
                        checked += 1;
                    }
                    (None, None) => {}
                    (want, got) => {
                        panic!("{key}: golden has it: {}, ours has it: {}", want.is_some(), got.is_some())
                    }
                }
            }
        }
        assert_eq!(checked, state.len(), "{config}: state entries not in the golden file");
    }
}

#[test]
fn matches_reference_f32() {
    check_against_golden("f32", 1e-5, None);
}

#[test]
fn matches_reference_f64() {
    // In f64 even hf's warmup_init updates (~1e-6 of the parameter) are resolved to many digits.
    check_against_golden("f64", 1e-12, Some(1e-9));
}

fn section(json: serde_json::Value) -> AdafactorSection {
    serde_json::from_value(json).unwrap()
}

#[test]
fn resuming_from_saved_state_is_exact() {
    let golden = Golden::load();
    for config in ["torch_wd_schedule", "hf_beta1_fixed_lr"] {
        let (section, wd, lrs) = golden.config(config);
        let mut straight = Adafactor::new(golden.vars("f32"), &section, wd).unwrap();
        let mut first = Adafactor::new(golden.vars("f32"), &section, wd).unwrap();
        for (k, &lr) in lrs.iter().enumerate().take(2) {
            straight.step(&golden.grads("f32", k + 1), lr).unwrap();
            first.step(&golden.grads("f32", k + 1), lr).unwrap();
        }
        let saved: HashMap<String, Tensor> = first.state_tensors().into_iter().collect();
        let params = first.params().iter().map(|v| Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap());
        let mut resumed = Adafactor::new(params.collect(), &section, wd).unwrap();
        resumed.load_state(&saved, first.step_count()).unwrap();
        for (k, &lr) in lrs.iter().enumerate().skip(2) {
            straight.step(&golden.grads("f32", k + 1), lr).unwrap();
            resumed.step(&golden.grads("f32", k + 1), lr).unwrap();
        }
        assert_eq!(resumed.step_count(), 5);
        for (a, b) in straight.params().iter().zip(resumed.params()) {
            assert_eq!(values(a.as_tensor()), values(b.as_tensor()), "{config}");
        }
    }
}

#[test]
fn load_state_rejects_missing_and_misshapen_entries() {
    let dev = Device::Cpu;
    let vars = vec![Var::zeros((3, 4), DType::F32, &dev).unwrap(), Var::zeros(5, DType::F32, &dev).unwrap()];
    let mut opt = Adafactor::new(vars, &AdafactorSection::default(), 0.0).unwrap();
    let mut state: HashMap<String, Tensor> = opt.state_tensors().into_iter().collect();
    assert_eq!(state.len(), 3);
    state.remove("param.1.sq");
    let err = opt.load_state(&state, 7).unwrap_err().to_string();
    assert!(err.contains("param.1.sq missing"), "{err}");
    state.insert("param.1.sq".into(), Tensor::zeros(4, DType::F32, &dev).unwrap());
    let err = opt.load_state(&state, 7).unwrap_err().to_string();
    assert!(err.contains("param.1.sq has shape [4], expected [5]"), "{err}");
    assert_eq!(opt.step_count(), 0);
}

#[test]
fn rejects_settings_the_flavor_lacks() {
    let dev = Device::Cpu;
    let vars = || vec![Var::zeros((2, 2), DType::F32, &dev).unwrap()];
    let torch_beta1 = section(serde_json::json!({"flavor": "torch", "beta1": 0.9}));
    let err = Adafactor::new(vars(), &torch_beta1, 0.0).err().unwrap().to_string();
    assert!(err.contains("beta1 is not part of flavor"), "{err}");
    let torch_clip = section(serde_json::json!({"flavor": "torch", "clip_threshold": 0.5}));
    assert!(Adafactor::new(vars(), &torch_clip, 0.0).is_err());
    let hf_warmup = section(serde_json::json!({"flavor": "hf", "warmup_init": true}));
    assert!(Adafactor::new(vars(), &hf_warmup, 0.0).is_err());
    let ints = vec![Var::from_tensor(&Tensor::new(&[1u32, 2], &dev).unwrap()).unwrap()];
    assert!(Adafactor::new(ints, &AdafactorSection::default(), 0.0).is_err());
    let mut opt = Adafactor::new(vars(), &AdafactorSection::default(), 0.0).unwrap();
    assert!(opt.step(&[], 1e-2).is_err());
}
