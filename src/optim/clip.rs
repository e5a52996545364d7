//! Global-norm gradient clipping, as `torch.nn.utils.clip_grad_norm_` (L2 norm).

use candle_core::{DType, Result, Tensor};

/// Scales all gradients by `max_norm / (total + 1e-6)` when that is below 1, where `total` is the
/// L2 norm of all gradients taken together; returns `total` (before clipping). A non-finite total
/// is returned as is (the gradients then become non-finite too, as in torch), so the caller can
/// skip the step.
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64> {
    let total = grad_norm(grads, 1.0)?;
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        for g in grads.iter_mut() {
            *g = g.affine(coef, 0.0)?;
        }
    }
    Ok(total)
}

/// The factor `clip_grad_norm` scales the gradients by: `max_norm / (total + 1e-6)`, at most 1.
pub fn clip_coefficient(max_norm: f64, total: f64) -> f64 {
    (max_norm / (total + 1e-6)).min(1.0)
}

/// The L2 norm of all `grads · inv_scale` taken together (the unscaled norm under loss scaling),
/// without changing them. On CUDA one kernel launch and one read of a value per gradient.
pub fn grad_norm(grads: &[Tensor], inv_scale: f64) -> Result<f64> {
    if grads.is_empty() {
        return Ok(0.0);
    }
    #[cfg(feature = "cuda")]
    if crate::cuda::adafactor::fits_grads(grads.iter()) {
        let sums = crate::cuda::adafactor::grad_sumsq(grads, inv_scale as f32)?;
        return Ok(sums.iter().map(|&s| f64::from(s)).sum::<f64>().sqrt());
    }
    // torch: norm of the per-tensor norms, in float32 for float32 gradients.
    let norms = grads
        .iter()
        .map(|g| {
            let g = g.to_dtype(DType::F32)?;
            let g = if inv_scale != 1.0 { g.affine(inv_scale, 0.0)? } else { g };
            g.sqr()?.sum_all()?.sqrt()
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::stack(&norms, 0)?.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()? as f64)
}

/// `grads · grad_mult` (the loss-scale and clipping factor) for an optimizer's composed step: the
/// gradients as they are at 1, else widened to f32 first (an f16 gradient times 1/loss_scale would
/// underflow in f16).
pub(crate) fn scaled_grads(grads: &[Tensor], grad_mult: f64) -> Result<std::borrow::Cow<'_, [Tensor]>> {
    if grad_mult == 1.0 {
        return Ok(std::borrow::Cow::Borrowed(grads));
    }
    let scaled =
        grads.iter().map(|g| g.to_dtype(DType::F32)?.affine(grad_mult, 0.0)).collect::<Result<Vec<_>>>()?;
    Ok(std::borrow::Cow::Owned(scaled))
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
    fn unscaled_norm_and_coefficient() {
        let dev = Device::Cpu;
        let grads =
            vec![Tensor::new(&[[300f32, 400.0]], &dev).unwrap(), Tensor::new(&[1200f32], &dev).unwrap()];
        let total = grad_norm(&grads, 0.01).unwrap();
        assert!((total - 13.0).abs() < 1e-5, "{total}");
        assert!((clip_coefficient(1.0, total) - 1.0 / (13.0 + 1e-6)).abs() < 1e-12);
        assert_eq!(clip_coefficient(20.0, total), 1.0);
        assert_eq!(clip_coefficient(f64::INFINITY, total), 1.0);
    }

    #[test]
    fn non_finite_norm_is_reported() {
        let dev = Device::Cpu;
        let mut grads = vec![Tensor::new(&[f32::NAN, 1.0], &dev).unwrap()];
        assert!(clip_grad_norm(&mut grads, 1.0).unwrap().is_nan());
    }
}
