//! RMSNorm with its hand-written backward. candle's fused version has no autograd, and we would
//! not want its autograd anyway (it keeps every intermediate for the whole step), so the
//! backward is written beside the forward.

use candle_core::{DType, Result, Tensor, D};

use crate::profile::section;

/// RMSNorm as HF computes it: in f32, y = w ⊙ (x · rsqrt(mean(x²) + eps)), cast back.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    section("norm", x.device(), || {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return crate::cuda::elementwise::rms_norm(x, weight, eps);
        }
        if super::cpu::takes(&[x, weight]) {
            return super::cpu::elementwise::rms_norm(x, weight, eps);
        }
        let xf = x.to_dtype(DType::F32)?;
        let normed = xf.broadcast_mul(&inv_rms(&xf, eps)?)?.to_dtype(x.dtype())?;
        normed.broadcast_mul(weight)
    })
}

/// rsqrt(mean(x²) + eps) per row, `[n, 1]`, of f32 rows.
fn inv_rms(xf: &Tensor, eps: f64) -> Result<Tensor> {
    (xf.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()
}

/// dx = r ⊙ g − x ⊙ r³ ⊙ mean(g ⊙ x), with g = dy ⊙ w and r = inv_rms (recomputed from x: the
/// backward reads x anyway, so keeping r from the forward would save nothing).
pub fn rms_norm_backward(x: &Tensor, weight: &Tensor, eps: f64, dy: &Tensor) -> Result<Tensor> {
    section("norm.backward", x.device(), || {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return crate::cuda::elementwise::rms_norm_backward(x, weight, eps, dy, None);
        }
        if super::cpu::takes(&[x, weight, dy]) {
            return super::cpu::elementwise::rms_norm_backward(x, weight, eps, dy, None);
        }
        let xf = x.to_dtype(DType::F32)?;
        let inv_rms = inv_rms(&xf, eps)?;
        let g = dy.broadcast_mul(weight)?.to_dtype(DType::F32)?;
        let mean_gx = (&g * &xf)?.mean_keepdim(D::Minus1)?;
        let r3 = inv_rms.powf(3.0)?;
        let dx = (g.broadcast_mul(&inv_rms)? - xf.broadcast_mul(&(r3 * mean_gx)?)?)?;
        dx.to_dtype(x.dtype())
    })
}

/// residual + `rms_norm_backward(x, weight, eps, dy)`: the gradient of a pre-norm block's input,
/// where the block is y = x + f(norm(x)) and `residual` is d(y). On CUDA one kernel reads
/// `residual` beside x and dy instead of a second pass over both gradients (same rounding); on the
/// CPU the fused loop adds it likewise.
pub fn rms_norm_backward_add(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    dy: &Tensor,
    residual: &Tensor,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return section("norm.backward", x.device(), || {
            crate::cuda::elementwise::rms_norm_backward(x, weight, eps, dy, Some(residual))
        });
    }
    if super::cpu::takes(&[x, weight, dy, residual]) {
        return section("norm.backward", x.device(), || {
            super::cpu::elementwise::rms_norm_backward(x, weight, eps, dy, Some(residual))
        });
    }
    residual + rms_norm_backward(x, weight, eps, dy)?
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{autograd_grad, f64, randn};
    use super::*;
    use crate::testing::assert_within_reference_error;
    use candle_nn::ops::rms_norm_slow;

    /// Against candle's unfused RMSNorm and its autograd, in f32 and (the exact answer) in f64:
    /// `rms_norm_slow` keeps f64 as it is (only f16/bf16 go up to f32).
    #[test]
    fn rms_norm_backward_matches_autograd() {
        let x = randn(&[5, 16], 1);
        let w = (randn(&[16], 2) + 1.0).unwrap();
        let dy = randn(&[5, 16], 3);
        let (x64, w64, dy64) = (f64(&x), f64(&w), f64(&dy));
        let y = rms_norm(&x, &w, 1e-5).unwrap();
        let y_ref = rms_norm_slow(&x, &w, 1e-5).unwrap();
        let y_exact = rms_norm_slow(&x64, &w64, 1e-5).unwrap();
        assert_within_reference_error("rms_norm", &y, &y_ref, &y_exact);
        let dx = rms_norm_backward(&x, &w, 1e-5, &dy).unwrap();
        let dx_ref = autograd_grad(&x, |x| rms_norm_slow(x, &w, 1e-5), &dy);
        let dx_exact = autograd_grad(&x64, |x| rms_norm_slow(x, &w64, 1e-5), &dy64);
        assert_within_reference_error("rms_norm dx", &dx, &dx_ref, &dx_exact);
    }
}
