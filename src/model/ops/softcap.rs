//! Gemma 2's soft cap, cap · tanh(x / cap), on attention scores and on the final logits, and
//! its chain rule: d/dx = 1 − tanh²(x / cap).

use candle_core::{DType, Result, Tensor};

/// The capped values in `x`'s dtype, and tanh(x / cap) in f32 for the backward.
pub fn softcap(x: &Tensor, cap: f64) -> Result<(Tensor, Tensor)> {
    let tanh = (x.to_dtype(DType::F32)? / cap)?.tanh()?;
    Ok(((&tanh * cap)?.to_dtype(x.dtype())?, tanh))
}

/// The gradient before the cap given the one after it, in `dtype`.
pub fn softcap_backward(d_capped: &Tensor, tanh: &Tensor, dtype: DType) -> Result<Tensor> {
    (d_capped.to_dtype(DType::F32)? * (1.0 - tanh.sqr()?)?)?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{autograd_grad, f64, randn};
    use super::*;
    use crate::testing::assert_within_reference_error;

    /// Against autograd through the formula, in f32 and (exact) f64; the cap bounds the values.
    #[test]
    fn softcap_and_its_gradient_match_autograd() {
        let x = (randn(&[6, 9], 21) * 40.0).unwrap();
        let dy = randn(&[6, 9], 22);
        let formula = |x: &Tensor| (x / 30.0)?.tanh()? * 30.0;
        let (y, tanh) = softcap(&x, 30.0).unwrap();
        assert!(y.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() < 30.0);
        assert_within_reference_error("softcap", &y, &formula(&x).unwrap(), &formula(&f64(&x)).unwrap());
        let dx = softcap_backward(&dy, &tanh, DType::F32).unwrap();
        let dx_ref = autograd_grad(&x, formula, &dy);
        let dx_exact = autograd_grad(&f64(&x), formula, &f64(&dy));
        assert_within_reference_error("softcap dx", &dx, &dx_ref, &dx_exact);
    }
}
