//! Launches `nf4_skinny.cu`, the decode projections' skinny GEMM for the larger decode batches
//! (`nf4_gemv::Kernel::Skinny`): tiles of up to 128 weight rows sharing each staged chunk of x,
//! a tile's k split across blocks where the tiles alone leave multiprocessors idle. `nf4_gemv`
//! checks the operands and calls it.
//!
//! The split-k sums meet in a workspace owned by the stream (f32 partial sums and a counter per
//! tile, which the last split of a tile resets), allocated once and never freed, like cuBLAS's
//! workspace in `graph.rs`: `pin_workspace` allocates it before a CUDA graph records, so no
//! recording owns it.

use std::collections::HashMap;
use std::sync::Mutex;

use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as SMEM_OPTIN;
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC_SMEM;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, Result, WithDType};

use super::suffix;

pub static KERNELS: super::module::Kernels = super::module::kernels!("nf4_skinny");

/// Columns of a stage (`SKINNY_KC`): `in` must be a multiple of it.
pub const KC: usize = 256;
/// `SKINNY_TABLE`, `SKINNY_X_PITCH` and `SKINNY_WARP_ROWS` in nf4_skinny.cu.
const TABLE_BYTES: usize = 256 * 128;
const X_PITCH: usize = 528;
const WARP_ROWS: usize = 16;
/// The kernel's static shared memory (the dynamic map, the last-split flag), with room to spare.
const STATIC_BYTES: usize = 2048;
/// The blocks a launch may take, the first whose shared memory fits the device: (warps, stages
/// of copies). Three stages or more keep two in flight while one is used; 8 warps (128-row
/// tiles) share each staged chunk of x among more rows than 4, and hide more of each other's
/// latencies.
const SHAPES: [(usize, usize); 6] = [(8, 4), (8, 3), (4, 4), (4, 3), (8, 2), (4, 2)];
/// f32 partial sums the split-k workspace holds (16 MiB): splits × batch rows × weight rows.
const PARTIALS: usize = 4 << 20;
/// Tiles the workspace has counters for.
const COUNTERS: usize = 4096;
// the planner counts the workspace by this
const _: () = assert!(crate::quant::SPLIT_WORKSPACE_BYTES == (PARTIALS * 4 + COUNTERS * 4) as u64);
/// The most splits of a tile's k.
const MAX_SPLITS: usize = 16;

/// Dynamic shared memory of a block of `warps` warps and `stages` stages over `tiles` tiles of 8
/// batch rows: the table, then per stage x's rows, the W rows and their scales.
fn shared_bytes(tiles: usize, (warps, stages): (usize, usize)) -> usize {
    TABLE_BYTES + stages * (8 * tiles * X_PITCH + warps * WARP_ROWS * (128 + 16))
}

/// The block for `tiles` tiles of 8 batch rows within `optin` bytes of shared memory: the first
/// of `SHAPES` that fits, or `LORA_FT_NF4_SKINNY=<warps>x<stages>` (read once, a diagnostic for
/// measuring the others) where that fits.
fn block_shape(tiles: usize, optin: usize) -> Option<(usize, usize)> {
    static FORCED: std::sync::OnceLock<Option<(usize, usize)>> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| {
        let v = std::env::var("LORA_FT_NF4_SKINNY").ok()?;
        let (w, s) = v.split_once('x')?;
        let shape = (w.parse().ok()?, s.parse().ok()?);
        SHAPES.contains(&shape).then_some(shape)
    });
    let fits = |&shape: &(usize, usize)| shared_bytes(tiles, shape) + STATIC_BYTES <= optin;
    match forced {
        Some(shape) if fits(shape) => Some(*shape),
        _ => SHAPES.into_iter().find(fits),
    }
}

/// How many splits of `supers` stages each of `tiles` tiles takes on `sms` multiprocessors (one
/// block each), and the stages of a split: the fewest rounds of the persistent grid, each unit
/// costing its stages plus one (filling the pipeline, the epilogue), within the workspace.
fn splits_for(tiles: usize, supers: usize, sms: usize, partials_per_split: usize) -> (usize, usize) {
    let mut best = (1, supers, usize::MAX);
    for wanted in 1..=supers.min(MAX_SPLITS) {
        let per = supers.div_ceil(wanted);
        let splits = supers.div_ceil(per);
        if splits > 1 && (splits * partials_per_split > PARTIALS || tiles > COUNTERS) {
            continue;
        }
        let cost = (tiles * splits).div_ceil(sms) * (per + 1);
        if cost < best.2 {
            best = (splits, per, cost);
        }
    }
    (best.0, best.1)
}

/// A stream's split-k workspace.
struct Workspace {
    partial: CudaSlice<f32>,
    arrived: CudaSlice<u32>,
}

static WORKSPACES: Mutex<Option<HashMap<usize, Workspace>>> = Mutex::new(None);

/// Allocates the device stream's split-k workspace if it has none yet (before a CUDA graph
/// records, so the recording never allocates it).
pub fn pin_workspace(dev: &CudaDevice) -> Result<()> {
    workspace(dev).map(|_| ())
}

