//! The trained part of a LoRA projection, `lora_a` and `lora_b` in f32, and the adapters' weights
//! in the compute dtype for one forward and its backward: [A₁; …; Aₙ] `[Σr, in]` and each
//! scale_i·B_i `[out_i, r_i]`. The trained tensors are detached: the training path has its own
//! backward, and a tracked `Var` would make candle keep every intermediate of the forward alive.
//! On CUDA one launch casts them all (`cuda::lora_weights`); elsewhere, and as its reference, a
//! concatenation, a scale and a cast.

use candle_core::{DType, Device, Result, Tensor, Var};
use rand::Rng;

/// The trained part: `lora_a` `[r, in]`, `lora_b` `[out, r]` (PEFT's shapes), in f32.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    pub lora_a: Var,
    pub lora_b: Var,
    pub scale: f64,
    pub dropout: f64,
}

impl LoraAdapter {
    /// PEFT's init: A ~ kaiming_uniform(a=√5) = U(-1/√in, 1/√in), B = 0, so training starts at
    /// exactly the base model.
    pub fn init(
        r: usize,
        (out_dim, in_dim): (usize, usize),
        scale: f64,
        dropout: f64,
        rng: &mut impl Rng,
        device: &Device,
    ) -> Result<Self> {
        let bound = 1.0 / (in_dim as f32).sqrt();
        let a: Vec<f32> = (0..r * in_dim).map(|_| rng.random_range(-bound..bound)).collect();
        let lora_a = Var::from_tensor(&Tensor::from_vec(a, (r, in_dim), device)?)?;
        let lora_b = Var::zeros((out_dim, r), DType::F32, device)?;
        Ok(Self { lora_a, lora_b, scale, dropout })
    }

    pub fn rank(&self) -> usize {
        self.lora_a.dim(0).unwrap_or(0)
    }

    /// A and scale·B in the compute dtype, detached: the training path has its own backward, and
    /// a tracked `Var` would make candle keep every intermediate of the forward alive. The scale
    /// goes on the small B rather than on the `[n, out]` product.
    pub(super) fn weights(&self, dtype: DType) -> Result<(Tensor, Tensor)> {
        let (a, mut scaled_b) = compute_dtype(&[self], dtype)?;
        Ok((a, scaled_b.remove(0)))
    }
}

/// `(a, scaled_b)`: the adapters' A stacked along dim 0, and each scale·B, in `dtype`.
pub fn compute_dtype(adapters: &[&LoraAdapter], dtype: DType) -> Result<(Tensor, Vec<Tensor>)> {
    #[cfg(feature = "cuda")]
    {
        use crate::cuda::lora_weights::{fits, scaled_casts};
        let tensors = || adapters.iter().flat_map(|l| [l.lora_a.as_tensor(), l.lora_b.as_tensor()]);
        if !adapters.is_empty() && tensors().all(fits) {
            let mut outputs = vec![adapters.iter().map(|l| (l.lora_a.as_tensor(), 1.0)).collect::<Vec<_>>()];
            outputs.extend(adapters.iter().map(|l| vec![(l.lora_b.as_tensor(), l.scale)]));
            let mut cast = scaled_casts(&outputs, dtype)?;
            let a = cast.remove(0);
            return Ok((a, cast));
        }
    }
    composed(adapters, dtype)
}

/// The same from candle's ops.
pub fn composed(adapters: &[&LoraAdapter], dtype: DType) -> Result<(Tensor, Vec<Tensor>)> {
    let parts = adapters.iter().map(|l| l.lora_a.as_tensor().detach()).collect::<Vec<_>>();
    let a = if parts.len() == 1 { parts[0].clone() } else { Tensor::cat(&parts, 0)? };
    let scaled_b = adapters
        .iter()
        .map(|l| (l.lora_b.as_tensor().detach() * l.scale)?.to_dtype(dtype))
        .collect::<Result<Vec<_>>>()?;
    Ok((a.to_dtype(dtype)?, scaled_b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::{rngs::StdRng, SeedableRng};

    /// Three adapters of different widths and scales, B random (PEFT's init has B = 0).
    fn adapters(dev: &Device) -> Result<Vec<LoraAdapter>> {
        let mut rng = StdRng::seed_from_u64(3);
        [(4, 24, 0.5), (2, 8, 2.0), (2, 8, 1.0 / 3.0)]
            .into_iter()
            .map(|(r, out, scale)| {
                let mut l = LoraAdapter::init(r, (out, 40), scale, 0.0, &mut rng, dev)?;
                l.lora_b = Var::from_tensor(&Tensor::randn(0f32, 1.0, (out, r), dev)?)?;
                Ok(l)
            })
            .collect()
    }

    fn values(t: &Tensor) -> Result<Vec<f64>> {
        t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
    }

    /// A stacked in order, each B times its scale.
    #[test]
    fn a_is_stacked_and_b_scaled() -> Result<()> {
        let adapters = adapters(&Device::Cpu)?;
        let (a, b) = compute_dtype(&adapters.iter().collect::<Vec<_>>(), DType::F32)?;
        assert_eq!(a.dims(), &[8, 40]);
        assert_eq!(values(&a.narrow(0, 4, 2)?)?, values(adapters[1].lora_a.as_tensor())?);
        assert_eq!(values(&b[2])?, values(&(adapters[2].lora_b.as_tensor() / 3.0)?)?);
        Ok(())
    }

    /// The one-launch cast gives the composed casts' bits, in f16, bf16 and f32.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_cast_equals_the_composed_casts() -> Result<()> {
        let adapters = adapters(&Device::new_cuda(0)?)?;
        let refs: Vec<&LoraAdapter> = adapters.iter().collect();
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let (a, b) = compute_dtype(&refs, dtype)?;
            let (a_ref, b_ref) = composed(&refs, dtype)?;
            assert_eq!((a.dtype(), a.dims()), (dtype, a_ref.dims()));
            assert_eq!(values(&a)?, values(&a_ref)?, "{dtype:?} A");
            for (i, (b, b_ref)) in b.iter().zip(&b_ref).enumerate() {
                assert_eq!(b.dims(), b_ref.dims());
                assert_eq!(values(b)?, values(b_ref)?, "{dtype:?} B {i}");
            }
        }
        Ok(())
    }
}
