//! `LoraLinear`'s forward through the NF4 GEMV and GEMM on CUDA (decode batches, short prefills)
//! against the dequantize path they replace there.

use candle_core::{DType, Device, Result, Tensor, Var};

use super::{BaseWeight, LoraAdapter, LoraLinear};
use crate::model::ops::test_util::randn;
use crate::quant::Nf4Tensor;

/// `LoraLinear::forward` of a decode batch (1, 3, 8 rows; 24 and 64 where `in` is a multiple of
/// 256) on CUDA with an NF4 base, which takes the NF4 GEMV (accumulated in place onto the
/// low-rank product, then the bias), held to the dequantize path — the same projection with the dequantize kernel's 16-bit weight
/// as a dense base — by the rule of `cuda::nf4_gemv`'s test: against the exact output (f64
/// on the host, from the CPU reference's dequantized weight and the f32 adapter and bias),
/// max abs error ≤ 2 × the dequantize path's + 2⁻²³ · max |exact|. Both paths round the same
/// operands to the compute dtype and each GEMM output once; only f32 summation orders differ.
#[test]
fn nf4_gemv_forward_is_within_twice_the_dequantize_path_error() -> Result<()> {
    forward_is_within_twice_the_dequantize_path_error(&[1, 3, 8, 24, 64], crate::quant::nf4_gemv_applies)
}

/// The same for batches of 9 to 64 rows whose `in` the GEMV takes only up to 8 rows (1000 × 576,
/// with a partial last block of columns and a bias), which take the NF4 GEMM, with the same
/// bound.
#[test]
fn cuda_nf4_gemm_forward_is_within_twice_the_dequantize_path_error() -> Result<()> {
    forward_is_within_twice_the_dequantize_path_error(&[17, 64], |x, q| {
        crate::quant::nf4_gemm_applies(x, q) && !crate::quant::nf4_gemv_applies(x, q)
    })
}

/// The forward of `rows`-row batches against the dequantize path, on those that take the kernel
/// under test (`takes`); at least one does.
fn forward_is_within_twice_the_dequantize_path_error(
    rows: &[usize],
    takes: fn(&Tensor, &Nf4Tensor) -> bool,
) -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let f64 = |t: &Tensor| t.to_device(&Device::Cpu)?.to_dtype(DType::F64);
    let err = |a: &Tensor, b: &Tensor| -> Result<f64> { (f64(a)? - f64(b)?)?.abs()?.max_all()?.to_scalar() };
    let mut runs = 0;
    for (out_dim, in_dim, with_bias) in [(4096, 4096, false), (1000, 576, true)] {
        let w = (randn(&[out_dim, in_dim], 7) * 0.05)?;
        let (a, b) = ((randn(&[8, in_dim], 8) * 0.05)?, (randn(&[out_dim, 8], 9) * 0.05)?);
        let bias = (randn(&[out_dim], 10) * 0.1)?;
        let q = Nf4Tensor::quantize(&w.to_device(&gpu)?, true)?;
        let w64 = f64(&Nf4Tensor::quantize(&w, true)?.dequantize(DType::F32)?)?;
        let lora = || -> Result<LoraAdapter> {
            let (a, b) = (Var::from_tensor(&a.to_device(&gpu)?)?, Var::from_tensor(&b.to_device(&gpu)?)?);
            Ok(LoraAdapter { lora_a: a, lora_b: b, scale: 2.0, dropout: 0.0 })
        };
        for dtype in [DType::F16, DType::BF16] {
            let bias_d = if with_bias { Some(bias.to_dtype(dtype)?.to_device(&gpu)?) } else { None };
            let gemv =
                LoraLinear { base: BaseWeight::Nf4(q.clone()), bias: bias_d.clone(), lora: Some(lora()?) };
            let dequantized = LoraLinear {
                base: BaseWeight::Dense(q.dequantize(dtype)?),
                bias: bias_d,
                lora: Some(lora()?),
            };
            for &n in rows {
                let x = randn(&[n, in_dim], 11 + n as u64).to_dtype(dtype)?;
                let xg = x.to_device(&gpu)?;
                if !takes(&xg, &q) {
                    continue;
                }
                runs += 1;
                let (ours, stack) = (gemv.forward(&xg, None)?, dequantized.forward(&xg, None)?);
                let x64 = f64(&x)?;
                let low_rank = (x64.matmul(&f64(&a)?.t()?)?.matmul(&f64(&b)?.t()?)? * 2.0)?;
                let mut exact = (x64.matmul(&w64.t()?)? + low_rank)?;
                if with_bias {
                    exact = exact.broadcast_add(&f64(&bias)?)?;
                }
                let (e, e_stack) = (err(&ours, &exact)?, err(&stack, &exact)?);
                let scale = exact.abs()?.max_all()?.to_scalar::<f64>()?;
                let bound = 2.0 * e_stack + scale * f32::EPSILON as f64;
                let what = format!("[{out_dim}, {in_dim}] n={n} {dtype:?} bias={with_bias}");
                eprintln!("{what}: max abs err {e:.3e}, dequantize path {e_stack:.3e}");
                assert!(e <= bound, "{what}: {e:.3e} > {bound:.3e}");
            }
        }
    }
    assert!(runs > 0, "no batch took the kernel under test");
    Ok(())
}
