//! The decode rows' projections on CUDA: the projections that read one input (q/k/v, gate/up,
//! or one alone) as one NF4 GEMV launch, each with its LoRA term, bias and (for a lone
//! projection) the residual stream added in the kernel, all summed in f32 and rounded once; the
//! group's adapters' h = scale · x·Aᵀ is one `lora_down` launch before it, straight from the f32
//! A (no cast of the adapters' weights, no 16-bit copy of a base weight).

use candle_core::{DType, Device, Result, Tensor};

use super::linear::LoraLinear;

/// Whether `project_group` takes `projs` on a fresh contiguous input of `rows` rows in `dtype`
/// on `device`: CUDA, at most three projections of one input width, each an NF4 base the GEMV
/// takes, its bias (if any) in `dtype`, its adapter (if any) in f32.
pub fn applies(projs: &[&LoraLinear], rows: usize, dtype: DType, device: &Device) -> bool {
    #[cfg(feature = "cuda")]
    {
        use super::linear::BaseWeight;
        use crate::cuda::lora_down::lora_supports;
        use crate::cuda::nf4_gemv::{supports_shape, MAX_SEGMENTS};
        let Some(in_dim) = projs.first().map(|p| p.base.dims().1) else { return false };
        device.is_cuda()
            && projs.len() <= MAX_SEGMENTS
            && projs.iter().all(|p| {
                let BaseWeight::Nf4(q) = &p.base else { return false };
                q.device().same_device(device)
                    && p.base.dims().1 == in_dim
                    && supports_shape(rows, dtype, p.base.dims())
                    && p.bias.as_ref().is_none_or(|b| b.dtype() == dtype && b.is_contiguous())
                    && p.lora.as_ref().is_none_or(|l| {
                        lora_supports(l.lora_a.as_tensor(), l.lora_b.as_tensor(), in_dim, device)
                    })
            })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (projs, rows, dtype, device);
        false
    }
}

