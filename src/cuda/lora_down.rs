//! LoRA's first product for the decode rows, h `[n, Σ r_i]` = scale_i · x·A_iᵀ for up to three
//! adapters reading the same x, straight from their f32 A: the h that the NF4 GEMV's segments
//! (`nf4_gemv::LoraUp`) multiply by B in their epilogue. Its kernels, `lora_down` (to 16 rows: a
//! block a column and 8 rows) and `lora_down_split` (past 16 rows: the k split across blocks,
//! summed in order by the last), live in nf4_gemv.cu beside the GEMV they feed.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, DType, Result, Tensor, WithDType};
use half::{bf16, f16};

use super::nf4_gemv::{supports, KERNELS, LOOKUP_MAX_ROWS, MAX_ROWS, MAX_SEGMENTS};
use super::{address, cuda_device, stream_workspace, suffix, view, wrap};

/// Threads of a `lora_down` block (`LORA_THREADS` in nf4_gemv.cu).
const LORA_THREADS: u32 = 256;

/// `LoraDown` of nf4_gemv.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawLoraDown {
    a: [u64; MAX_SEGMENTS],
    scale: [f32; MAX_SEGMENTS],
    rank: [i32; MAX_SEGMENTS],
    count: i32,
}

// SAFETY: plain-old-data laid out as the kernel's parameter struct (repr(C), the same fields).
unsafe impl DeviceRepr for RawLoraDown {}

/// Whether `lora_down` and a segment's LoRA term take A `[r, in_dim]` and B `[out, r]`: f32,
/// contiguous, on `device`, A's rows and B's start on 16-byte boundaries.
pub fn lora_supports(a: &Tensor, b: &Tensor, in_dim: usize, device: &candle_core::Device) -> bool {
    let (Ok((r, cols)), Ok((_, rb))) = (a.dims2(), b.dims2()) else { return false };
    let f32_here =
        |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous() && t.device().same_device(device);
    f32_here(a)
        && f32_here(b)
        && r == rb
        && r > 0
        && cols == in_dim
        && a.layout().start_offset().is_multiple_of(4)
        && b.layout().start_offset().is_multiple_of(4)
        && r <= i32::MAX as usize
}

/// h `[n, Σ r_i]` f32 = [scale_1 · x·A_1ᵀ, …] for up to three adapters' A `[r_i, in]` (f32)
/// reading the same x `[n, in]`: the first half of the decode rows' LoRA terms.
pub fn lora_down(x: &Tensor, adapters: &[(&Tensor, f64)]) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 => lora_down_typed::<f16>(x, adapters),
        DType::BF16 => lora_down_typed::<bf16>(x, adapters),
        dt => bail!("the LoRA decode product takes f16 or bf16, not {dt:?}"),
    }
}

fn lora_down_typed<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    adapters: &[(&Tensor, f64)],
) -> Result<Tensor> {
    let (n, in_dim) = x.dims2()?;
    if adapters.is_empty() || adapters.len() > MAX_SEGMENTS || !supports(x, 1, in_dim) {
        bail!(
            "lora_down: 1 to {MAX_SEGMENTS} adapters and x of 1 to {LOOKUP_MAX_ROWS} rows, not {}",
            adapters.len()
        );
    }
    let dev = cuda_device(x)?;
    let stream = dev.cuda_stream();
    let mut raw = RawLoraDown { count: adapters.len() as i32, ..Default::default() };
    let mut width = 0;
    for (i, (a, scale)) in adapters.iter().enumerate() {
        let (r, cols) = a.dims2()?;
        if cols != in_dim
            || a.dtype() != DType::F32
            || !a.is_contiguous()
            || !a.layout().start_offset().is_multiple_of(4)
        {
            bail!("lora_down: A {:?} {:?} for x {:?}", a.dims(), a.dtype(), x.dims());
        }
        raw.a[i] = address(a, &stream)?;
        raw.scale[i] = *scale as f32;
        raw.rank[i] = r as i32;
        width += r;
    }
    let h = wrap(unsafe { dev.alloc::<f32>(n * width)? }, &dev, &[n, width]);
    if n > SPLIT_FROM_ROWS {
        // the k split across blocks: about two blocks a multiprocessor, a split at least 8
        // values, at most four blocks a multiprocessor in all
        let sms = super::multiprocessors(&dev)?;
        let groups = width.div_ceil(8);
        let want = (2 * sms).div_ceil(groups).clamp(1, (4 * sms / groups).max(1));
        let k_chunk = (in_dim.div_ceil(want)).div_ceil(8) * 8;
        let splits = in_dim.div_ceil(k_chunk);
        if groups * splits > SPLIT_BLOCKS_PER_SM * sms || groups > SPLIT_MAX_GROUPS {
            bail!("lora_down: {width} columns of h in {splits} splits exceed the workspace");
        }
        let (ws, counts) =
            stream_workspace::get(&dev, "lora_down_split", workspace_sums(sms), SPLIT_MAX_GROUPS)?;
        let func = KERNELS.function(&dev, &format!("lora_down_split_{}", suffix(T::DTYPE)?))?;
        let (gx, gh) = (x.storage_and_layout().0, h.storage_and_layout().0);
        let (xv, hv) = (view::<T>(&gx, x)?, view::<f32>(&gh, &h)?);
        let (rows, in_i, chunk, stride) = (n as i32, in_dim as i32, k_chunk as i32, width as i32);
        let mut b = func.builder();
        b.arg(&xv).arg(&rows).arg(&in_i).arg(&chunk).arg(&hv).arg(&stride).arg(&ws).arg(&counts).arg(&raw);
        let cfg = LaunchConfig {
            grid_dim: (groups as u32, splits as u32, 1),
            block_dim: (LORA_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { b.launch(cfg) }.w()?;
        drop((gx, gh));
        return Ok(h);
    }
    let per_block = n.min(MAX_ROWS);
    let func = KERNELS.function(&dev, &format!("lora_down_{}_{per_block}", suffix(T::DTYPE)?))?;
    let (gx, gh) = (x.storage_and_layout().0, h.storage_and_layout().0);
    let (xv, hv) = (view::<T>(&gx, x)?, view::<f32>(&gh, &h)?);
    let (rows, in_i, stride) = (n as i32, in_dim as i32, width as i32);
    let mut b = func.builder();
    b.arg(&xv).arg(&rows).arg(&in_i).arg(&hv).arg(&stride).arg(&raw);
    let cfg = LaunchConfig {
        grid_dim: (width as u32, n.div_ceil(per_block) as u32, 1),
        block_dim: (LORA_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { b.launch(cfg) }.w()?;
    drop((gx, gh));
    Ok(h)
}

/// The f32 sums of `lora_down_split`'s workspace on `sms` multiprocessors (64 × 8 a block); its
/// counts are `WORKSPACE_COUNTS` (`plan::serving`'s `DECODE_SCRATCH` counts both).
pub fn workspace_sums(sms: usize) -> usize {
    SPLIT_BLOCKS_PER_SM * sms * 512
}
pub const WORKSPACE_COUNTS: usize = SPLIT_MAX_GROUPS;

/// Rows past which the k-split kernel runs: at 9 to 16 its 64-row blocks idle most threads and
/// lora_down's two blocks a column were faster (benches/issue38/lut-gemm).
const SPLIT_FROM_ROWS: usize = 16;
/// The split kernel's blocks at most, a multiprocessor, and column groups of 8 at most (its
/// workspace's sizes: 64 × 8 sums a block, a count a group).
const SPLIT_BLOCKS_PER_SM: usize = 4;
const SPLIT_MAX_GROUPS: usize = 1024;
