//! The NF4 GEMV's two kernels against the dequantize + matmul path they replace, on the GPU.

use candle_core::{DType, Device, Result, Tensor};

use super::{gemv_outputs_on, Kernel};
use crate::model::ops::test_util::randn;
use crate::quant::{nf4_gemv, nf4_gemv_applies, Nf4Tensor};

/// max |a − b| over the tensor, in f64 on the CPU.
fn max_abs_err(a: &Tensor, b: &Tensor) -> Result<f64> {
    let f64 = |t: &Tensor| t.to_device(&Device::Cpu)?.to_dtype(DType::F64);
    (f64(a)? - f64(b)?)?.abs()?.max_all()?.to_scalar::<f64>()
}

/// The GEMV against the exact product, x · Wᵀ in f64 on the host with W the CPU
/// reference's dequantized weight (f32 values code · absmax), held to the error of the stack
/// it replaces — the dequantize kernel's 16-bit weight, then candle's matmul in the same
/// dtype — against that same exact product: max abs error ≤ 2 × the stack's + ε, with
/// ε = 2⁻²³ · max |exact|.
///
/// Why that bound: both paths multiply the same 16-bit x by the weights code · absmax (the
/// stack rounds each to the dtype; the GEMV keeps it exact in f32), accumulate in f32 and
/// round each output once to the dtype. The GEMV's error against the exact product is the
/// output's final rounding and its summation order; the stack's adds the weights' 16-bit
/// rounding, measured on this very data. At the worst element the final roundings can fall
/// on opposite sides, hence twice the stack's error, and ε (an f32 ulp of the largest
/// output) keeps a stack error that happened to cancel from demanding the impossible.
///
/// Llama-3.1-8B's projection shapes (q/o, gate/up, down), SmolLM2-135M-like ones whose `in`
/// is not a multiple of the 1024 columns a warp covers per pass (576, 1536) and whose `out`
/// is not a multiple of a block's rows (1000, also with `in` = 256: one super-chunk a row), n = 1,
/// 3 and 8 batch rows (9, 24 and 64 too where `in` is a multiple of 256), f16 and bf16, plain and double-quantized absmax; each
/// through the kernel chosen for it and through every kernel that takes the width (the tensor
/// cores: a multiple of 256). The tensor-core
/// kernel rounds each weight as the stack does, so its error is the stack's up to the order
/// of the sums: the same bound holds.
#[test]
fn nf4_gemv_is_within_twice_the_dequantize_matmul_error() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let shapes =
        [(4096, 4096), (14336, 4096), (4096, 14336), (1000, 576), (576, 1536), (1000, 768), (1000, 256)];
    for (i, &(out_dim, in_dim)) in shapes.iter().enumerate() {
        let w = (randn(&[out_dim, in_dim], 100 + i as u64) * 0.05)?;
        let x64 = randn(&[64, in_dim], 200 + i as u64);
        let w_gpu = w.to_device(&gpu)?;
        for double_quant in [false, true] {
            let q_cpu = Nf4Tensor::quantize(&w, double_quant)?;
            let q = Nf4Tensor::quantize(&w_gpu, double_quant)?;
            let w64 = q_cpu.dequantize(DType::F32)?.to_dtype(DType::F64)?;
            for dtype in [DType::F16, DType::BF16] {
                let x64 = x64.to_dtype(dtype)?;
                // the first n rows of the exact product are the exact product of n rows
                let exact64 = x64.to_dtype(DType::F64)?.matmul(&w64.t()?)?;
                let w16 = q.dequantize(dtype)?;
                // past 8 rows where the lookup kernel takes the width
                let rows: &[usize] = if in_dim % 256 == 0 { &[1, 3, 8, 9, 24, 64] } else { &[1, 3, 8] };
                for &n in rows {
                    let x = x64.narrow(0, 0, n)?.contiguous()?.to_device(&gpu)?;
                    assert!(nf4_gemv_applies(&x, &q));
                    let exact = exact64.narrow(0, 0, n)?;
                    let stack = x.matmul(&w16.t()?)?;
                    let stack_err = max_abs_err(&stack, &exact)?;
                    let scale = exact.abs()?.max_all()?.to_scalar::<f64>()?;
                    let bound = 2.0 * stack_err + scale * f32::EPSILON as f64;
                    let mut outputs = vec![(None, nf4_gemv(&x, &q)?)];
                    let kernels = [Kernel::Lanes, Kernel::TensorCores, Kernel::Lookup, Kernel::LookupGemm];
                    for kernel in kernels.into_iter().filter(|k| k.takes(in_dim) && n <= k.max_rows()) {
                        let segment = q.gemv_segment(&x).expect("the GEMV takes x");
                        outputs.push((Some(kernel), gemv_outputs_on(kernel, &x, vec![segment])?.remove(0)));
                    }
                    for (kernel, ours) in outputs {
                        assert_eq!(ours.dims(), &[n, out_dim]);
                        assert_eq!(ours.dtype(), dtype);
                        let err = max_abs_err(&ours, &exact)?;
                        let what = format!(
                            "[{out_dim}, {in_dim}] n={n} {dtype:?} double_quant={double_quant} {kernel:?}"
                        );
                        eprintln!("{what}: max abs err {err:.3e}, dequantize + matmul {stack_err:.3e}");
                        assert!(err <= bound, "{what}: {err:.3e} > {bound:.3e}");
                    }
                }
            }
        }
    }
    Ok(())
}

