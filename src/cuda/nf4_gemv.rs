//! The decode batch's projections of `nf4_gemv.cu`: y `[n, out]` = x `[n, in]` · Wᵀ for at most
//! [`LOOKUP_MAX_ROWS`] rows ([`MAX_ROWS`] where `in` is not a multiple of 256), read straight
//! from W's packed NF4 codes and absmax (plain f32 or double-quantized), without the 16-bit copy
//! of W that dequantize + GEMM writes and reads back. One launch takes up to three weights
//! reading the same x ([`Segment`]s), each output row with an optional bias, residual and LoRA
//! term h·Bᵀ, where h = scale · x·Aᵀ comes from [`lora_down`](super::lora_down::lora_down); all
//! of it summed in f32 and rounded once. `quant::nf4_gemv` and `model::lora::decode` call it.

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC_SMEM;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, DType, Result, Tensor, WithDType};
use half::{bf16, f16};

use super::nf4_segments::RawSegments;
pub use super::nf4_segments::{LoraUp, Scales, Segment, MAX_SEGMENTS};
use super::programmatic_launch::{self, arg};
use super::{address, cuda_device, nf4_lut_gemm, suffix, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("nf4_gemv");

/// The most rows of x the CUDA-core and first tensor-core kernels take (instantiated for 1 to 8).
pub const MAX_ROWS: usize = 8;
/// The most rows of x the lookup kernel takes (`in` a multiple of 256: 1, 2, 4 or 8 tiles of 8).
pub const LOOKUP_MAX_ROWS: usize = 64;
/// `MMA_KC` in nf4_gemv.cu: the tensor-core kernel takes an `in` that is a multiple of it.
const MMA_KC: usize = 256;
/// Warps of a tensor-core block (at most `MMA_MAX_WARPS` in nf4_gemv.cu).
const MMA_WARPS: usize = 4;
/// Bytes of one warp's ring of staged super-chunks (`MMA_STAGES` × `MMA_STAGE` in nf4_gemv.cu).
const MMA_RING_BYTES: usize = 3 * (16 * 144 + 256);
/// The tensor-core kernel's static shared memory: B's staged rows, the dynamic map, the warps' sums.
const MMA_STATIC_BYTES: usize = 16 * 64 * 4 + 256 * 4 + 8 * 16 * 8 * 4;
// the rings of a block's warps fit beside it in the 48 KiB a launch gets without opting in
const _: () = assert!(MMA_WARPS * MMA_RING_BYTES + MMA_STATIC_BYTES <= 48 * 1024);
/// The lookup kernel's dynamic shared memory: the table's 256 entries of 256 bytes, the warps'
/// rings in their second halves (`LUT_BYTES` in nf4_gemv.cu).
const LUT_BYTES: usize = 256 * 256;
/// Warps of a lookup block (`LUT_WARPS`).
const LUT_WARPS: usize = 4;

/// Which of nf4_gemv.cu's kernels a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `nf4_gemv`: CUDA cores, a lane summing code · x in f32 over 32-value chunks, each weight
    /// exact in f32; any `in` that is a multiple of 32.
    Lanes,
    /// `nf4_mma`: tensor cores on each weight rounded to the compute dtype as the dequantize
    /// kernel rounds it; `in` a multiple of 256.
    TensorCores,
    /// `nf4_lut`: tensor cores on each weight's codebook value rounded to the compute dtype,
    /// looked up in a shared-memory table, each absmax block's sum scaled by its absmax after;
    /// `in` a multiple of 256.
    Lookup,
    /// `nf4_lut_gemm`: the same decode and products as a skinny GEMM whose block tile is 128
    /// weight rows, its warps sharing one staged copy of x, the k split stream-K across the
    /// grid; `in` a multiple of 256. The default past 8 rows.
    LookupGemm,
}

