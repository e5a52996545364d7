//! The SwiGLU gate of the MLP, a = silu(gate) ⊙ up, with its hand-written backward.

use candle_core::{Result, Tensor};

use crate::profile::section;

/// SwiGLU: a = silu(g) ⊙ u.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    section("swiglu", gate.device(), || {
        #[cfg(feature = "cuda")]
        if gate.device().is_cuda() {
            return crate::cuda::elementwise::swiglu(gate, up);
        }
        gate.silu()? * up
    })
}

/// Returns (d_gate, d_up): silu'(g) = σ(g)(1 + g(1 − σ(g))).
pub fn swiglu_backward(gate: &Tensor, up: &Tensor, da: &Tensor) -> Result<(Tensor, Tensor)> {
    section("swiglu.backward", gate.device(), || {
        #[cfg(feature = "cuda")]
        if gate.device().is_cuda() {
            return crate::cuda::elementwise::swiglu_backward(gate, up, da);
        }
        let sig = candle_nn::ops::sigmoid(gate)?;
        let silu = (gate * &sig)?;
        let d_up = (da * &silu)?;
        let dsilu = (&sig * (1.0 + (gate * (1.0 - &sig)?)?)?)?;
        let d_gate = ((da * up)? * dsilu)?;
        Ok((d_gate, d_up))
    })
}

#[cfg(test)]
mod tests {
    #[cfg(feature = "cuda")]
    use super::super::norm::{rms_norm, rms_norm_backward};
    #[cfg(feature = "cuda")]
    use super::super::test_util::max_rel;
    use super::super::test_util::{autograd_grad, f64, randn};
    use super::*;
    use crate::testing::assert_within_reference_error;
    #[cfg(feature = "cuda")]
    use candle_core::{DType, Device};

    #[test]
    fn swiglu_backward_matches_autograd() {
        let g = (randn(&[4, 6], 6) * 3.0).unwrap();
        let u = randn(&[4, 6], 7);
        let da = randn(&[4, 6], 8);
        let (dg, du) = swiglu_backward(&g, &u, &da).unwrap();
        let slow = |g: &Tensor, u: &Tensor| (g * candle_nn::ops::sigmoid(g)?)? * u;
        let dg_ref = autograd_grad(&g, |g| slow(g, &u), &da);
        let du_ref = autograd_grad(&u, |u| slow(&g, u), &da);
        // the same autograd in f64 (sigmoid, exp and the products all keep f64)
        let (g64, u64, da64) = (f64(&g), f64(&u), f64(&da));
        let dg_exact = autograd_grad(&g64, |g| slow(g, &u64), &da64);
        let du_exact = autograd_grad(&u64, |u| slow(&g64, u), &da64);
        assert_within_reference_error("swiglu d_gate", &dg, &dg_ref, &dg_exact);
        assert_within_reference_error("swiglu d_up", &du, &du_ref, &du_exact);
    }

    /// The fused CUDA kernels against the composed CPU ops: f32 tight, f16/bf16 within rounding.
    /// 1000 columns take the 16-byte path throughout; 1001 the one-value path of RMSNorm and the
    /// scalar tail of SwiGLU.
    #[cfg(feature = "cuda")]
    #[test]
    fn fused_cuda_norm_and_swiglu_match_the_composed_cpu_ops() {
        for cols in [1000, 1001] {
            fused_cuda_ops_at(cols);
        }
    }

    #[cfg(feature = "cuda")]
    fn fused_cuda_ops_at(cols: usize) {
        let gpu = Device::new_cuda(0).unwrap();
        let (x, dy) = (randn(&[37, cols], 11), randn(&[37, cols], 12));
        let w = (randn(&[cols], 13) + 1.0).unwrap();
        let (g, u, da) =
            ((randn(&[37, cols], 14) * 4.0).unwrap(), randn(&[37, cols], 15), randn(&[37, cols], 16));
        let want = [
            rms_norm(&x, &w, 1e-5).unwrap(),
            rms_norm_backward(&x, &w, 1e-5, &dy).unwrap(),
            swiglu(&g, &u).unwrap(),
            swiglu_backward(&g, &u, &da).unwrap().0,
            swiglu_backward(&g, &u, &da).unwrap().1,
        ];
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 5e-3), (DType::BF16, 3e-2)] {
            let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
            let (dg, du) = swiglu_backward(&on(&g), &on(&u), &on(&da)).unwrap();
            let got = [
                rms_norm(&on(&x), &on(&w), 1e-5).unwrap(),
                rms_norm_backward(&on(&x), &on(&w), 1e-5, &on(&dy)).unwrap(),
                swiglu(&on(&g), &on(&u)).unwrap(),
                dg,
                du,
            ];
            for (i, (got, want)) in got.iter().zip(want.iter()).enumerate() {
                let got = got.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
                let err = max_rel(&got, want);
                println!("{cols} columns {dtype:?} op {i}: {err:.2e}");
                assert!(err < tol, "{cols} columns {dtype:?} op {i}: {err}");
            }
        }
    }
}
