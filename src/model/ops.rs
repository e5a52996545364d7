//! The decoder's elementwise pieces with their hand-written backward passes: RMSNorm, RoPE and
//! the SwiGLU gate. candle's fused versions of these have no autograd, and we would not want its
//! autograd anyway (DESIGN.md), so each forward here returns what its backward needs.

use candle_core::{DType, Device, Result, Tensor, D};

use crate::profile::section;
use std::sync::{Arc, Mutex};

/// RMSNorm as HF computes it: in f32, y = w ⊙ (x · rsqrt(mean(x²) + eps)), cast back.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    section("norm", x.device(), || {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return super::ops_cuda::rms_norm(x, weight, eps);
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
            return super::ops_cuda::rms_norm_backward(x, weight, eps, dy);
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

/// Rotary position embedding in HF's "rotate_half" layout. The cos/sin tables `[len, head_dim/2]`
/// are computed on first use for the positions needed so far (rounded up to a power of two), not
/// for all `max_position_embeddings`: 32k positions would hold 8 MiB that training never reads.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Tensor,
    max_pos: usize,
    dtype: DType,
    tables: Arc<Mutex<Option<(Tensor, Tensor)>>>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64, max_pos: usize, dtype: DType, device: &Device) -> Result<Self> {
        let half = head_dim / 2;
        // Computed in f64 and rounded once, as close to HF's f32 inv_freq as the angles allow.
        let inv_freq: Vec<f32> =
            (0..half).map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
        Ok(Self { inv_freq, max_pos, dtype, tables: Arc::new(Mutex::new(None)) })
    }

    fn tables(&self, offset: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let end = offset + len;
        if end > self.max_pos {
            candle_core::bail!("position {end} is past max_position_embeddings ({})", self.max_pos);
        }
        let mut cached =
            self.tables.lock().map_err(|_| candle_core::Error::Msg("RoPE cache poisoned".into()))?;
        if cached.as_ref().is_none_or(|(cos, _)| cos.dim(0).unwrap_or(0) < end) {
            let rows = end.next_power_of_two().max(256).min(self.max_pos);
            let pos = Tensor::arange(0u32, rows as u32, self.inv_freq.device())?.to_dtype(DType::F32)?;
            let angles = pos.reshape((rows, 1))?.broadcast_mul(&self.inv_freq)?;
            *cached = Some((angles.cos()?.to_dtype(self.dtype)?, angles.sin()?.to_dtype(self.dtype)?));
        }
        let (cos, sin) = cached.as_ref().expect("filled above");
        Ok((cos.narrow(0, offset, len)?, sin.narrow(0, offset, len)?))
    }

    /// x `[b, heads, t, head_dim]` at positions offset..offset+t.
    pub fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (cos, sin) = self.tables(offset, x.dim(2)?)?;
        section("rope", x.device(), || rotate(x, &cos, &sin))
    }

    /// RoPE is a rotation, so its backward is the rotation by the opposite angle.
    pub fn backward(&self, dy: &Tensor, offset: usize) -> Result<Tensor> {
        let (cos, sin) = self.tables(offset, dy.dim(2)?)?;
        section("rope", dy.device(), || rotate(dy, &cos, &sin.neg()?))
    }
}

/// x `[b, h, t, d]` rotated. A view of `[b, t, h, d]` memory (the projections' own layout, which
/// the CUDA attention reads strided) is rotated in that layout and returned as the same kind of
/// view, so no transpose is ever copied; anything else is made `[b, h, t, d]`-contiguous.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let thd = x.transpose(1, 2)?;
    if thd.is_contiguous() && !x.is_contiguous() {
        return candle_nn::rotary_emb::rope_thd(&thd, cos, sin)?.transpose(1, 2);
    }
    candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)
}

/// SwiGLU: a = silu(g) ⊙ u.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    section("swiglu", gate.device(), || {
        #[cfg(feature = "cuda")]
        if gate.device().is_cuda() {
            return super::ops_cuda::swiglu(gate, up);
        }
        gate.silu()? * up
    })
}