impl Kernel {
    /// The kernel for `n` rows of `in_dim` values, if one takes them: where the codebook lookup
    /// takes the width, its GEMM past `MAX_ROWS` rows (to `LOOKUP_MAX_ROWS`) and the lookup
    /// kernel to them, else the CUDA cores for up to `MAX_ROWS`. `LORA_FT_NF4_GEMV` (read once)
    /// is a diagnostic: `lanes` runs the CUDA cores, `mma` the first tensor-core kernel from two
    /// rows, both for up to `MAX_ROWS` rows only (as before the lookup kernel: past them the NF4
    /// GEMM or dequantize + GEMM); `lut` the lookup kernel at every batch, `lut_gemm` its GEMM.
    pub fn for_shape(n: usize, in_dim: usize) -> Option<Kernel> {
        let wide = in_dim.is_multiple_of(MMA_KC);
        let kernel = match chosen() {
            Some("lanes") => Kernel::Lanes,
            Some("mma") if wide && n >= 2 => Kernel::TensorCores,
            Some("mma") => Kernel::Lanes,
            Some("lut") if wide => Kernel::Lookup,
            Some("lut_gemm") if wide => Kernel::LookupGemm,
            _ if wide && n > MAX_ROWS => Kernel::LookupGemm,
            _ if wide => Kernel::Lookup,
            _ => Kernel::Lanes,
        };
        ((1..=kernel.max_rows()).contains(&n) && kernel.takes(in_dim)).then_some(kernel)
    }

    /// The most batch rows this kernel takes.
    pub fn max_rows(self) -> usize {
        match self {
            Kernel::Lookup | Kernel::LookupGemm => LOOKUP_MAX_ROWS,
            Kernel::Lanes | Kernel::TensorCores => MAX_ROWS,
        }
    }

    /// Whether this kernel takes rows of `in_dim` values.
    pub fn takes(self, in_dim: usize) -> bool {
        match self {
            Kernel::Lanes => in_dim.is_multiple_of(32),
            Kernel::TensorCores | Kernel::Lookup | Kernel::LookupGemm => in_dim.is_multiple_of(MMA_KC),
        }
    }
}
/// `LORA_FT_NF4_GEMV`, read once.
fn chosen() -> Option<&'static str> {
    static CHOICE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    CHOICE.get_or_init(|| std::env::var("LORA_FT_NF4_GEMV").ok()).as_deref()
}

/// Warps per block (`GEMV_WARPS` in nf4_gemv.cu).
const WARPS: usize = 4;
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

/// Whether the kernel takes x `[n, in]` against a weight `[out_dim, in_dim]`: a CUDA f16/bf16
/// x, contiguous from a 16-byte boundary, 1 to `MAX_ROWS` rows (to `LOOKUP_MAX_ROWS` where `in` is
/// a multiple of 256), and `in` a multiple of 32 (so
/// each row of packed codes starts on a 16-byte boundary and each 16-byte load lies in one
/// absmax block). Anything else goes through dequantize + GEMM.
pub fn supports(x: &Tensor, out_dim: usize, in_dim: usize) -> bool {
    let Ok((n, cols)) = x.dims2() else { return false };
    x.device().is_cuda()
        && x.is_contiguous()
        && x.layout().start_offset().is_multiple_of(8)
        && cols == in_dim
        && supports_shape(n, x.dtype(), (out_dim, in_dim))
}

/// `supports` for a fresh contiguous x of `n` rows in `dtype`: the rows, dtype and shape rules.
pub fn supports_shape(n: usize, dtype: DType, (out_dim, in_dim): (usize, usize)) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
        && Kernel::for_shape(n, in_dim).is_some()
        && in_dim > 0
        && out_dim > 0
        && in_dim <= i32::MAX as usize
        && out_dim <= i32::MAX as usize
}

/// x · Wᵀ as a new `[n, out_dim]` tensor in x's dtype; W is `[out_dim, x.dim(1)]`, its packed
/// codes `packed` (U8, two per byte, the first value in the high nibble) and its `scales`.
pub fn gemv(x: &Tensor, packed: &Tensor, scales: Scales, out_dim: usize) -> Result<Tensor> {
    let segment = Segment { packed, scales, out_dim, y: 0, residual: None, bias: None, lora: None };
    Ok(gemv_outputs(x, vec![segment])?.remove(0))
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
    let segment = Segment { packed, scales, out_dim, y, residual: None, bias: None, lora: None };
    gemv_segments(x, &[segment], accumulate)
}

/// Each segment's y = x · Wᵀ (+ bias + residual + its LoRA term), or y += that with
/// `accumulate`, in one launch.
///
/// # Safety
/// Each segment's `y` must address `n · out_dim` elements of x's dtype on x's device, which no
/// other work reads or writes until this launch has run on the device's stream.
pub unsafe fn gemv_segments(x: &Tensor, segments: &[Segment], accumulate: bool) -> Result<()> {
    gemv_segments_on(kernel_for(x, segments.iter().map(|s| s.out_dim))?, x, segments, accumulate)
}