/// The stream's workspace: the partial sums' and the counters' device addresses.
fn workspace(dev: &CudaDevice) -> Result<(u64, u64)> {
    let stream = dev.cuda_stream();
    let mut all =
        WORKSPACES.lock().map_err(|_| candle_core::Error::Msg("the NF4 split-k workspaces are poisoned".into()))?;
    let all = all.get_or_insert_with(HashMap::new);
    let w = match all.entry(stream.cu_stream() as usize) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(Workspace {
            // SAFETY: the kernel writes every partial sum it reads, before it reads it.
            partial: unsafe { stream.alloc::<f32>(PARTIALS) }.w()?,
            arrived: stream.alloc_zeros::<u32>(COUNTERS).w()?,
        }),
    };
    let (partial, _) = w.partial.device_ptr(&stream);
    let (arrived, _) = w.arrived.device_ptr(&stream);
    Ok((partial, arrived))
}

/// Launches `nf4_skinny_<dtype>_<tiles>` (the block `block_shape` picks) over `groups` 16-row groups of the launch's weights
/// (`segments`, nf4_gemv.cu's `Nf4Segments`) for the `n` rows of x (`in_dim` wide, a multiple of
/// `KC`). Returns false, launching nothing, where the device's shared memory cannot hold even
/// the smaller block: the caller runs another kernel.
///
/// # Safety
/// As `nf4_gemv::gemv_segments`: `segments` addresses valid weights and outputs on this device.
pub(super) unsafe fn launch<T: CudaDType + WithDType + DeviceRepr, S: DeviceRepr>(
    dev: &CudaDevice,
    x: &CudaView<T>,
    n: usize,
    in_dim: usize,
    groups: usize,
    accumulate: bool,
    segments: &S,
) -> Result<bool> {
    let tiles_nt = n.div_ceil(8).next_power_of_two();
    let stream = dev.cuda_stream();
    let optin = stream.context().attribute(SMEM_OPTIN).w()?.max(0) as usize;
    let Some((warps, stages)) = block_shape(tiles_nt, optin) else {
        return Ok(false);
    };
    let tile_groups = warps * WARP_ROWS / 16;
    let tiles = groups.div_ceil(tile_groups);
    let supers = in_dim / KC;
    let sms = super::multiprocessors(dev)?;
    let (splits, per) = splits_for(tiles, supers, sms, n * groups * 16);
    let (partial, arrived) = workspace(dev)?;
    let func = KERNELS.function(dev, &format!("nf4_skinny_{}_{tiles_nt}", suffix(T::DTYPE)?))?;
    let smem = shared_bytes(tiles_nt, (warps, stages)) as u32;
    func.set_attribute(MAX_DYNAMIC_SMEM, smem as i32).w()?;
    let cfg = LaunchConfig {
        grid_dim: ((tiles * splits).min(sms) as u32, 1, 1),
        block_dim: ((warps * 32) as u32, 1, 1),
        shared_mem_bytes: smem,
    };
    let (n_i, in_i, groups_i, acc) = (n as i32, in_dim as i32, groups as i32, accumulate as i32);
    let (splits_i, per_i, stages_i) = (splits as i32, per as i32, stages as i32);
    let mut b = func.builder();
    b.arg(x).arg(&n_i).arg(&in_i).arg(&groups_i).arg(&acc).arg(segments);
    b.arg(&partial).arg(&arrived).arg(&splits_i).arg(&per_i).arg(&stages_i);
    unsafe { b.launch(cfg) }.w()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100's or H200's 227 KiB take 8 warps, with 4 stages to 32 rows and 3 at 64; an RTX
    /// 4090's 99 KiB take the smaller blocks or none.
    #[test]
    fn blocks_fit_the_shared_memory() {
        let hopper = 227 * 1024;
        assert_eq!(block_shape(2, hopper), Some((8, 4)));
        assert_eq!(block_shape(4, hopper), Some((8, 4)));
        assert_eq!(block_shape(8, hopper), Some((8, 3)));
        let ada = 99 * 1024;
        assert_eq!(block_shape(1, ada), Some((4, 4)));
        assert_eq!(block_shape(8, ada), None);
        for tiles in [1, 2, 4, 8] {
            for optin in [hopper, ada, 163 * 1024] {
                if let Some(shape) = block_shape(tiles, optin) {
                    assert!(shared_bytes(tiles, shape) + STATIC_BYTES <= optin);
                }
            }
        }
    }

    /// The splits fill the card without passing the workspace: Llama-3.1-8B's decode
    /// projections at 64 rows on 132 multiprocessors (8-warp tiles of 8 groups).
    #[test]
    fn splits_fill_the_multiprocessors_within_the_workspace() {
        // gate and up (28,672 rows, 224 tiles): enough tiles, no split
        assert_eq!(splits_for(224, 16, 132, 64 * 28672), (1, 16));
        // o (4,096 rows, 32 tiles): 4 splits of 4 stages, 128 units
        assert_eq!(splits_for(32, 16, 132, 64 * 4096), (4, 4));
        // down (4,096 × 14,336): 4 splits of 14 stages
        assert_eq!(splits_for(32, 56, 132, 64 * 4096), (4, 14));
        // a split never passes the workspace: 2 splits of this would
        let (splits, _) = splits_for(1, 16, 132, PARTIALS / 2 + 1);
        assert_eq!(splits, 1);
        // every stage in exactly one split
        for (tiles, supers) in [(3, 5), (24, 16), (7, 56), (1, 1)] {
            let (splits, per) = splits_for(tiles, supers, 132, 1);
            assert!(splits * per >= supers && (splits - 1) * per < supers, "{tiles} {supers}");
        }
    }
}