/// Inputs the kernel does not take are refused (the caller then dequantizes): more than 8
/// rows, f32, `in` not a multiple of 32, a CPU x, a non-contiguous x.
#[test]
fn nf4_gemv_refuses_what_it_does_not_take() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let on = |t: Tensor, dtype: DType| t.to_dtype(dtype)?.to_device(&gpu);
    let q = Nf4Tensor::quantize(&on(randn(&[64, 128], 1), DType::F32)?, true)?;
    let odd = Nf4Tensor::quantize(&on(randn(&[64, 80], 2), DType::F32)?, true)?;
    let refused = [
        (on(randn(&[9, 128], 3), DType::BF16)?, &q),
        (on(randn(&[2, 128], 3), DType::F32)?, &q),
        (randn(&[2, 128], 3).to_dtype(DType::F16)?, &q),
        (on(randn(&[128, 2], 3), DType::F16)?.t()?, &q),
        (on(randn(&[2, 80], 3), DType::F16)?, &odd),
    ];
    for (x, w) in refused {
        assert!(!nf4_gemv_applies(&x, w), "{:?} {:?}", x.dims(), x.dtype());
        assert!(nf4_gemv(&x, w).is_err());
    }
    assert!(nf4_gemv_applies(&on(randn(&[8, 128], 3), DType::BF16)?, &q));
    Ok(())
}

/// The serving planner's `DECODE_SCRATCH` holds the decode kernels' workspaces (the lookup GEMM's
/// fragments and `lora_down_split`'s splits, sums and counts) on the largest GPU it is sized for,
/// and on an H200's 132 multiprocessors those are what the engine allocates (about 18 MiB).
#[test]
fn the_planned_decode_scratch_holds_the_kernels_workspaces() {
    use crate::plan::serving::{DECODE_SCRATCH, SCRATCH_MULTIPROCESSORS};
    let bytes = |sms: usize| {
        4 * (crate::cuda::nf4_lut_gemm::workspace_sums(sms)
            + crate::cuda::nf4_lut_gemm::WORKSPACE_COUNTS
            + crate::cuda::lora_down::workspace_sums(sms)
            + crate::cuda::lora_down::WORKSPACE_COUNTS) as u64
    };
    assert_eq!(bytes(SCRATCH_MULTIPROCESSORS as usize), DECODE_SCRATCH);
    assert_eq!(bytes(132), 132 * (131_072 + 8_192) + 65_536 + 4_096);
}