/// `gemv_segments` on the given kernel.
///
/// # Safety
/// As `gemv_segments`.
pub unsafe fn gemv_segments_on(
    kernel: Kernel,
    x: &Tensor,
    segments: &[Segment],
    accumulate: bool,
) -> Result<()> {
    match x.dtype() {
        DType::F16 => launch::<f16>(kernel, x, segments, accumulate, false),
        DType::BF16 => launch::<bf16>(kernel, x, segments, accumulate, false),
        dt => bail!("the NF4 GEMV takes f16 or bf16, not {dt:?}"),
    }
}

/// `gemv_segments` launched to overlap the launch just before it on the stream, which must be
/// the `lora_down` that made the segments' h (nothing queued between them, not even an
/// allocation): on sm_90 and later by programmatic dependent launch, so the lookup kernels'
/// weights stream in while lora_down runs and only their epilogue waits for its h; elsewhere
/// (and for the other kernels) an ordinary launch.
///
/// # Safety
/// As `gemv_segments`.
pub unsafe fn gemv_segments_after_lora_down(x: &Tensor, segments: &[Segment]) -> Result<()> {
    let kernel = kernel_for(x, segments.iter().map(|s| s.out_dim))?;
    match x.dtype() {
        DType::F16 => launch::<f16>(kernel, x, segments, false, true),
        DType::BF16 => launch::<bf16>(kernel, x, segments, false, true),
        dt => bail!("the NF4 GEMV takes f16 or bf16, not {dt:?}"),
    }
}

