//! The NF4 GEMM against the dequantize + matmul path it replaces, on the GPU.

use candle_core::{DType, Device, Result, Tensor};

use crate::model::ops::test_util::randn;
use crate::quant::{nf4_gemm, nf4_gemm_applies, Nf4Tensor};

/// max |a − b| over the tensor, in f64 on the GPU.
fn max_abs_err(a: &Tensor, b: &Tensor) -> Result<f64> {
    (a.to_dtype(DType::F64)? - b.to_dtype(DType::F64)?)?.abs()?.max_all()?.to_scalar::<f64>()
}

/// The GEMM against the exact product, x · Wᵀ in f64 (cuBLAS' DGEMM) with W the dequantize
/// kernel's f32 weight (code · absmax, exact in f64), held to the error of the stack it replaces
/// — the dequantize kernel's 16-bit weight, then candle's matmul in the same dtype — against
/// that same exact product: max abs error ≤ 2 × the stack's + ε, with ε = 2⁻²³ · max |exact|,
/// the rule of the NF4 GEMV's test and for its reasons: both paths multiply the same 16-bit x
/// by the same 16-bit weight values, sum in f32 and round each output once, so only the f32
/// summation order (and where `in` is split, the order of the partial sums) differs.
///
/// Llama-3.1-8B's projection shapes (q/o, k/v, gate/up, down: `in` split over blocks or not)
/// and an odd one whose `out` is not a multiple of a block's 64 columns and whose `in` splits
/// unevenly (1000 × 576); m = 9, 16, 17, 64, 100, 256 rows (whole and partial 16-row tiles),
/// f16 and bf16, plain and double-quantized absmax.
#[test]
fn cuda_nf4_gemm_is_within_twice_the_dequantize_matmul_error() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let shapes = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (1000, 576)];
    for (i, &(out_dim, in_dim)) in shapes.iter().enumerate() {
        let w = (randn(&[out_dim, in_dim], 300 + i as u64) * 0.05)?.to_device(&gpu)?;
        let x256 = randn(&[256, in_dim], 400 + i as u64).to_device(&gpu)?;
        for double_quant in [false, true] {
            let q = Nf4Tensor::quantize(&w, double_quant)?;
            let w64 = q.dequantize(DType::F32)?.to_dtype(DType::F64)?;
            for dtype in [DType::F16, DType::BF16] {
                let x256 = x256.to_dtype(dtype)?;
                // the first m rows of the exact product are the exact product of m rows
                let exact256 = x256.to_dtype(DType::F64)?.matmul(&w64.t()?)?;
                let w16 = q.dequantize(dtype)?;
                for m in [9, 16, 17, 64, 100, 256] {
                    let x = x256.narrow(0, 0, m)?.contiguous()?;
                    assert!(nf4_gemm_applies(&x, &q));
                    let exact = exact256.narrow(0, 0, m)?;
                    let ours = nf4_gemm(&x, &q)?;
                    assert_eq!(ours.dims(), &[m, out_dim]);
                    assert_eq!(ours.dtype(), dtype);
                    let stack = x.matmul(&w16.t()?)?;
                    let (err, stack_err) = (max_abs_err(&ours, &exact)?, max_abs_err(&stack, &exact)?);
                    let scale = exact.abs()?.max_all()?.to_scalar::<f64>()?;
                    let bound = 2.0 * stack_err + scale * f32::EPSILON as f64;
                    let what = format!("[{out_dim}, {in_dim}] m={m} {dtype:?} double_quant={double_quant}");
                    eprintln!("{what}: max abs err {err:.3e}, dequantize + matmul {stack_err:.3e}");
                    assert!(err <= bound, "{what}: {err:.3e} > {bound:.3e}");
                    // a wrong decode or a lost tile is orders of magnitude off, not a rounding
                    assert!(stack_err <= 0.05 * scale, "{what}: the reference itself is off");
                }
            }
        }
    }
    Ok(())
}

