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
/// blocks for two a multiprocessor, a split at least 32 positions of the cache's capacity, at
/// most 64. It depends on the batch and the capacity, never on the rows' lengths, so a step
/// recorded in a CUDA graph replays unchanged as the rows grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub group: usize,
    pub hsplit: usize,
    pub splits: usize,
}

impl Launch {
    pub fn new(heads: usize, kv_heads: usize, rows: usize, capacity: usize, multiprocessors: usize) -> Self {
        let per_kv = (heads / kv_heads.max(1)).max(1);
        let group = per_kv.min(8).next_power_of_two();
        let hsplit = per_kv.div_ceil(8);
        let blocks = (kv_heads * hsplit * rows).max(1);
        let wanted = (2 * multiprocessors).div_ceil(blocks);
        let splits = wanted.clamp(1, capacity.div_ceil(32).clamp(1, 64));
        Launch { group, hsplit, splits }
    }
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
    let shape = Launch::new(heads, kv_heads, b, capacity, super::multiprocessors(&dev)?);
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

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor, D};

    use super::*;
    use crate::model::ops::attention::{attention_packed, ScoreRule};
    use crate::testing::assert_within_reference_error;

    /// Row r's context in f64 on the CPU: its query against positions `first..len` of its slot.
    fn exact(q: &Tensor, k: &Tensor, v: &Tensor, (slot, len): (usize, usize), rule: &ScoreRule) -> Tensor {
        let f64 = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap();
        let (q, k, v) = (f64(q), f64(k), f64(v));
        let (heads, d) = q.dims2().unwrap();
        let kv = k.dim(2).unwrap();
        let first = rule.window.map_or(0, |w| len.saturating_sub(w));
        let keys = |x: &Tensor| x.get(slot).unwrap().narrow(0, first, len - first).unwrap();
        let (k, v) = (keys(&k), keys(&v)); // [n, kv, d]
        let rows: Vec<Tensor> = (0..heads)
            .map(|h| {
                let g = h / (heads / kv);
                let kh = k.narrow(1, g, 1).unwrap().squeeze(1).unwrap(); // [n, d]
                let vh = v.narrow(1, g, 1).unwrap().squeeze(1).unwrap();
                let qh = q.get(h).unwrap().reshape((1, d)).unwrap();
                let mut s = (qh.matmul(&kh.t().unwrap()).unwrap() * rule.scale).unwrap();
                if let Some(cap) = rule.softcap {
                    s = ((s / cap).unwrap().tanh().unwrap() * cap).unwrap();
                }
                let p = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
                p.matmul(&vh).unwrap().squeeze(0).unwrap()
            })
            .collect();
        Tensor::stack(&rows, 0).unwrap()
    }

    /// The launch's shape: GQA groups as the kernel's G (a power of two, at most 8, more
    /// blocks a kv head past 8), splits for two blocks a multiprocessor, at least 32 positions
    /// of the capacity each, at most 64, and none for a batch that fills the GPU.
    #[test]
    fn launches_group_heads_and_split_short_batches() {
        let llama = |rows, capacity| Launch::new(32, 8, rows, capacity, 132);
        assert_eq!(llama(1, 768), Launch { group: 4, hsplit: 1, splits: 24 });
        assert_eq!(llama(1, 131072), Launch { group: 4, hsplit: 1, splits: 33 });
        assert_eq!(llama(8, 768), Launch { group: 4, hsplit: 1, splits: 5 });
        assert_eq!(llama(64, 768), Launch { group: 4, hsplit: 1, splits: 1 });
        assert_eq!(Launch::new(28, 4, 1, 40, 132).group, 8);
        assert_eq!(Launch::new(16, 1, 1, 40, 132), Launch { group: 8, hsplit: 2, splits: 2 });
        assert_eq!(Launch::new(8, 8, 2, 10, 132), Launch { group: 1, hsplit: 1, splits: 1 });
    }

    /// The kernel against the training attention run a row at a time (its reference, the path
    /// it replaces), both against the answer in f64: within the crate's multiple of the
    /// reference's own error. Head sizes 64, 128 and 256; plain heads and GQA groups of 4, 7 and
    /// 16 query heads a kv head; a window, a soft cap; rows of one position and of a full slot,
    /// short batches whose long rows run in many splits and their merge; in f32, f16 and bf16.
    #[test]
    fn cuda_decode_attention_matches_the_training_attention() {
        let gpu = Device::new_cuda(0).unwrap();
        // slots, capacity, and each row's (slot, length)
        type Batch<'a> = (usize, usize, &'a [(usize, usize)]);
        let batches: [Batch; 3] = [
            (5, 40, &[(3, 1), (0, 17), (4, 40), (1, 33)]),
            (2, 1500, &[(1, 1500)]),
            (3, 800, &[(2, 777), (0, 1)]),
        ];
        let heads_of = [(64, 4, 1), (128, 8, 2), (256, 4, 4), (128, 28, 4), (64, 16, 1)];
        for ((slots, capacity, rows), (d, heads, kv)) in
            batches.iter().flat_map(|b| heads_of.map(|h| (*b, h)))
        {
            let q = Tensor::randn(0f32, 1.0, (rows.len(), heads, d), &Device::Cpu).unwrap();
            let k = Tensor::randn(0f32, 1.0, (slots, capacity, kv, d), &Device::Cpu).unwrap();
            let v = Tensor::randn(0f32, 1.0, (slots, capacity, kv, d), &Device::Cpu).unwrap();
            let slot_ids: Vec<u32> = rows.iter().map(|r| r.0 as u32).collect();
            let lens: Vec<u32> = rows.iter().map(|r| r.1 as u32).collect();
            let (slot_ids, lens) = (Tensor::new(slot_ids, &gpu).unwrap(), Tensor::new(lens, &gpu).unwrap());
            for (softcap, window) in [(None, None), (Some(20.0), Some(9))] {
                let rule = ScoreRule { scale: 1.0 / (d as f64).sqrt(), softcap, window };
                let exact: Vec<Tensor> = rows
                    .iter()
                    .enumerate()
                    .map(|(r, &row)| exact(&q.get(r).unwrap(), &k, &v, row, &rule))
                    .collect();
                let exact = Tensor::stack(&exact, 0).unwrap();
                for dtype in [DType::F32, DType::F16, DType::BF16] {
                    let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
                    let (qg, kg, vg) = (on(&q), on(&k), on(&v));
                    let scores = Scores { scale: rule.scale, softcap, window };
                    let ours = decode_attention(&qg, (&kg, &vg), (&slot_ids, &lens), scores).unwrap();
                    let reference: Vec<Tensor> = rows
                        .iter()
                        .enumerate()
                        .map(|(r, &(slot, len))| {
                            let q = qg.get(r).unwrap().reshape((1, heads, 1, d)).unwrap();
                            let seen = |x: &Tensor| {
                                x.narrow(0, slot, 1)
                                    .unwrap()
                                    .narrow(1, 0, len)
                                    .unwrap()
                                    .transpose(1, 2)
                                    .unwrap()
                                    .contiguous()
                                    .unwrap()
                            };
                            let (context, _) =
                                attention_packed(&q, &seen(&kg), &seen(&vg), (None, None), &rule).unwrap();
                            context.reshape((heads, d)).unwrap()
                        })
                        .collect();
                    let reference = Tensor::stack(&reference, 0).unwrap();
                    let what = format!(
                        "{} rows of capacity {capacity}, d {d}, {heads}/{kv} heads, cap {softcap:?}, window \
                         {window:?}, {dtype:?}",
                        rows.len()
                    );
                    assert_within_reference_error(&what, &ours, &reference, &exact);
                }
            }
        }
    }
}
