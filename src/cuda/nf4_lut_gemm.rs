//! The launch of nf4_gemv.cu's `nf4_lut_gemm`: the codebook lookup as a skinny GEMM for 9 to 64
//! batch rows, a block tile of 128 weight rows whose 4 warps share one staged copy of x, the k
//! split stream-K across a persistent grid (the tiles cut between blocks summed through
//! `stream_workspace`). `nf4_gemv` picks it where it `pays`.

use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC_SMEM;
use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CudaDevice, Result, WithDType};

use super::module::Kernels;
use super::nf4_segments::RawSegments;
use super::programmatic_launch::{self, arg};
use super::{stream_workspace, suffix};

/// Weight rows of a block tile (`LG_ROWS`: 4 warps of 32).
pub const ROWS: usize = 128;
/// Warps of a block (`LG_WARPS`).
const WARPS: usize = 4;
/// The most tiles one launch takes (its workspace's counts).
const MAX_TILES: usize = 1 << 14;
/// Values of a row a (tile, quad) item covers (`MMA_KC`).
const QUAD: usize = 256;
/// The 64 KiB region of table entries and slots (`LUT_BYTES`).
const REGION: usize = 256 * 256;

/// `LutGemmShape<NT>` of nf4_gemv.cu: what a launch of `tiles` batch tiles needs.
struct Shape {
    /// Blocks a multiprocessor (`__launch_bounds__`).
    per_sm: usize,
    /// Dynamic shared memory: the region, and x's stages where they lie past it.
    bytes: usize,
    /// f32 sums a block's fragment writes (`SUMS`).
    sums: usize,
}

impl Shape {
    fn of(tiles: usize) -> Self {
        let stages = match tiles {
            1 => 5,
            2 => 4,
            4 => 3,
            _ => 4,
        };
        let x_rows = 8 * tiles;
        let in_region = 32 * stages + 48 + stages * x_rows <= 256;
        Self {
            per_sm: if tiles <= 4 { 3 } else { 2 },
            bytes: REGION + if in_region { 0 } else { stages * x_rows * 128 },
            sums: 2 * tiles * 4 * ROWS,
        }
    }
}

/// The f32 sums of the lookup GEMM's workspace on `sms` multiprocessors: two fragments a block of
/// the largest grid, whatever the batch; and its counts, one a tile (`plan::serving`'s
/// `DECODE_SCRATCH` counts both).
pub fn workspace_sums(sms: usize) -> usize {
    [1, 2, 4, 8].iter().map(|&t| 2 * Shape::of(t).per_sm * sms * Shape::of(t).sums).max().unwrap_or(0)
}
pub const WORKSPACE_COUNTS: usize = MAX_TILES;

/// Whether the lookup GEMM pays for a launch of `tiles` 128-row tiles of `batch_tiles` tiles of
/// batch rows on `sms` multiprocessors: where each tile's k is cut into more than 6 fragments
/// (few rows, as o and down, against a grid of 2–3 blocks a multiprocessor) the fragments' sums
/// and the pipeline's start outweigh sharing x, and the lookup kernel is faster (benches/issue38).
pub fn pays(tiles: usize, batch_tiles: usize, sms: usize) -> bool {
    6 * tiles >= Shape::of(batch_tiles).per_sm * sms
}

/// Launches `nf4_lut_gemm_<dtype>_<tiles>` (one of `kernels`, nf4_gemv.cu's) for x at `x_ptr`
/// (`n` rows of `in_dim`, T) against the `tiles` 128-row tiles of `raw`'s segments;
/// `programmatic`: right after the `lora_down` that made their h (`programmatic_launch`).
///
/// # Safety
/// `raw` must describe segments whose buffers hold what nf4_gemv's `launch` checked, alive until
/// the launch has run; `x_ptr` must address x on `dev`.
pub(super) unsafe fn launch<T: WithDType>(
    kernels: &Kernels,
    dev: &CudaDevice,
    x_ptr: u64,
    (n, in_dim, tiles): (usize, usize, usize),
    accumulate: bool,
    raw: &RawSegments,
    programmatic: bool,
) -> Result<()> {
    if tiles > MAX_TILES {
        bail!("the NF4 lookup GEMM takes at most {MAX_TILES} tiles of {ROWS} rows a launch, not {tiles}");
    }
    // the batch rows in 1, 2, 4 or 8 tiles of 8; a persistent grid cutting the (tile, quad)
    // items into equal ranges
    let batch_tiles = n.div_ceil(8).next_power_of_two();
    let shape = Shape::of(batch_tiles);
    let sms = super::multiprocessors(dev)?;
    let grid = (tiles * (in_dim / QUAD)).min(shape.per_sm * sms);
    let (ws, counts) = stream_workspace::get(dev, "nf4_lut_gemm", workspace_sums(sms), MAX_TILES)?;
    let func = kernels.function(dev, &format!("nf4_lut_gemm_{}_{batch_tiles}", suffix(T::DTYPE)?))?;
    func.set_attribute(MAX_DYNAMIC_SMEM, shape.bytes as i32).w()?;
    let cfg = LaunchConfig {
        grid_dim: (grid as u32, 1, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: shape.bytes as u32,
    };
    let (n_i, in_i, tiles_i, acc) = (n as i32, in_dim as i32, tiles as i32, accumulate as i32);
    let mut params =
        [arg(&x_ptr), arg(&n_i), arg(&in_i), arg(&tiles_i), arg(&acc), arg(&ws), arg(&counts), arg(raw)];
    // SAFETY: the parameters are nf4_lut_gemm's, alive across the launch; the caller's contract.
    unsafe { programmatic_launch::launch(&func, cfg, &dev.cuda_stream(), &mut params, programmatic) }
}
