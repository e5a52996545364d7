//! One decode step's attention for many sequences (`decode_attention.cu`, flash decoding): each
//! row's query against its own slot of the engine's KV cache, of its own length, the query heads
//! of a kv head in one block, short batches split along the positions and merged by a second
//! launch ([`Launch`]). The engine's CPU path (a row at a time through the training attention)
//! is its reference.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, DType, Result, Tensor, WithDType};

use super::{by_dtype, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("decode_attention");
const THREADS: u32 = 128;

/// How one step's attention is laid out on the GPU: query heads a block (`group`, the kernel's G:
/// the heads sharing a kv head, at most 8, rounded up to a power of two), blocks a kv head
/// (`hsplit`, past 8 heads a kv head), and the splits of each row's positions (`splits`): enough
/// blocks for `per_sm` a multiprocessor (of `sms`), a split at least 32 positions of the cache's
/// capacity, at most 64. It depends on the batch and the capacity, never on the rows' lengths, so
/// a step recorded in a CUDA graph replays unchanged as the rows grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub group: usize,
    pub hsplit: usize,
    pub splits: usize,
}

impl Launch {
    pub fn new(
        heads: usize,
        kv_heads: usize,
        rows: usize,
        capacity: usize,
        (sms, per_sm): (usize, usize),
    ) -> Self {
        let per_kv = (heads / kv_heads.max(1)).max(1);
        let group = per_kv.min(8).next_power_of_two();
        let hsplit = per_kv.div_ceil(8);
        let blocks = (kv_heads * hsplit * rows).max(1);
        let wanted = (per_sm * sms).div_ceil(blocks);
        let splits = wanted.clamp(1, capacity.div_ceil(32).clamp(1, 64));
        Launch { group, hsplit, splits }
    }
}

/// The blocks a multiprocessor the splits aim for: 2, or `LORA_FT_ATTENTION_BLOCKS_PER_SM` (read
/// once; a diagnostic, for measuring the split).
fn blocks_per_sm() -> usize {
    static PER_SM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PER_SM.get_or_init(|| match std::env::var("LORA_FT_ATTENTION_BLOCKS_PER_SM") {
        Err(_) => 2,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                tracing::warn!(
                    "LORA_FT_ATTENTION_BLOCKS_PER_SM={v:?} is not a positive whole number: using 2"
                );
                2
            }
        },
    })
}

/// The head sizes the kernel is instantiated for.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// The score rule of `ops::attention::ScoreRule`, as the kernel takes it.
#[derive(Debug, Clone, Copy)]
pub struct Scores {
    pub scale: f64,
    pub softcap: Option<f64>,
    pub window: Option<usize>,
}

/// The context `[b, heads, d]` of queries `q` `[b, heads, d]` (contiguous) against the caches
/// `k`, `v` `[slots, capacity, kv_heads, d]`: row r reads slot `slots[r]`, positions
/// `0..lens[r]` (u32 tensors `[b]`).
pub fn decode_attention(
    q: &Tensor,
    (k, v): (&Tensor, &Tensor),
    (slots, lens): (&Tensor, &Tensor),
    scores: Scores,
) -> Result<Tensor> {
    by_dtype!(q.dtype(), typed(q, (k, v), (slots, lens), scores))
}

