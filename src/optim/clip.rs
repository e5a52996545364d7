//! Global-norm gradient clipping, as `torch.nn.utils.clip_grad_norm_` (L2 norm).

use candle_core::{DType, Result, Tensor};

/// Scales all gradients by `max_norm / (total + 1e-6)` when that is below 1, where `total` is the
/// L2 norm of all gradients taken together; returns `total` (before clipping). A non-finite total
/// is returned as is (the gradients then become non-finite too, as in torch), so the caller can
/// skip the step.
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64> {
    if grads.is_empty() {
        return Ok(0.0);
    }
    // torch: norm of the per-tensor norms, in float32 for float32 gradients.
    let norms =
        grads.iter().map(|g| g.to_dtype(DType::F32)?.sqr()?.sum_all()?.sqrt()).collect::<Result<Vec<_>>>()?;
    let total = Tensor::stack(&norms, 0)?.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()? as f64;
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        for g in grads.iter_mut() {
            *g = g.affine(coef, 0.0)?;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn norm(grads: &[Tensor]) -> f64 {
        grads
            .iter()
            .map(|g| g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64)
            .sum::<f64>()
            .sqrt()
    }

    #[test]
    fn clipped_norm_equals_max_norm() {
        let dev = Device::Cpu;
        // Norms 5 (3-4-0) and 12 (12): total 13.
        let a = Tensor::new(&[[3f32, 4.0], [0.0, 0.0]], &dev).unwrap();
        let b = Tensor::new(&[12f32], &dev).unwrap();
        let mut grads = vec![a, b];
        let total = clip_grad_norm(&mut grads, 1.0).unwrap();
        assert!((total - 13.0).abs() < 1e-6, "{total}");
        assert!((norm(&grads) - 1.0).abs() < 1e-6, "{}", norm(&grads));
        let first: Vec<f32> = grads[0].flatten_all().unwrap().to_vec1().unwrap();
        let k = 1.0 / (13.0 + 1e-6);
        assert!((first[0] as f64 - 3.0 * k).abs() < 1e-7 && (first[1] as f64 - 4.0 * k).abs() < 1e-7);
    }

    #[test]
    fn small_norm_is_left_alone() {
        let dev = Device::Cpu;
        let g = Tensor::new(&[0.3f32, -0.4], &dev).unwrap();
        let mut grads = vec![g.clone()];
        let total = clip_grad_norm(&mut grads, 1.0).unwrap();
        assert!((total - 0.5).abs() < 1e-7);
        assert_eq!(grads[0].to_vec1::<f32>().unwrap(), g.to_vec1::<f32>().unwrap());
    }

    #[test]
    fn non_finite_norm_is_reported() {
        let dev = Device::Cpu;
        let mut grads = vec![Tensor::new(&[f32::NAN, 1.0], &dev).unwrap()];
        assert!(clip_grad_norm(&mut grads, 1.0).unwrap().is_nan());
    }
}
