//! The NF4 GEMM of `nf4_gemm.cu`: y `[m, out]` = x `[m, in]` · Wᵀ on tensor cores for batches
//! of up to [`MAX_ROWS`] rows (decode steps past the GEMV's rows, short prefills), read straight
//! from W's packed NF4 codes and absmax (plain f32 or double-quantized), without the 16-bit copy
//! of W that dequantize + GEMM writes and reads back. Each weight value is the one the dequantize
//! kernel gives (the same decode, rounded to the compute dtype), the products summed in f32.
//! Where W's columns alone would leave the GPU's multiprocessors idle, `in` is split over
//! several blocks, whose f32 partial sums a second kernel adds up. `quant::nf4_gemm` calls it
//! with an `Nf4Tensor`'s parts.

use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC_SMEM;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, CudaDevice, DType, Result, Tensor, WithDType};
use half::{bf16, f16};

use super::nf4_gemv::Scales;
use super::{address, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("nf4_gemm");

/// The most rows of x one launch takes (16 tiles of 16 rows: `NF4_GEMM_TILES` in nf4_gemm.cu).
pub const MAX_ROWS: usize = 256;
/// Output columns per block (`GEMM_BN`), `in` per pipeline stage (`GEMM_KC`: one absmax block
/// of each W row) and the padded shared-memory row pitch (`GEMM_LD`), as in nf4_gemm.cu.
const BN: usize = 64;
const KC: usize = 64;
const LD: usize = KC + 8;
const THREADS: u32 = 256;
/// Each split of `in` walks at least this many chunks, so its pipeline fills.
const MIN_CHUNKS_PER_SPLIT: usize = 4;

/// Chunks in flight for `tiles` m tiles (`GemmShape<MT>::STAGES`).
fn stages(tiles: usize) -> usize {
    if tiles <= 8 {
        4
    } else {
        3
    }
}

/// Static shared memory of the kernel (its codebook and dynamic map, 1088 bytes), rounded up:
/// the per-block limit counts it beside the dynamic part.
const STATIC_SMEM: usize = 2048;

/// Dynamic shared memory of a launch over `tiles` m tiles: the stages' x tiles (16-bit, padded
/// rows), the decoded W tile, the stages' packed codes.
fn smem_bytes(tiles: usize) -> usize {
    let stages = stages(tiles);
    stages * 16 * tiles * LD * 2 + BN * LD * 2 + stages * BN * KC / 2
}

/// Whether the kernel takes x `[m, in]` against a weight `[out_dim, in_dim]`: a CUDA f16/bf16 x,
/// contiguous from a 16-byte boundary, 1 to `MAX_ROWS` rows, `in` a multiple of 64 (each pipeline
/// chunk one absmax block of each W row, every copy 16-byte aligned), and a device whose
/// per-block shared memory holds the launch's tiles. Anything else goes through dequantize + GEMM.
pub fn supports(x: &Tensor, out_dim: usize, in_dim: usize) -> bool {
    let Ok((m, cols)) = x.dims2() else { return false };
    let shape_ok = matches!(x.dtype(), DType::F16 | DType::BF16)
        && x.is_contiguous()
        && x.layout().start_offset().is_multiple_of(8)
        && (1..=MAX_ROWS).contains(&m)
        && cols == in_dim
        && in_dim.is_multiple_of(KC)
        && in_dim > 0
        && out_dim > 0
        && in_dim <= i32::MAX as usize
        && out_dim <= i32::MAX as usize
        && m.saturating_mul(out_dim) <= i32::MAX as usize;
    if !shape_ok {
        return false;
    }
    match x.device() {
        candle_core::Device::Cuda(dev) => {
            attribute(dev, OPTIN).is_ok_and(|limit| smem_bytes(m.div_ceil(16)) + STATIC_SMEM <= limit)
        }
        _ => false,
    }
}

fn attribute(
    dev: &CudaDevice,
    attr: candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute,
) -> Result<usize> {
    Ok(dev.cuda_stream().context().attribute(attr).w()?.max(0) as usize)
}

/// Splits of `in` for a launch of `col_blocks` blocks of columns over `chunks` chunks of `in`,
/// on a GPU of `sms` multiprocessors running `per_sm` blocks each: enough blocks to fill it,
/// each split at least `MIN_CHUNKS_PER_SPLIT` chunks long; then the fewest splits of that length.
/// Returns (splits, chunks per split).
fn split_in(col_blocks: usize, chunks: usize, sms: usize, per_sm: usize) -> (usize, usize) {
    let wanted = (sms * per_sm / col_blocks.max(1)).max(1);
    let most = (chunks / MIN_CHUNKS_PER_SPLIT).max(1);
    let per_split = chunks.div_ceil(wanted.min(most));
    (chunks.div_ceil(per_split), per_split)
}

/// x · Wᵀ as a new `[m, out_dim]` tensor in x's dtype; W is `[out_dim, x.dim(1)]`, its packed
/// codes `packed` (U8, two per byte, the first value in the high nibble) and its `scales`.
pub fn gemm(x: &Tensor, packed: &Tensor, scales: Scales, out_dim: usize) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 => gemm_typed::<f16>(x, packed, &scales, out_dim),
        DType::BF16 => gemm_typed::<bf16>(x, packed, &scales, out_dim),
        dt => bail!("the NF4 GEMM takes f16 or bf16, not {dt:?}"),
    }
}

