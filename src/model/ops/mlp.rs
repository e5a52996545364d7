//! The gated MLP's activation, a = act(gate) ⊙ up (SwiGLU with silu, GeGLU with Gemma's
//! gelu_pytorch_tanh), with its hand-written backward.

use candle_core::{Result, Tensor};

use crate::arch::Activation;
use crate::profile::section;

#[cfg(feature = "cuda")]
fn cuda_gate(act: Activation) -> crate::cuda::elementwise::Gate {
    match act {
        Activation::Silu => crate::cuda::elementwise::Gate::Silu,
        Activation::GeluTanh => crate::cuda::elementwise::Gate::GeluTanh,
    }
}

/// a = act(g) ⊙ u.
pub fn gated(gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
    section("gated_act", gate.device(), || {
        #[cfg(feature = "cuda")]
        if gate.device().is_cuda() {
            return crate::cuda::elementwise::gated(gate, up, cuda_gate(act));
        }
        if act == Activation::Silu && super::cpu::takes(&[gate, up]) {
            return super::cpu::elementwise::silu_gated(gate, up);
        }
        match act {
            Activation::Silu => gate.silu()? * up,
            // candle's gelu is the tanh approximation, as gelu_pytorch_tanh
            Activation::GeluTanh => gate.gelu()? * up,
        }
    })
}

/// Returns (d_gate, d_up) = (da ⊙ u ⊙ act'(g), da ⊙ act(g)), with
/// silu'(g) = σ(g)(1 + g(1 − σ(g))) and, for gelu_tanh with th = tanh(√(2/π)(g + 0.044715 g³)),
/// gelu'(g) = ½(1 + th) + ½ g (1 − th²) √(2/π)(1 + 3·0.044715 g²).
pub fn gated_backward(gate: &Tensor, up: &Tensor, da: &Tensor, act: Activation) -> Result<(Tensor, Tensor)> {
    section("gated_act.backward", gate.device(), || {
        #[cfg(feature = "cuda")]
        if gate.device().is_cuda() {
            return crate::cuda::elementwise::gated_backward(gate, up, da, cuda_gate(act));
        }
        if act == Activation::Silu && super::cpu::takes(&[gate, up, da]) {
            let (d_gate, d_up, _) = super::cpu::elementwise::silu_gated_backward(gate, up, da, false)?;
            return Ok((d_gate, d_up));
        }
        let (value, slope) = match act {
            Activation::Silu => {
                let sig = candle_nn::ops::sigmoid(gate)?;
                ((gate * &sig)?, (&sig * (1.0 + (gate * (1.0 - &sig)?)?)?)?)
            }
            Activation::GeluTanh => {
                const K0: f64 = 0.797_884_560_802_865_4; // √(2/π)
                const K1: f64 = 0.044715;
                let g2 = gate.sqr()?;
                let th = gate.mul(&g2.affine(K1, 1.0)?)?.affine(K0, 0.0)?.tanh()?;
                let value = gate.mul(&th.affine(0.5, 0.5)?)?;
                let sech2 = th.sqr()?.affine(-1.0, 1.0)?;
                let tail = gate.mul(&sech2)?.mul(&g2.affine(1.5 * K0 * K1, 0.5 * K0)?)?;
                let slope = th.affine(0.5, 0.5)?.add(&tail)?;
                (value, slope)
            }
        };
        let d_up = (da * value)?;
        let d_gate = ((da * up)? * slope)?;
        Ok((d_gate, d_up))
    })
}