/// The product added in place onto what the target holds (`accumulate`), with `in` split over
/// blocks (q/o: 4096 × 4096, the partial sums added by the reduce kernel) and whole (gate/up:
/// 14336 × 4096, the sums added by the GEMM itself): y0 + x·Wᵀ against the exact y0 + x·Wᵀ,
/// by the rule above with the stack's own sum, y0 + (x·Wᵀ rounded), as its error.
#[test]
fn cuda_nf4_gemm_accumulates_onto_the_target() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    for (i, &(out_dim, in_dim)) in [(4096, 4096), (14336, 4096)].iter().enumerate() {
        let w = (randn(&[out_dim, in_dim], 500 + i as u64) * 0.05)?.to_device(&gpu)?;
        let q = Nf4Tensor::quantize(&w, true)?;
        let w64 = q.dequantize(DType::F32)?.to_dtype(DType::F64)?;
        for dtype in [DType::F16, DType::BF16] {
            let m = 64;
            let x = randn(&[m, in_dim], 600 + i as u64).to_dtype(dtype)?.to_device(&gpu)?;
            let y0 = (randn(&[m, out_dim], 700 + i as u64) * 4.0)?.to_dtype(dtype)?.to_device(&gpu)?;
            let y = y0.copy()?;
            let dev = crate::cuda::cuda_device(&y)?;
            let address = crate::cuda::address(&y, &dev.cuda_stream())?;
            // SAFETY: `y` is a fresh contiguous [m, out] tensor of x's dtype on x's device, held
            // across the launch and read only after it (the stream orders the copy back).
            unsafe { crate::quant::nf4_gemm_into(&x, &q, address, true)? };
            let exact = (y0.to_dtype(DType::F64)? + x.to_dtype(DType::F64)?.matmul(&w64.t()?)?)?;
            let stack = (&y0 + x.matmul(&q.dequantize(dtype)?.t()?)?)?;
            let (err, stack_err) = (max_abs_err(&y, &exact)?, max_abs_err(&stack, &exact)?);
            let scale = exact.abs()?.max_all()?.to_scalar::<f64>()?;
            let bound = 2.0 * stack_err + scale * f32::EPSILON as f64;
            let what = format!("[{out_dim}, {in_dim}] m={m} {dtype:?} accumulate");
            eprintln!("{what}: max abs err {err:.3e}, dequantize + matmul {stack_err:.3e}");
            assert!(err <= bound, "{what}: {err:.3e} > {bound:.3e}");
            // y0 alone is far off the sum: the product really was added
            assert!(max_abs_err(&y0, &exact)? > 10.0 * bound, "{what}: the product is too small to tell");
        }
    }
    Ok(())
}

/// Inputs the kernel does not take are refused (the caller then dequantizes): more than 256
/// rows, f32, `in` a multiple of 32 but not of 64 (which the GEMV takes), a CPU x, a
/// non-contiguous x.
#[test]
fn cuda_nf4_gemm_refuses_what_it_does_not_take() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let on = |t: Tensor, dtype: DType| t.to_dtype(dtype)?.to_device(&gpu);
    let q = Nf4Tensor::quantize(&on(randn(&[64, 128], 1), DType::F32)?, true)?;
    let odd = Nf4Tensor::quantize(&on(randn(&[64, 96], 2), DType::F32)?, true)?;
    let refused = [
        (on(randn(&[257, 128], 3), DType::BF16)?, &q),
        (on(randn(&[16, 128], 3), DType::F32)?, &q),
        (randn(&[16, 128], 3).to_dtype(DType::F16)?, &q),
        (on(randn(&[128, 16], 3), DType::F16)?.t()?, &q),
        (on(randn(&[16, 96], 3), DType::F16)?, &odd),
    ];
    for (x, w) in refused {
        assert!(!nf4_gemm_applies(&x, w), "{:?} {:?}", x.dims(), x.dtype());
        assert!(nf4_gemm(&x, w).is_err());
    }
    assert!(nf4_gemm_applies(&on(randn(&[256, 128], 3), DType::BF16)?, &q));
    Ok(())
}