/// Returns (d_gate, d_up): silu'(g) = σ(g)(1 + g(1 − σ(g))).
pub fn swiglu_backward(gate: &Tensor, up: &Tensor, da: &Tensor) -> Result<(Tensor, Tensor)> {
    section("swiglu.backward", gate.device(), || {
        #[cfg(feature = "cuda")]
        if gate.device().is_cuda() {
            return super::ops_cuda::swiglu_backward(gate, up, da);
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
    use super::*;

    fn randn(shape: &[usize], seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let scale = b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        diff / scale.max(1e-12)
    }

    /// Checks a hand backward against candle's autograd on the same composed forward.
    fn autograd_grad(x: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>, dy: &Tensor) -> Tensor {
        let xv = candle_core::Var::from_tensor(x).unwrap();
        let y = f(xv.as_tensor()).unwrap();
        let grads = (y * dy).unwrap().sum_all().unwrap().backward().unwrap();
        grads.get(xv.as_tensor()).unwrap().clone()
    }

    #[test]
    fn rms_norm_backward_matches_autograd() {
        let x = randn(&[5, 16], 1);
        let w = (randn(&[16], 2) + 1.0).unwrap();
        let dy = randn(&[5, 16], 3);
        let y = rms_norm(&x, &w, 1e-5).unwrap();
        let y_ref = candle_nn::ops::rms_norm_slow(&x, &w, 1e-5).unwrap();
        assert!(max_rel(&y, &y_ref) < 1e-6);
        let dx = rms_norm_backward(&x, &w, 1e-5, &dy).unwrap();
        let dx_ref = autograd_grad(&x, |x| candle_nn::ops::rms_norm_slow(x, &w, 1e-5), &dy);
        assert!(max_rel(&dx, &dx_ref) < 1e-5, "{}", max_rel(&dx, &dx_ref));
    }

    fn rope_slow(x: &Tensor, rope: &Rope) -> Result<Tensor> {
        let (cos, sin) = rope.tables(0, x.dim(2)?)?;
        let cos = Tensor::cat(&[&cos, &cos], D::Minus1)?;
        let sin = Tensor::cat(&[&sin, &sin], D::Minus1)?;
        let half = x.dim(D::Minus1)? / 2;
        let rotated =
            Tensor::cat(&[&x.narrow(D::Minus1, half, half)?.neg()?, &x.narrow(D::Minus1, 0, half)?], 3)?;
        x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
    }

    #[test]
    fn rope_matches_rotate_half_and_backward_matches_autograd() {
        let rope = Rope::new(8, 10000.0, 32, DType::F32, &Device::Cpu).unwrap();
        let x = randn(&[2, 3, 7, 8], 4);
        let dy = randn(&[2, 3, 7, 8], 5);
        assert!(max_rel(&rope.apply(&x, 0).unwrap(), &rope_slow(&x, &rope).unwrap()) < 1e-6);
        let dx = rope.backward(&dy, 0).unwrap();
        let dx_ref = autograd_grad(&x, |x| rope_slow(x, &rope), &dy);
        assert!(max_rel(&dx, &dx_ref) < 1e-6);
    }

    #[test]
    fn swiglu_backward_matches_autograd() {
        let g = (randn(&[4, 6], 6) * 3.0).unwrap();
        let u = randn(&[4, 6], 7);
        let da = randn(&[4, 6], 8);
        let (dg, du) = swiglu_backward(&g, &u, &da).unwrap();
        let slow = |g: &Tensor, u: &Tensor| (g * candle_nn::ops::sigmoid(g)?)? * u;
        let dg_ref = autograd_grad(&g, |g| slow(g, &u), &da);
        let du_ref = autograd_grad(&u, |u| slow(&g, u), &da);
        assert!(max_rel(&dg, &dg_ref) < 1e-5);
        assert!(max_rel(&du, &du_ref) < 1e-6);
    }

    /// RoPE on a `[b, h, t, d]` view of `[b, t, h, d]` memory (rotated in place of layout) equals
    /// RoPE on the contiguous heads, forward and backward, and stays a view.
    #[test]
    fn rope_on_a_head_view_equals_rope_on_contiguous_heads() {
        let rope = Rope::new(16, 10_000.0, 64, DType::F32, &Device::Cpu).unwrap();
        let thd = randn(&[2, 7, 3, 16], 21);
        let view = thd.transpose(1, 2).unwrap();
        let contiguous = view.contiguous().unwrap();
        for offset in [0, 5] {
            let (a, b) = (rope.apply(&view, offset).unwrap(), rope.apply(&contiguous, offset).unwrap());
            assert!(!a.is_contiguous() && a.transpose(1, 2).unwrap().is_contiguous());
            assert_eq!(max_rel(&a.contiguous().unwrap(), &b), 0.0);
            let (a, b) = (rope.backward(&view, offset).unwrap(), rope.backward(&contiguous, offset).unwrap());
            assert!(max_rel(&a.contiguous().unwrap(), &b) < 1e-6);
        }
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