/// y `[m, out_dim]` (x's dtype, row-major) at device address `y` set to x · Wᵀ, or added to
/// (the sum taken in f32 and rounded once) with `accumulate`.
///
/// # Safety
/// `y` must address `m · out_dim` elements of x's dtype on x's device, which no other work
/// reads or writes until this launch has run on the device's stream.
pub unsafe fn gemm_into(
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
        dt => bail!("the NF4 GEMM takes f16 or bf16, not {dt:?}"),
    }
}

fn gemm_typed<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    packed: &Tensor,
    scales: &Scales,
    out_dim: usize,
) -> Result<Tensor> {
    let dev = cuda_device(x)?;
    let m = x.dim(0)?;
    // every element is written by the launch (accumulate off)
    let y = unsafe { dev.alloc::<T>(m * out_dim)? };
    let y = wrap(y, &dev, &[m, out_dim]);
    let address = address(&y, &dev.cuda_stream())?;
    // SAFETY: `y` is a fresh [m, out_dim] buffer of T on x's device, held across the launch.
    unsafe { launch::<T>(x, packed, scales, out_dim, address, false)? };
    Ok(y)
}

/// Checks the operands against each other and launches `nf4_gemm_<dtype>_<tiles>`, then, where
/// `in` is split, `nf4_gemm_reduce_<dtype>`.
unsafe fn launch<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    packed: &Tensor,
    scales: &Scales,
    out_dim: usize,
    y: u64,
    accumulate: bool,
) -> Result<()> {
    let (m, in_dim) = x.dims2()?;
    if !supports(x, out_dim, in_dim) {
        bail!(
            "the NF4 GEMM takes a contiguous f16/bf16 CUDA x of 1 to {MAX_ROWS} rows with a multiple of {KC} \
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
            "NF4 GEMM: packed codes {:?} {:?} for a [{out_dim}, {in_dim}] weight",
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
        bail!("NF4 GEMM: absmax of the wrong dtype, layout, device or length for a [{out_dim}, {in_dim}] weight");
    }
    let dev = cuda_device(x)?;
    let tiles = m.div_ceil(16);
    let name = suffix(T::DTYPE)?;
    let func = KERNELS.function(&dev, &format!("nf4_gemm_{name}_{tiles}"))?;
    let smem = smem_bytes(tiles) as u32;
    func.set_attribute(MAX_DYNAMIC_SMEM, smem as i32).w()?;
    let col_blocks = out_dim.div_ceil(BN);
    // two blocks per multiprocessor where the x tiles are small, one for the largest batches
    let per_sm = if tiles <= 4 { 2 } else { 1 };
    let (splits, per_split) = split_in(col_blocks, in_dim / KC, super::multiprocessors(&dev)?, per_sm);
    let cfg = LaunchConfig {
        grid_dim: (col_blocks as u32, splits as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    // the splits' f32 partial sums, [splits, m, out] (every element written by the launch)
    let partial = if splits > 1 { Some(unsafe { dev.alloc::<f32>(splits * m * out_dim)? }) } else { None };
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
    let (m_i, out_i, in_i) = (m as i32, out_dim as i32, in_dim as i32);
    let (per_split_i, acc) = (per_split as i32, accumulate as i32);
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
    b.arg(&offset).arg(&y);
    match &partial {
        Some(p) => b.arg(p),
        None => b.arg(&null),
    };
    b.arg(&m_i).arg(&out_i).arg(&in_i).arg(&per_split_i).arg(&acc);
    unsafe { b.launch(cfg) }.w()?;
    if let Some(partial) = &partial {
        let reduce = KERNELS.function(&dev, &format!("nf4_gemm_reduce_{name}"))?;
        let (len, splits_i) = ((m * out_dim) as i64, splits as i32);
        let mut b = reduce.builder();
        b.arg(partial).arg(&splits_i).arg(&y).arg(&len).arg(&acc);
        unsafe { b.launch(super::blocks((m * out_dim).div_ceil(256), 256)) }.w()?;
    }
    Ok(())
}

#[cfg(test)]
mod split_tests {
    use super::split_in;

    /// Llama-3.1-8B's shapes on an H200's 132 multiprocessors: q/o (64 column blocks, 64
    /// chunks) split in 4; k/v (16 blocks) as far as the 4-chunk floor allows; gate/up (224
    /// blocks) not at all; down (64 blocks, 224 chunks) in 4 of 56 chunks; and every split
    /// non-empty with the chunks covered exactly once.
    #[test]
    fn splits_fill_the_gpu_and_cover_in_once() {
        assert_eq!(split_in(64, 64, 132, 2), (4, 16));
        assert_eq!(split_in(16, 64, 132, 2), (16, 4));
        assert_eq!(split_in(224, 64, 132, 2), (1, 64));
        assert_eq!(split_in(64, 224, 132, 2), (4, 56));
        assert_eq!(split_in(64, 64, 132, 1), (2, 32));
        for (col_blocks, chunks) in [(1, 1), (1, 3), (7, 9), (16, 224), (3, 1000)] {
            let (splits, per_split) = split_in(col_blocks, chunks, 132, 2);
            assert!(splits >= 1 && per_split >= 1);
            assert!(
                (splits - 1) * per_split < chunks && splits * per_split >= chunks,
                "{col_blocks} {chunks}"
            );
        }
    }
}

#[cfg(all(test, feature = "cuda"))]
#[path = "nf4_gemm_tests.rs"]
mod tests;
