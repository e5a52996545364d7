//! Helpers of the ops' tests: seeded inputs, the relative error, candle's autograd as the oracle.

use candle_core::{Device, Result, Tensor};

pub fn randn(shape: &[usize], seed: u64) -> Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
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
