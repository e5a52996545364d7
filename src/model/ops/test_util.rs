//! Helpers of the ops' tests: seeded inputs, the relative error, candle's autograd as the oracle
//! (in any dtype: run in f64 it gives the exact answer of `crate::testing`'s rule).

use candle_core::{DType, Device, Result, Tensor};

pub fn randn(shape: &[usize], seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// The tensor in f64 (exact: every f32 is an f64), for the exact answer of a reference.
pub fn f64(t: &Tensor) -> Tensor {
    t.to_dtype(DType::F64).unwrap()
}

pub fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
    let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    let scale = b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    diff / scale.max(1e-12)
}

/// The gradient of sum(f(x) ⊙ dy) by candle's autograd, the oracle of a hand-written backward.
pub fn autograd_grad(x: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>, dy: &Tensor) -> Tensor {
    let xv = candle_core::Var::from_tensor(x).unwrap();
    let y = f(xv.as_tensor()).unwrap();
    let grads = (y * dy).unwrap().sum_all().unwrap().backward().unwrap();
    grads.get(xv.as_tensor()).unwrap().clone()
}