/// `gated_backward` and the activation a = `gated(gate, up)` too, its bits: on CUDA from the
/// backward's one pass, a written where `da` was (the caller gives `da` up: the product sum it came
/// from holds no other reference), so the backward keeps no a beside its gradients and runs no
/// second pass over gate and up for it; on the CPU from the fused loop's one pass too; elsewhere
/// the two ops.
pub fn gated_backward_with_act(
    gate: &Tensor,
    up: &Tensor,
    da: Tensor,
    act: Activation,
) -> Result<(Tensor, Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if gate.device().is_cuda() {
        return section("gated_act.backward", gate.device(), || {
            crate::cuda::elementwise::gated_backward_act(gate, up, da, cuda_gate(act))
        });
    }
    if act == Activation::Silu && super::cpu::takes(&[gate, up, &da]) {
        return section("gated_act.backward", gate.device(), || {
            let (d_gate, d_up, a) = super::cpu::elementwise::silu_gated_backward(gate, up, &da, true)?;
            Ok((d_gate, d_up, a.expect("asked for a")))
        });
    }
    let (d_gate, d_up) = gated_backward(gate, up, &da, act)?;
    Ok((d_gate, d_up, gated(gate, up, act)?))
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

    /// The activation written as differentiable ops: silu through sigmoid, gelu_tanh as its
    /// formula (candle's fused gelu has no f64 backward to compare with).
    fn slow(g: &Tensor, u: &Tensor, act: Activation) -> Result<Tensor> {
        match act {
            Activation::Silu => (g * candle_nn::ops::sigmoid(g)?)? * u,
            Activation::GeluTanh => {
                let inner = ((g + (g.powf(3.0)? * 0.044715)?)? * (2.0 / std::f64::consts::PI).sqrt())?;
                ((g * (inner.tanh()? + 1.0)?)? * 0.5)? * u
            }
        }
    }

    /// Forward and backward of both activations against autograd through their formulas, in f32
    /// and (the exact answer) f64.
    #[test]
    fn gated_activations_and_backward_match_autograd() {
        for act in [Activation::Silu, Activation::GeluTanh] {
            let g = (randn(&[4, 6], 6) * 3.0).unwrap();
            let u = randn(&[4, 6], 7);
            let da = randn(&[4, 6], 8);
            let (g64, u64, da64) = (f64(&g), f64(&u), f64(&da));
            let a = gated(&g, &u, act).unwrap();
            let name = format!("{act:?}");
            assert_within_reference_error(
                &name,
                &a,
                &slow(&g, &u, act).unwrap(),
                &slow(&g64, &u64, act).unwrap(),
            );
            let (dg, du) = gated_backward(&g, &u, &da, act).unwrap();
            let dg_ref = autograd_grad(&g, |g| slow(g, &u, act), &da);
            let du_ref = autograd_grad(&u, |u| slow(&g, u, act), &da);
            // the same autograd in f64 (sigmoid, tanh and the products all keep f64)
            let dg_exact = autograd_grad(&g64, |g| slow(g, &u64, act), &da64);
            let du_exact = autograd_grad(&u64, |u| slow(&g64, u, act), &da64);
            assert_within_reference_error(&format!("{name} d_gate"), &dg, &dg_ref, &dg_exact);
            assert_within_reference_error(&format!("{name} d_up"), &du, &du_ref, &du_exact);
        }
    }

    /// The fused CUDA kernels against the composed CPU ops: f32 tight, f16/bf16 within rounding.
    /// 128, 1000 and 2056 columns take the 16-byte paths throughout; 1001 and 2049 the one-value
    /// paths of RMSNorm and the scalar tail of the gated activations. Up to 1024 columns RMSNorm
    /// runs a group of lanes per row (128: Qwen3's q/k norms), beyond a block per row.
    #[cfg(feature = "cuda")]
    #[test]
    fn fused_cuda_norm_and_gated_activations_match_the_composed_cpu_ops() {
        for cols in [128, 1000, 1001, 2049, 2056] {
            for act in [Activation::Silu, Activation::GeluTanh] {
                fused_cuda_ops_at(cols, act);
            }
        }
    }

    /// The backward pass that also writes a over d(a) gives the separate kernels' bits: a as
    /// `gated`, and the same two gradients; the aligned and the one-value paths.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_backward_with_act_equals_the_separate_kernels() {
        let gpu = Device::new_cuda(0).unwrap();
        let values =
            |t: &Tensor| t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let differ = |a: &Tensor, b: &Tensor| {
            values(a).iter().zip(values(b)).filter(|&(x, y)| x.to_bits() != y.to_bits()).count()
        };
        for cols in [2056, 2049] {
            for act in [Activation::Silu, Activation::GeluTanh] {
                for dtype in [DType::F32, DType::F16, DType::BF16] {
                    let on = |t: Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
                    let g = on((randn(&[37, cols], 21) * 4.0).unwrap());
                    let (u, da) = (on(randn(&[37, cols], 22)), on(randn(&[37, cols], 23)));
                    let want_a = gated(&g, &u, act).unwrap();
                    let (want_dg, want_du) = gated_backward(&g, &u, &da, act).unwrap();
                    // a copy of its own, as a product sum's output is
                    let (dg, du, a) = gated_backward_with_act(&g, &u, da.copy().unwrap(), act).unwrap();
                    let what = format!("{cols} columns {act:?} {dtype:?}");
                    assert_eq!(differ(&a, &want_a), 0, "{what}: a");
                    assert_eq!(differ(&dg, &want_dg), 0, "{what}: d_gate");
                    assert_eq!(differ(&du, &want_du), 0, "{what}: d_up");
                }
            }
        }
    }

    #[cfg(feature = "cuda")]
    fn fused_cuda_ops_at(cols: usize, act: Activation) {
        let gpu = Device::new_cuda(0).unwrap();
        let (x, dy) = (randn(&[37, cols], 11), randn(&[37, cols], 12));
        let w = (randn(&[cols], 13) + 1.0).unwrap();
        let (g, u, da) =
            ((randn(&[37, cols], 14) * 4.0).unwrap(), randn(&[37, cols], 15), randn(&[37, cols], 16));
        let want = [
            rms_norm(&x, &w, 1e-5).unwrap(),
            rms_norm_backward(&x, &w, 1e-5, &dy).unwrap(),
            gated(&g, &u, act).unwrap(),
            gated_backward(&g, &u, &da, act).unwrap().0,
            gated_backward(&g, &u, &da, act).unwrap().1,
        ];
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 5e-3), (DType::BF16, 3e-2)] {
            let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
            let (dg, du) = gated_backward(&on(&g), &on(&u), &on(&da), act).unwrap();
            let got = [
                rms_norm(&on(&x), &on(&w), 1e-5).unwrap(),
                rms_norm_backward(&on(&x), &on(&w), 1e-5, &on(&dy)).unwrap(),
                gated(&on(&g), &on(&u), act).unwrap(),
                dg,
                du,
            ];
            for (i, (got, want)) in got.iter().zip(want.iter()).enumerate() {
                let got = got.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
                let err = max_rel(&got, want);
                println!("{cols} columns {act:?} {dtype:?} op {i}: {err:.2e}");
                assert!(err < tol, "{cols} columns {act:?} {dtype:?} op {i}: {err}");
            }
            // the residual's gradient added in the norm's backward: the separate add, bit for bit
            let res = on(&randn(&[37, cols], 17));
            let fused =
                super::super::norm::rms_norm_backward_add(&on(&x), &on(&w), 1e-5, &on(&dy), &res).unwrap();
            let separate = (&res + &got[1]).unwrap();
            let diff =
                (fused.to_dtype(DType::F32).unwrap() - separate.to_dtype(DType::F32).unwrap()).unwrap();
            let worst = diff.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(worst, 0.0, "{cols} columns {dtype:?}: fused residual add");
        }
    }
}
