//! The NF4 GEMV of `nf4_gemv.cu`: y `[n, out]` = x `[n, in]` · Wᵀ for a decode batch of at most
//! [`MAX_ROWS`] rows, read straight from W's packed NF4 codes and absmax (plain f32 or
//! double-quantized), without the 16-bit copy of W that dequantize + GEMM writes and reads back.
//! Each weight value is the one the dequantize kernel gives (the same decode, rounded to the
//! compute dtype), summed in f32. `quant::nf4_gemv` calls it with an `Nf4Tensor`'s parts.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, DType, Result, Tensor, WithDType};
use half::{bf16, f16};

use super::{address, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("nf4_gemv");

/// The most rows of x one launch takes (the kernel is instantiated for 1 to 8).
pub const MAX_ROWS: usize = 8;
/// Warps per block (`GEMV_WARPS` in nf4_gemv.cu).
const WARPS: usize = 8;
/// Batch rows × staged columns of x per tile: the tile (f32, with 4 floats of padding per 32)
/// stays under 48 KiB of shared memory, the most a launch gets without opting in.
const TILE_VALUES: usize = 10_000;

/// Output rows per warp for `n` batch rows (`GemvShape<N>::R` in nf4_gemv.cu).
fn rows_per_warp(n: usize) -> usize {
    if n <= 2 {
        2
    } else {
        4
    }
}

/// Columns of x staged at once: all of them when they fit, else the most whole multiples of
/// 1024 (32 lanes × 32 values) that do.
fn tile_columns(n: usize, in_dim: usize) -> usize {
    let fit = (TILE_VALUES / n.max(1)) / 1024 * 1024;
    in_dim.min(fit.max(1024))
}

/// The absmax of W's 64-value blocks, as `quant::Absmax` stores them.
pub enum Scales<'a> {
    /// One f32 per block.
    F32(&'a Tensor),
    /// 8-bit codes (one per block), f32 scales (one per 256 codes) and the offset added back.
    Double { codes: &'a Tensor, absmax2: &'a Tensor, offset: f32 },
}

/// Whether the kernel takes x `[n, in]` against a weight `[out_dim, in_dim]`: a CUDA f16/bf16
/// x, contiguous from a 16-byte boundary, 1 to `MAX_ROWS` rows, and `in` a multiple of 32 (so
/// each row of packed codes starts on a 16-byte boundary and each 16-byte load lies in one
/// absmax block). Anything else goes through dequantize + GEMM.
pub fn supports(x: &Tensor, out_dim: usize, in_dim: usize) -> bool {
    let Ok((n, cols)) = x.dims2() else { return false };
    x.device().is_cuda()
        && matches!(x.dtype(), DType::F16 | DType::BF16)
        && x.is_contiguous()
        && x.layout().start_offset().is_multiple_of(8)
        && (1..=MAX_ROWS).contains(&n)
        && cols == in_dim
        && in_dim.is_multiple_of(32)
        && in_dim > 0
        && out_dim > 0
        && in_dim <= i32::MAX as usize
        && out_dim <= i32::MAX as usize
}

/// x · Wᵀ as a new `[n, out_dim]` tensor in x's dtype; W is `[out_dim, x.dim(1)]`, its packed
/// codes `packed` (U8, two per byte, the first value in the high nibble) and its `scales`.
pub fn gemv(x: &Tensor, packed: &Tensor, scales: Scales, out_dim: usize) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 => gemv_typed::<f16>(x, packed, &scales, out_dim),
        DType::BF16 => gemv_typed::<bf16>(x, packed, &scales, out_dim),
        dt => bail!("the NF4 GEMV takes f16 or bf16, not {dt:?}"),
    }
}

/// y `[n, out_dim]` (x's dtype, row-major) at device address `y` set to x · Wᵀ, or added to
/// (the sum taken in f32 and rounded once) with `accumulate`.
///
/// # Safety
/// `y` must address `n · out_dim` elements of x's dtype on x's device, which no other work
/// reads or writes until this launch has run on the device's stream.
pub unsafe fn gemv_into(
    x: &Tensor,
    packed: &Tensor,
    scales: Scales,
    out_dim: usize,
    y: u64,
    accumulate: bool,
) -> Result<()> {
    match x.dtype() {
        DType::F16 => launch::<f16>(x, packed, &scales, out_dim, y, accumulate),
        DType::BF16 => launch::<bf16>(x, packed, &scales, out_dim, y, accumulate),
        dt => bail!("the NF4 GEMV takes f16 or bf16, not {dt:?}"),
    }
}