fn typed<T: CudaDType + WithDType + DeviceRepr>(
    q: &Tensor,
    (k, v): (&Tensor, &Tensor),
    (slots, lens): (&Tensor, &Tensor),
    scores: Scores,
) -> Result<Tensor> {
    let (b, heads, d) = q.dims3()?;
    let (_, capacity, kv_heads, kd) = k.dims4()?;
    if !HEAD_DIMS.contains(&d) || kd != d || v.dims() != k.dims() || kv_heads == 0 || heads % kv_heads != 0 {
        bail!(
            "decode attention: q {:?}, k {:?}, v {:?} (head_dim one of {HEAD_DIMS:?})",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if !(q.is_contiguous() && k.is_contiguous() && v.is_contiguous())
        || k.dtype() != T::DTYPE
        || v.dtype() != T::DTYPE
    {
        bail!("decode attention: contiguous q, k, v of one dtype");
    }
    if slots.dims() != [b] || lens.dims() != [b] || slots.dtype() != DType::U32 || lens.dtype() != DType::U32
    {
        bail!("decode attention: slots and lens are u32 [{b}]");
    }
    let (slots, lens) = (slots.contiguous()?, lens.contiguous()?);
    let dev = cuda_device(q)?;
    let out = unsafe { dev.alloc::<T>(b * heads * d)? };
    let shape = Launch::new(heads, kv_heads, b, capacity, (super::multiprocessors(&dev)?, blocks_per_sm()));
    let dtype = suffix(T::DTYPE)?;
    let func = KERNELS.function(&dev, &format!("decode_attention_{d}_{dtype}_g{}", shape.group))?;
    // the splits' partial results, f32 (none when a block takes a row's every position)
    let parts = shape.splits.max(2) * b * heads;
    let part_acc = unsafe { dev.alloc::<f32>(if shape.splits > 1 { parts * d } else { 1 })? };
    let part_ml = unsafe { dev.alloc::<f32>(if shape.splits > 1 { parts * 2 } else { 1 })? };
    {
        let g = [q, k, v, &slots, &lens].map(|t| t.storage_and_layout().0);
        let (qv, kv, vv) = (view::<T>(&g[0], q)?, view::<T>(&g[1], k)?, view::<T>(&g[2], v)?);
        let (sv, lv) = (view::<u32>(&g[3], &slots)?, view::<u32>(&g[4], &lens)?);
        let (heads_i, kv_heads_i, capacity_i) = (heads as i32, kv_heads as i32, capacity as i32);
        let scale = scores.scale as f32;
        let softcap = scores.softcap.unwrap_or(0.0) as f32;
        let window = scores.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let (splits, hsplit) = (shape.splits as i32, shape.hsplit as i32);
        let mut l = func.builder();
        l.arg(&qv).arg(&kv).arg(&vv).arg(&out).arg(&part_acc).arg(&part_ml).arg(&sv).arg(&lv);
        l.arg(&heads_i).arg(&kv_heads_i).arg(&capacity_i).arg(&scale).arg(&softcap).arg(&window);
        l.arg(&splits).arg(&hsplit);
        let config = LaunchConfig {
            grid_dim: ((kv_heads * shape.hsplit) as u32, b as u32, shape.splits as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { l.launch(config) }.w()?;
    }
    if shape.splits > 1 {
        let combine = KERNELS.function(&dev, &format!("decode_attention_combine_{dtype}"))?;
        let (heads_i, splits, d_i) = (heads as i32, shape.splits as i32, d as i32);
        let mut l = combine.builder();
        l.arg(&part_acc).arg(&part_ml).arg(&out).arg(&heads_i).arg(&splits).arg(&d_i);
        let config = LaunchConfig {
            grid_dim: (heads as u32, b as u32, 1),
            block_dim: (d as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { l.launch(config) }.w()?;
    }
    Ok(wrap(out, &dev, &[b, heads, d]))
}

/// Writes row r of `k`, `v` (`[b, kv_heads · d]`, contiguous) at position `positions[r]` of slot
/// `slots[r]` of the caches `[slots, capacity, kv_heads, d]` (u32 tensors `[b]`), in place.
pub fn write_slots(
    (k, v): (&Tensor, &Tensor),
    (k_cache, v_cache): (&Tensor, &Tensor),
    (slots, positions): (&Tensor, &Tensor),
) -> Result<()> {
    let (b, width) = k.dims2()?;
    let (_, capacity, kv_heads, d) = k_cache.dims4()?;
    let dtype = k_cache.dtype();
    let same = |t: &Tensor| t.is_contiguous() && t.dtype() == dtype;
    if v.dims() != [b, width]
        || kv_heads * d != width
        || v_cache.dims() != k_cache.dims()
        || ![k, v, k_cache, v_cache].into_iter().all(same)
    {
        bail!(
            "KV write: rows k {:?} v {:?} into caches {:?} {:?} of one dtype, all contiguous",
            k.dims(),
            v.dims(),
            k_cache.dims(),
            v_cache.dims()
        );
    }
    let index = |t: &Tensor| t.dims() == [b] && t.dtype() == DType::U32;
    if !index(slots) || !index(positions) {
        bail!("KV write: slots and positions are u32 [{b}]");
    }
    if b == 0 {
        return Ok(());
    }
    let (slots, positions) = (slots.contiguous()?, positions.contiguous()?);
    let dev = cuda_device(k)?;
    let stream = dev.cuda_stream();
    let func = KERNELS.function(&dev, &format!("write_slots_{}", suffix(dtype)?))?;
    let [ka, va, kca, vca, sa, pa] =
        [k, v, k_cache, v_cache, &slots, &positions].map(|t| super::address(t, &stream));
    let (ka, va, kca, vca, sa, pa) = (ka?, va?, kca?, vca?, sa?, pa?);
    let (capacity, width) = (capacity as i32, width as i32);
    let mut l = func.builder();
    l.arg(&ka).arg(&va).arg(&kca).arg(&vca).arg(&sa).arg(&pa).arg(&capacity).arg(&width);
    let config = candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (b as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: every address is a live tensor of the checked shape held across the launch; the
    // caches are written only on this stream.
    unsafe { l.launch(config) }.w()?;
    Ok(())
}

/// Threads of a `rope_write_slots` block.
const ROPE_THREADS: usize = 256;

/// One decode step's RoPE and cache write in one launch: row r of q `[b, heads, d]` and k
/// `[b, kv_heads, d]` rotated at position `positions[r]` by the tables `cos`, `sin`
/// `[positions, d / 2]` (rotate_half, the arithmetic of `rope.cu`), k and v (`[b, kv_heads, d]`)
/// written at that position of slot `slots[r]` of the caches `[slots, capacity, kv_heads, d]`,
/// in place; returns the rotated q `[b, heads, d]`. Everything contiguous, of one dtype.
pub fn rope_write_slots(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (cos, sin): (&Tensor, &Tensor),
    (k_cache, v_cache): (&Tensor, &Tensor),
    (slots, positions): (&Tensor, &Tensor),
) -> Result<Tensor> {
    by_dtype!(q.dtype(), rope_write_typed((q, k, v), (cos, sin), (k_cache, v_cache), (slots, positions)))
}

fn rope_write_typed<T: CudaDType + WithDType + DeviceRepr>(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (cos, sin): (&Tensor, &Tensor),
    (k_cache, v_cache): (&Tensor, &Tensor),
    (slots, positions): (&Tensor, &Tensor),
) -> Result<Tensor> {
    let (b, heads, d) = q.dims3()?;
    let (_, capacity, kv_heads, kd) = k_cache.dims4()?;
    let half = d / 2;
    let same = |t: &Tensor| t.is_contiguous() && t.dtype() == T::DTYPE;
    if !d.is_multiple_of(2)
        || kd != d
        || k.dims() != [b, kv_heads, d]
        || v.dims() != [b, kv_heads, d]
        || v_cache.dims() != k_cache.dims()
        || cos.dims2()?.1 != half
        || sin.dims() != cos.dims()
        || ![q, k, v, cos, sin, k_cache, v_cache].into_iter().all(same)
    {
        bail!(
            "RoPE and KV write: q {:?}, k {:?}, v {:?}, tables {:?}, caches {:?}, all contiguous of one dtype",
            q.dims(),
            k.dims(),
            v.dims(),
            cos.dims(),
            k_cache.dims()
        );
    }
    let index = |t: &Tensor| t.dims() == [b] && t.dtype() == DType::U32;
    if !index(slots) || !index(positions) {
        bail!("RoPE and KV write: slots and positions are u32 [{b}]");
    }
    let dev = cuda_device(q)?;
    if b == 0 {
        return Tensor::zeros((0, heads, d), T::DTYPE, q.device());
    }
    let (slots, positions) = (slots.contiguous()?, positions.contiguous()?);
    let stream = dev.cuda_stream();
    let q_out = unsafe { dev.alloc::<T>(b * heads * d)? };
    let func = KERNELS.function(&dev, &format!("rope_write_slots_{}", suffix(T::DTYPE)?))?;
    let [qa, ka, va, ca, sa, kca, vca, sla, pa] =
        [q, k, v, cos, sin, k_cache, v_cache, &slots, &positions].map(|t| super::address(t, &stream));
    let (qa, ka, va, ca, sa, kca, vca, sla, pa) = (qa?, ka?, va?, ca?, sa?, kca?, vca?, sla?, pa?);
    // a block a row and a few heads (q, k, then v): a thread a pair of values
    let per_block = (ROPE_THREADS / half).max(1);
    let blocks_y = (heads + 2 * kv_heads).div_ceil(per_block);
    let (heads_i, kv_heads, half, capacity) = (heads as i32, kv_heads as i32, half as i32, capacity as i32);
    let per_block_i = per_block as i32;
    let mut l = func.builder();
    l.arg(&qa).arg(&ka).arg(&va).arg(&ca).arg(&sa).arg(&q_out).arg(&kca).arg(&vca).arg(&sla).arg(&pa);
    l.arg(&heads_i).arg(&kv_heads).arg(&half).arg(&capacity).arg(&per_block_i);
    let config = LaunchConfig {
        grid_dim: (b as u32, blocks_y as u32, 1),
        block_dim: (ROPE_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: every address is a live tensor of the checked shape held across the launch; the
    // caches are written only on this stream; the caller keeps each position below the tables'
    // length and the capacity.
    unsafe { l.launch(config) }.w()?;
    Ok(wrap(q_out, &dev, &[b, heads, d]))
}

#[cfg(all(test, feature = "cuda"))]
#[path = "decode_attention_tests.rs"]
mod tests;