/// Fresh `[n, out_dim]` outputs in x's dtype for `segments` (uninitialized: a launch without
/// `accumulate` writes every element), each segment's `y` set to its output's address.
pub fn alloc_outputs(x: &Tensor, segments: &mut [Segment]) -> Result<Vec<Tensor>> {
    let dev = cuda_device(x)?;
    let n = x.dim(0)?;
    let outputs = segments
        .iter()
        .map(|s| {
            Ok(match x.dtype() {
                DType::F16 => wrap(unsafe { dev.alloc::<f16>(n * s.out_dim)? }, &dev, &[n, s.out_dim]),
                DType::BF16 => wrap(unsafe { dev.alloc::<bf16>(n * s.out_dim)? }, &dev, &[n, s.out_dim]),
                dt => bail!("the NF4 GEMV takes f16 or bf16, not {dt:?}"),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for (s, y) in segments.iter_mut().zip(&outputs) {
        s.y = address(y, &dev.cuda_stream())?;
    }
    Ok(outputs)
}

/// Each segment's output as a new `[n, out_dim]` tensor in x's dtype (the segments' `y` are
/// ignored), in one launch: y = x · Wᵀ + bias + residual + the LoRA term.
pub fn gemv_outputs(x: &Tensor, segments: Vec<Segment>) -> Result<Vec<Tensor>> {
    let kernel = kernel_for(x, segments.iter().map(|s| s.out_dim))?;
    gemv_outputs_on(kernel, x, segments)
}

/// The kernel for x's rows and width (`Kernel::for_shape`) and the launch's weights of
/// `out_dims` rows, or an error naming them: the lookup GEMM where it pays, unless asked for.
fn kernel_for(x: &Tensor, out_dims: impl Iterator<Item = usize>) -> Result<Kernel> {
    let (n, in_dim) = x.dims2()?;
    match Kernel::for_shape(n, in_dim) {
        Some(Kernel::LookupGemm) if chosen().is_none() => {
            let tiles = out_dims.map(|o| o.div_ceil(nf4_lut_gemm::ROWS)).sum();
            let sms = super::multiprocessors(&cuda_device(x)?)?;
            let batch_tiles = n.div_ceil(8).next_power_of_two();
            Ok(if nf4_lut_gemm::pays(tiles, batch_tiles, sms) { Kernel::LookupGemm } else { Kernel::Lookup })
        }
        Some(kernel) => Ok(kernel),
        None => bail!("the NF4 GEMV takes no {n} rows of {in_dim} values"),
    }
}

/// `gemv_outputs` on the given kernel.
pub fn gemv_outputs_on(kernel: Kernel, x: &Tensor, mut segments: Vec<Segment>) -> Result<Vec<Tensor>> {
    let outputs = alloc_outputs(x, &mut segments)?;
    // SAFETY: each y is a fresh [n, out_dim] buffer of x's dtype on x's device, every element
    // of which the launch writes (accumulate off), held across the launch.
    unsafe { gemv_segments_on(kernel, x, &segments, false)? };
    Ok(outputs)
}

/// Checks the operands against each other and launches `nf4_gemv_<dtype>_<n>`,
/// `nf4_mma_<dtype>_1` or `nf4_lut_<dtype>_<tiles>`.
unsafe fn launch<T: CudaDType + WithDType + DeviceRepr>(
    kernel: Kernel,
    x: &Tensor,
    segments: &[Segment],
    accumulate: bool,
    overlap: bool,
) -> Result<()> {
    let (n, in_dim) = x.dims2()?;
    if segments.is_empty() || segments.len() > MAX_SEGMENTS {
        bail!("the NF4 GEMV takes 1 to {MAX_SEGMENTS} weights a launch, not {}", segments.len());
    }
    if !kernel.takes(in_dim) || n > kernel.max_rows() {
        bail!("the NF4 GEMV's {kernel:?} kernel does not take {n} rows of {in_dim} values");
    }
    let dev = cuda_device(x)?;
    let stream = dev.cuda_stream();
    let rows_per_block = match kernel {
        Kernel::Lanes => WARPS * rows_per_warp(n),
        Kernel::TensorCores | Kernel::Lookup => 16,
        Kernel::LookupGemm => nf4_lut_gemm::ROWS,
    };
    let mut raw = RawSegments { count: segments.len() as i32, ..Default::default() };
    let mut blocks = 0;
    for (i, s) in segments.iter().enumerate() {
        let out_dim = s.out_dim;
        if !supports(x, out_dim, in_dim) {
            bail!(
                "the NF4 GEMV takes a contiguous f16/bf16 CUDA x of 1 to {MAX_ROWS} rows with a multiple of 32 \
                 columns (to {LOOKUP_MAX_ROWS} rows with a multiple of 256), not {:?} {:?} against \
                 [{out_dim}, {in_dim}]",
                x.dims(),
                x.dtype()
            );
        }
        let values = out_dim * in_dim;
        let absmax_blocks = values / 64;
        let contiguous = |t: &Tensor, dtype: DType, len: usize| {
            t.is_contiguous()
                && t.dtype() == dtype
                && t.elem_count() >= len
                && t.device().same_device(x.device())
        };
        if !contiguous(s.packed, DType::U8, values / 2)
            || !s.packed.layout().start_offset().is_multiple_of(16)
        {
            bail!(
                "NF4 GEMV: packed codes {:?} {:?} for a [{out_dim}, {in_dim}] weight",
                s.packed.dims(),
                s.packed.dtype()
            );
        }
        let r = &mut raw.s[i];
        match s.scales {
            // the tensor cores copy a row's four absmax (or codes) in one 16-byte (4-byte) copy
            Scales::F32(a)
                if contiguous(a, DType::F32, absmax_blocks)
                    && (kernel == Kernel::Lanes || a.layout().start_offset().is_multiple_of(4)) =>
            {
                r.absmax = address(a, &stream)?
            }
            Scales::Double { codes, absmax2, offset }
                if contiguous(codes, DType::U8, absmax_blocks)
                    && (kernel == Kernel::Lanes || codes.layout().start_offset().is_multiple_of(4))
                    && contiguous(absmax2, DType::F32, absmax_blocks.div_ceil(256)) =>
            {
                r.codes = address(codes, &stream)?;
                r.absmax2 = address(absmax2, &stream)?;
                r.offset = offset;
            }
            _ => bail!("NF4 GEMV: absmax of the wrong dtype, layout, device or length for a [{out_dim}, {in_dim}] weight"),
        }
        if let Some(t) = s.residual {
            if !contiguous(t, T::DTYPE, n * out_dim) || t.dims() != [n, out_dim] {
                bail!("NF4 GEMV: a residual {:?} {:?} for [{n}, {out_dim}]", t.dims(), t.dtype());
            }
            r.residual = address(t, &stream)?;
        }
        if let Some(t) = s.bias {
            if !contiguous(t, T::DTYPE, out_dim) || t.elem_count() != out_dim {
                bail!("NF4 GEMV: a bias {:?} {:?} for {out_dim} rows", t.dims(), t.dtype());
            }
            r.bias = address(t, &stream)?;
        }
        if let Some(l) = &s.lora {
            let (hn, width) = l.h.dims2()?;
            let (bo, rank) = l.b.dims2()?;
            if hn != n
                || bo != out_dim
                || l.col + rank > width
                || !contiguous(l.h, DType::F32, n * width)
                || !contiguous(l.b, DType::F32, out_dim * rank)
            {
                bail!(
                    "NF4 GEMV: a LoRA term h {:?} (from column {}) B {:?} for [{n}, {out_dim}]",
                    l.h.dims(),
                    l.col,
                    l.b.dims()
                );
            }
            // the tensor cores stage B's rows by 16-byte copies
            if kernel != Kernel::Lanes && !l.b.layout().start_offset().is_multiple_of(4) {
                bail!(
                    "NF4 GEMV: a LoRA B starting at element {}, not on a 16-byte boundary",
                    l.b.layout().start_offset()
                );
            }
            r.lora_h = address(l.h, &stream)?;
            r.lora_b = address(l.b, &stream)?;
            (r.h_stride, r.h_col, r.rank) = (width as i32, l.col as i32, rank as i32);
        }
        r.packed = address(s.packed, &stream)?;
        r.y = s.y;
        r.out = out_dim as i32;
        r.block0 = blocks as i32;
        blocks += out_dim.div_ceil(rows_per_block);
    }
    let (in_i, acc) = (in_dim as i32, accumulate as i32);
    // x's address for every kernel (the caller holds x across the launch)
    let x_ptr = address(x, &stream)?;
    if kernel == Kernel::Lookup {
        // a persistent grid, each block walking 16-row groups, its warps splitting each group's k;
        // the batch rows in 1, 2, 4 or 8 tiles of 8
        let tiles = n.div_ceil(8).next_power_of_two();
        let warps = (in_dim / MMA_KC).clamp(1, LUT_WARPS);
        // three blocks a multiprocessor, two from four tiles (`__launch_bounds__`)
        let per_sm = if tiles <= 2 { 3 } else { 2 };
        let func = KERNELS.function(&dev, &format!("nf4_lut_{}_{tiles}", suffix(T::DTYPE)?))?;
        let smem = LUT_BYTES as u32;
        func.set_attribute(MAX_DYNAMIC_SMEM, smem as i32).w()?;
        let grid = blocks.min(per_sm * super::multiprocessors(&dev)?);
        let cfg = LaunchConfig {
            grid_dim: (grid as u32, 1, 1),
            block_dim: ((warps * 32) as u32, 1, 1),
            shared_mem_bytes: smem,
        };
        let (n_i, groups) = (n as i32, blocks as i32);
        let mut params = [arg(&x_ptr), arg(&n_i), arg(&in_i), arg(&groups), arg(&acc), arg(&raw)];
        // SAFETY: the parameters are nf4_lut's, alive across the launch.
        return unsafe { programmatic_launch::launch(&func, cfg, &stream, &mut params, overlap) };
    }
    if kernel == Kernel::LookupGemm {
        // SAFETY: the caller's contract; `raw` describes this launch's segments.
        return unsafe {
            nf4_lut_gemm::launch::<T>(&KERNELS, &dev, x_ptr, (n, in_dim, blocks), accumulate, &raw, overlap)
        };
    }
    if kernel == Kernel::TensorCores {
        // a block is one 16-row group, its warps across the k; four warps (more leave too little
        // L1 beside the rings for the x rows every warp reads)
        let warps = (in_dim / MMA_KC).clamp(1, MMA_WARPS);
        let func = KERNELS.function(&dev, &format!("nf4_mma_{}_1", suffix(T::DTYPE)?))?;
        let smem = (warps * MMA_RING_BYTES) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: ((warps * 32) as u32, 1, 1),
            shared_mem_bytes: smem,
        };
        let n_i = n as i32;
        let mut b = func.builder();
        b.arg(&x_ptr).arg(&n_i).arg(&in_i).arg(&acc).arg(&raw);
        unsafe { b.launch(cfg) }.w()?;
        return Ok(());
    }
    let func = KERNELS.function(&dev, &format!("nf4_gemv_{}_{n}", suffix(T::DTYPE)?))?;
    let tile = tile_columns(n, in_dim);
    // n rows of the tile in f32, 4 floats of padding after every 32
    let shared = n * (tile + tile / 8) * 4;
    let cfg = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    let tile_i = tile as i32;
    let mut b = func.builder();
    b.arg(&x_ptr).arg(&in_i).arg(&tile_i).arg(&acc).arg(&raw);
    unsafe { b.launch(cfg) }.w()?;
    Ok(())
}

#[cfg(all(test, feature = "cuda"))]
#[path = "nf4_gemv_tests.rs"]
mod tests;