fn gemv_typed<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    packed: &Tensor,
    scales: &Scales,
    out_dim: usize,
) -> Result<Tensor> {
    let dev = cuda_device(x)?;
    let n = x.dim(0)?;
    // every element is written by the launch (accumulate off)
    let y = unsafe { dev.alloc::<T>(n * out_dim)? };
    let y = wrap(y, &dev, &[n, out_dim]);
    let address = address(&y, &dev.cuda_stream())?;
    // SAFETY: `y` is a fresh [n, out_dim] buffer of T on x's device, held across the launch.
    unsafe { launch::<T>(x, packed, scales, out_dim, address, false)? };
    Ok(y)
}

/// Checks the operands against each other and launches `nf4_gemv_<dtype>_<n>`.
unsafe fn launch<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    packed: &Tensor,
    scales: &Scales,
    out_dim: usize,
    y: u64,
    accumulate: bool,
) -> Result<()> {
    let (n, in_dim) = x.dims2()?;
    if !supports(x, out_dim, in_dim) {
        bail!(
            "the NF4 GEMV takes a contiguous f16/bf16 CUDA x of 1 to {MAX_ROWS} rows with a multiple of 32 \
             columns, not {:?} {:?} against [{out_dim}, {in_dim}]",
            x.dims(),
            x.dtype()
        );
    }
    let values = out_dim * in_dim;
    let blocks = values / 64;
    let contiguous = |t: &Tensor, dtype: DType, len: usize| {
        t.is_contiguous() && t.dtype() == dtype && t.elem_count() >= len && t.device().same_device(x.device())
    };
    if !contiguous(packed, DType::U8, values / 2) || !packed.layout().start_offset().is_multiple_of(16) {
        bail!(
            "NF4 GEMV: packed codes {:?} {:?} for a [{out_dim}, {in_dim}] weight",
            packed.dims(),
            packed.dtype()
        );
    }
    let scales_ok = match scales {
        Scales::F32(a) => contiguous(a, DType::F32, blocks),
        Scales::Double { codes, absmax2, .. } => {
            contiguous(codes, DType::U8, blocks) && contiguous(absmax2, DType::F32, blocks.div_ceil(256))
        }
    };
    if !scales_ok {
        bail!("NF4 GEMV: absmax of the wrong dtype, layout, device or length for a [{out_dim}, {in_dim}] weight");
    }
    let dev = cuda_device(x)?;
    let func = KERNELS.function(&dev, &format!("nf4_gemv_{}_{n}", suffix(T::DTYPE)?))?;
    let tile = tile_columns(n, in_dim);
    let rows_per_block = WARPS * rows_per_warp(n);
    let cfg = LaunchConfig {
        grid_dim: (out_dim.div_ceil(rows_per_block) as u32, 1, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        // n rows of the tile in f32, 4 floats of padding after every 32
        shared_mem_bytes: (n * (tile + tile / 8) * 4) as u32,
    };
    let (absmax, codes, absmax2, offset) = match scales {
        Scales::F32(a) => (Some(*a), None, None, 0f32),
        Scales::Double { codes, absmax2, offset } => (None, Some(*codes), Some(*absmax2), *offset),
    };
    let (gx, gp) = (x.storage_and_layout().0, packed.storage_and_layout().0);
    let ga = absmax.map(|t| t.storage_and_layout().0);
    let gc = codes.map(|t| t.storage_and_layout().0);
    let g2 = absmax2.map(|t| t.storage_and_layout().0);
    let xv = view::<T>(&gx, x)?;
    let pv = view::<u8>(&gp, packed)?;
    let av = match (&ga, absmax) {
        (Some(g), Some(t)) => Some(view::<f32>(g, t)?),
        _ => None,
    };
    let cv = match (&gc, codes) {
        (Some(g), Some(t)) => Some(view::<u8>(g, t)?),
        _ => None,
    };
    let sv = match (&g2, absmax2) {
        (Some(g), Some(t)) => Some(view::<f32>(g, t)?),
        _ => None,
    };
    let null = 0u64;
    let (out_i, in_i, tile_i, acc) = (out_dim as i32, in_dim as i32, tile as i32, accumulate as i32);
    let mut b = func.builder();
    b.arg(&xv).arg(&pv);
    match &av {
        Some(v) => b.arg(v),
        None => b.arg(&null),
    };
    match (&cv, &sv) {
        (Some(c), Some(s)) => b.arg(c).arg(s),
        _ => b.arg(&null).arg(&null),
    };
    b.arg(&offset).arg(&y).arg(&out_i).arg(&in_i).arg(&tile_i).arg(&acc);
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use candle_core::{DType, Device, Result, Tensor};

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
    /// Why that bound: both paths multiply the same 16-bit x by the same 16-bit weight values
    /// (the GEMV decodes each weight as the dequantize kernel does and rounds it to the dtype),
    /// accumulate in f32 and round each output once to the dtype. Their errors against the exact
    /// product therefore have the same two sources, measured by the stack's own error on this
    /// very data: the weight's rounding to 16 bits and the output's final rounding. What differs
    /// is the f32 summation order, orders of magnitude below either; at the worst element the
    /// two paths' final roundings can still fall on opposite sides, hence twice the stack's
    /// error, and ε (an f32 ulp of the largest output) keeps a stack error that happened to
    /// cancel from demanding the impossible.
    ///
    /// Llama-3.1-8B's projection shapes (q/o, gate/up, down), SmolLM2-135M-like ones whose `in`
    /// is not a multiple of the 1024 columns a warp covers per pass (576, 1536) and whose `out`
    /// is not a multiple of a block's rows (1000), n = 1, 3 and 8 batch rows, f16 and bf16,
    /// plain and double-quantized absmax.
    #[test]
    fn nf4_gemv_is_within_twice_the_dequantize_matmul_error() -> Result<()> {
        let gpu = Device::new_cuda(0)?;
        let shapes = [(4096, 4096), (14336, 4096), (4096, 14336), (1000, 576), (576, 1536)];
        for (i, &(out_dim, in_dim)) in shapes.iter().enumerate() {
            let w = (randn(&[out_dim, in_dim], 100 + i as u64) * 0.05)?;
            let x8 = randn(&[8, in_dim], 200 + i as u64);
            let w_gpu = w.to_device(&gpu)?;
            for double_quant in [false, true] {
                let q_cpu = Nf4Tensor::quantize(&w, double_quant)?;
                let q = Nf4Tensor::quantize(&w_gpu, double_quant)?;
                let w64 = q_cpu.dequantize(DType::F32)?.to_dtype(DType::F64)?;
                for dtype in [DType::F16, DType::BF16] {
                    let x8 = x8.to_dtype(dtype)?;
                    // the first n rows of the exact product are the exact product of n rows
                    let exact8 = x8.to_dtype(DType::F64)?.matmul(&w64.t()?)?;
                    let w16 = q.dequantize(dtype)?;
                    for n in [1, 3, 8] {
                        let x = x8.narrow(0, 0, n)?.contiguous()?.to_device(&gpu)?;
                        assert!(nf4_gemv_applies(&x, &q));
                        let exact = exact8.narrow(0, 0, n)?;
                        let ours = nf4_gemv(&x, &q)?;
                        assert_eq!(ours.dims(), &[n, out_dim]);
                        assert_eq!(ours.dtype(), dtype);
                        let stack = x.matmul(&w16.t()?)?;
                        let (err, stack_err) = (max_abs_err(&ours, &exact)?, max_abs_err(&stack, &exact)?);
                        let scale = exact.abs()?.max_all()?.to_scalar::<f64>()?;
                        let bound = 2.0 * stack_err + scale * f32::EPSILON as f64;
                        let what =
                            format!("[{out_dim}, {in_dim}] n={n} {dtype:?} double_quant={double_quant}");
                        eprintln!("{what}: max abs err {err:.3e}, dequantize + matmul {stack_err:.3e}");
                        assert!(err <= bound, "{what}: {err:.3e} > {bound:.3e}");
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
}