/// Each projection's output `[n, out_i]` for x `[n, in]` (`applies` must hold), the first one
/// plus `residual` where given: base + bias + LoRA term, in two launches for the group.
pub fn project_group(projs: &[&LoraLinear], x: &Tensor, residual: Option<&Tensor>) -> Result<Vec<Tensor>> {
    #[cfg(feature = "cuda")]
    {
        use super::linear::BaseWeight;
        use crate::cuda::lora_down::lora_down;
        use crate::cuda::nf4_gemv::{alloc_outputs, gemv_segments, gemv_segments_after_lora_down, LoraUp};
        let mut segments = Vec::with_capacity(projs.len());
        for (i, p) in projs.iter().enumerate() {
            let BaseWeight::Nf4(q) = &p.base else {
                candle_core::bail!("the fused decode projections need an NF4 base")
            };
            let Some(mut segment) = q.gemv_segment(x) else {
                candle_core::bail!("the NF4 GEMV does not take x {:?} {:?}", x.dims(), x.dtype())
            };
            segment.bias = p.bias.as_ref();
            segment.residual = residual.filter(|_| i == 0);
            segments.push(segment);
        }
        // the outputs first, so that nothing comes between lora_down and the projections'
        // launch, which then overlaps it
        let outputs = alloc_outputs(x, &mut segments)?;
        let adapters: Vec<_> = projs.iter().filter_map(|p| p.lora.as_ref()).collect();
        if adapters.is_empty() {
            // SAFETY: each y is a fresh output of x's rows and dtype, every element written.
            unsafe { gemv_segments(x, &segments, false)? };
            return Ok(outputs);
        }
        let a: Vec<_> = adapters.iter().map(|l| (l.lora_a.as_tensor(), l.scale)).collect();
        let h = lora_down(x, &a)?;
        let mut col = 0;
        for (p, segment) in projs.iter().zip(segments.iter_mut()) {
            if let Some(l) = &p.lora {
                segment.lora = Some(LoraUp { h: &h, col, b: l.lora_b.as_tensor() });
                col += l.rank();
            }
        }
        // SAFETY: as above; h is the lora_down launched just before.
        unsafe { gemv_segments_after_lora_down(x, &segments)? };
        Ok(outputs)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (projs, x, residual);
        candle_core::bail!("the fused decode projections run on CUDA only")
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use candle_core::{DType, Device, Result, Tensor, Var};

    use super::*;
    use crate::model::lora::linear::BaseWeight;
    use crate::model::lora::LoraAdapter;
    use crate::model::ops::test_util::randn;
    use crate::quant::Nf4Tensor;
    use crate::testing::assert_within_reference_error;

    /// A projection `[out, in]` with an NF4 base (double-quantized), a bias in `dtype` where
    /// asked, a random adapter of `rank` where non-zero; and its exact f64 pieces on the CPU.
    fn projection(
        (out, inp): (usize, usize),
        (bias, rank): (bool, usize),
        dtype: DType,
        seed: u64,
        gpu: &Device,
    ) -> Result<(LoraLinear, [Option<Tensor>; 4])> {
        let w = (randn(&[out, inp], seed) * 0.05)?;
        let q = Nf4Tensor::quantize(&w.to_device(gpu)?, true)?;
        let w64 = Nf4Tensor::quantize(&w, true)?.dequantize(DType::F32)?.to_dtype(DType::F64)?;
        // the bias as stored (rounded to the dtype), exact from there on
        let b = (randn(&[out], seed + 1) * 0.1)?.to_dtype(dtype)?;
        let lora = (rank > 0).then(|| -> Result<_> {
            let a = (randn(&[rank, inp], seed + 2) * 0.1)?;
            let bm = (randn(&[out, rank], seed + 3) * 0.1)?;
            Ok((a, bm))
        });
        let lora = lora.transpose()?;
        let scale = 2.0;
        let adapter = match &lora {
            Some((a, bm)) => Some(LoraAdapter {
                lora_a: Var::from_tensor(&a.to_device(gpu)?)?,
                lora_b: Var::from_tensor(&bm.to_device(gpu)?)?,
                scale,
                dropout: 0.0,
            }),
            None => None,
        };
        let exact_lora = match &lora {
            Some((a, bm)) => Some(((a.to_dtype(DType::F64)?.t()? * scale)?, bm.to_dtype(DType::F64)?.t()?)),
            None => None,
        };
        let linear = LoraLinear {
            base: BaseWeight::Nf4(q),
            bias: bias.then(|| b.to_device(gpu)).transpose()?,
            lora: adapter,
        };
        let pieces = [
            Some(w64.t()?),
            bias.then(|| b.to_dtype(DType::F64)).transpose()?,
            exact_lora.as_ref().map(|(a, _)| a.clone()),
            exact_lora.map(|(_, b)| b),
        ];
        Ok((linear, pieces))
    }

    /// A group of three projections (q/k/v-like: a bias on two, adapters of ranks 8 and 3 on
    /// two) and a lone one with the residual added, in one launch each, against the exact f64
    /// product on the CPU, held to the crate's multiple of the error of each projection's own
    /// path (`LoraLinear::forward`: the low-rank GEMMs, then the GEMV accumulating onto them; the
    /// residual added after), for 1, 3 and 8 rows in f16 and bf16 at widths for each GEMV kernel,
    /// and 9, 24 and 64 rows where the lookup kernel takes the width.
    #[test]
    fn a_fused_group_equals_its_projections_run_one_by_one() -> Result<()> {
        let gpu = Device::new_cuda(0)?;
        // widths the CUDA-core kernel takes (128, 192), and the tensor cores' (256, 512)
        for (inp, lone_in) in [(128, 192), (256, 512)] {
            for dtype in [DType::F16, DType::BF16] {
                let specs = [((96, inp), (true, 8)), ((64, inp), (true, 0)), ((150, inp), (false, 3))];
                let mut projs = Vec::new();
                for (i, &(shape, extras)) in specs.iter().enumerate() {
                    projs.push(projection(shape, extras, dtype, 10 * i as u64, &gpu)?);
                }
                let (lone, lone_exact) = projection((inp, lone_in), (false, 8), dtype, 77, &gpu)?;
                // past 8 rows where the lookup kernel takes the width
                let rows: &[usize] = if inp % 256 == 0 { &[1, 3, 8, 9, 24, 64] } else { &[1, 3, 8] };
                for &n in rows {
                    let x = randn(&[n, inp], 500 + n as u64).to_dtype(dtype)?;
                    let x_gpu = x.to_device(&gpu)?;
                    let x64 = x.to_dtype(DType::F64)?;
                    let exact = |pieces: &[Option<Tensor>; 4], x64: &Tensor| -> Result<Tensor> {
                        let mut y = x64.matmul(pieces[0].as_ref().unwrap())?;
                        if let Some(b) = &pieces[1] {
                            y = y.broadcast_add(b)?;
                        }
                        if let (Some(a), Some(b)) = (&pieces[2], &pieces[3]) {
                            y = (y + x64.matmul(a)?.matmul(b)?)?;
                        }
                        Ok(y)
                    };
                    let members: Vec<&LoraLinear> = projs.iter().map(|(p, _)| p).collect();
                    assert!(applies(&members, n, dtype, &gpu));
                    let ours = project_group(&members, &x_gpu, None)?;
                    for (i, ((p, pieces), y)) in projs.iter().zip(&ours).enumerate() {
                        let reference = p.forward(&x_gpu, None)?;
                        let what = format!("member {i}, n={n}, {dtype:?}");
                        assert_within_reference_error(&what, y, &reference, &exact(pieces, &x64)?);
                    }
                    // the lone projection reads a wider input and adds the residual stream
                    let x2 = randn(&[n, lone_in], 900 + n as u64).to_dtype(dtype)?;
                    let residual = randn(&[n, inp], 950 + n as u64).to_dtype(dtype)?;
                    let (x2_gpu, residual_gpu) = (x2.to_device(&gpu)?, residual.to_device(&gpu)?);
                    assert!(applies(&[&lone], n, dtype, &gpu));
                    let ours = project_group(&[&lone], &x2_gpu, Some(&residual_gpu))?.remove(0);
                    let reference = (lone.forward(&x2_gpu, None)? + &residual_gpu)?;
                    let exact =
                        (exact(&lone_exact, &x2.to_dtype(DType::F64)?)? + residual.to_dtype(DType::F64)?)?;
                    assert_within_reference_error(
                        &format!("lone, n={n}, {dtype:?}"),
                        &ours,
                        &reference,
                        &exact,
                    );
                }
                // what the launch does not take: a row past the most, f32, a dense base
                let members: Vec<&LoraLinear> = projs.iter().map(|(p, _)| p).collect();
                assert!(!applies(&members, rows[rows.len() - 1] + 1, dtype, &gpu));
                assert!(!applies(&members, 2, DType::F32, &gpu));
            }
        }
        let dense = LoraLinear {
            base: BaseWeight::Dense(randn(&[32, 64], 1).to_device(&gpu)?),
            bias: None,
            lora: None,
        };
        assert!(!applies(&[&dense], 2, DType::F16, &gpu));
        Ok(())
    }
}
