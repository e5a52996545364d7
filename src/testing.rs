//! The float tolerance rule of the tests, derived instead of guessed: a result computed in f32 is
//! compared with the exact answer (the same computation in f64), and its error may be at most
//! [`MULTIPLE`] times the error of the reference implementation's own f32 result against that
//! exact answer (never less than [`FLOOR`]). Another summation order (SIMD width, thread count,
//! blocking) moves our error about as much as the reference's, so a test holds on any CPU where
//! a fixed tolerance held on one. The metric is max |a − b| / max |b| over the tensor.

use candle_core::{DType, Device, Tensor};

/// How many times the reference's own f32 error ours may be.
pub const MULTIPLE: f64 = 4.0;
/// The reference's error is read as at least this (8 ulp of f32 at the tensor's largest value):
/// a result rounded to f32 and reduced over a few terms is off by that much however it is
/// computed, and a tensor whose reference error happened to cancel must not demand more.
pub const FLOOR: f64 = 8.0 * f32::EPSILON as f64;

/// max |a − b| / max |b|, computed in f64 on the CPU.
pub fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap();
    let (a, b) = (cpu(a), cpu(b));
    let b = b.reshape(a.shape()).unwrap();
    let diff = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
    diff / b.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap().max(1e-300)
}

/// Asserts that `ours` (computed in f32) is within [`MULTIPLE`] × the error of `reference_f32`
/// (the reference implementation in f32) against `exact` (the reference in f64), both errors
/// printed; returns (ours, the reference's).
pub fn assert_within_reference_error(
    what: &str,
    ours: &Tensor,
    reference_f32: &Tensor,
    exact: &Tensor,
) -> (f64, f64) {
    let (err, reference) = (rel_err(ours, exact), rel_err(reference_f32, exact));
    let bound = MULTIPLE * reference.max(FLOOR);
    eprintln!("{what}: rel err {err:.2e}, reference f32 {reference:.2e}, bound {bound:.2e}");
    assert!(
        err <= bound,
        "{what}: rel err {err:.3e} > {bound:.3e} ({MULTIPLE} x the reference's f32 error {reference:.3e})"
    );
    (err, reference)
}

/// A golden pair written by a script of scripts/golden/: `tests/golden/STEM.safetensors` (the
/// reference's tensors) and `STEM.json` (its settings and the names in the file).
pub struct GoldenFiles {
    pub tensors: std::collections::HashMap<String, Tensor>,
    pub meta: serde_json::Value,
}

impl GoldenFiles {
    pub fn load(stem: &str) -> Self {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
        let tensors = candle_core::safetensors::load(format!("{dir}/{stem}.safetensors"), &Device::Cpu)
            .unwrap_or_else(|e| panic!("golden {stem}.safetensors: {e}"));
        let text = std::fs::read_to_string(format!("{dir}/{stem}.json"))
            .unwrap_or_else(|e| panic!("golden {stem}.json: {e}"));
        Self { tensors, meta: serde_json::from_str(&text).unwrap() }
    }

    /// The tensor `name`, which the golden must have.
    pub fn tensor(&self, name: &str) -> &Tensor {
        self.tensors.get(name).unwrap_or_else(|| panic!("golden tensor {name} missing"))
    }

    /// The parameters' names, in the order the script stepped them (`meta.params`).
    pub fn params(&self) -> Vec<String> {
        self.meta["params"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect()
    }
}
