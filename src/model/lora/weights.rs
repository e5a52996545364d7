//! The LoRA weights of projections in the compute dtype, for one forward and its backward:
//! [A₁; …; Aₙ] `[Σr, in]` and each scale_i·B_i `[out_i, r_i]`. The trained f32 tensors are
//! detached: the training path has its own backward, and a tracked `Var` would make candle keep
//! every intermediate of the forward alive. On CUDA one launch casts them all
//! (`cuda::lora_weights`); elsewhere, and as its reference, a concatenation, a scale and a cast.

use candle_core::{DType, Result, Tensor};

use super::linear::LoraAdapter;

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
