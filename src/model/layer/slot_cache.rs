//! The KV cache of sequences decoded together (the engine's): one buffer per layer for keys and
//! one for values, `[slots, capacity, kv_heads, d]`, allocated once; each sequence owns a slot
//! for its life. A position's keys of every head are one contiguous run, so a decode step writes
//! each row's new keys in one piece (one scatter for all rows), a prompt's prefill is one copy,
//! and the samples of one prompt start from copies of its slot.

use candle_core::{DType, Device, Result, Tensor};

use super::KvCache;

pub struct SlotCache {
    k: Tensor,
    v: Tensor,
}

/// Where each row of a decode step reads and writes: its slot and its position (the slot's
/// length before the step), as the kernels take them.
pub struct DecodeRows {
    /// Host copies of the same (the CPU path's); empty for rows given on the device.
    pub slots: Vec<usize>,
    pub positions: Vec<usize>,
    len: usize,
    /// u32 `[b]` tensors of the same, and each row's length after the step (the CUDA kernel's).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) slots_t: Tensor,
    pub(super) positions_t: Tensor,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) lens_t: Tensor,
    /// The CPU's scatter: u32 `[b, kv_heads · d]`, each row's place in a buffer seen as
    /// `[slots · capacity, kv · d]` (on CUDA a kernel reads the slots and positions instead).
    write_at: Option<Tensor>,
}

impl DecodeRows {
    /// The rows of a step over `cache`: row r in slot `slots[r]` at position `positions[r]`
    /// (below the capacity).
    pub fn new(slots: Vec<usize>, positions: Vec<usize>, cache: &SlotCache) -> Result<Self> {
        let (n_slots, capacity, width) = (cache.slots(), cache.capacity(), cache.width());
        if slots.len() != positions.len()
            || slots.iter().zip(&positions).any(|(&s, &p)| s >= n_slots || p >= capacity)
        {
            candle_core::bail!(
                "decode rows {slots:?} at {positions:?} outside {n_slots} slots of {capacity}"
            );
        }
        let device = cache.k.device();
        let u32s = |values: Vec<u32>| Tensor::from_vec(values, slots.len(), device);
        let write_at = match device.is_cpu() {
            true => {
                let places: Vec<u32> = slots
                    .iter()
                    .zip(&positions)
                    .flat_map(|(&s, &p)| std::iter::repeat_n((s * capacity + p) as u32, width))
                    .collect();
                Some(Tensor::from_vec(places, (slots.len(), width), device)?)
            }
            false => None,
        };
        Ok(Self {
            slots_t: u32s(slots.iter().map(|&s| s as u32).collect())?,
            positions_t: u32s(positions.iter().map(|&p| p as u32).collect())?,
            lens_t: u32s(positions.iter().map(|&p| p as u32 + 1).collect())?,
            write_at,
            len: slots.len(),
            slots,
            positions,
        })
    }

    /// Rows whose slots, positions and lengths after the step are already u32 `[b]` tensors on a
    /// CUDA device (a captured step's inputs, refilled between replays), unchecked: the caller
    /// keeps them inside the cache.
    pub fn on_device(slots: Tensor, positions: Tensor, lens: Tensor) -> Result<Self> {
        let len = slots.dim(0)?;
        if slots.device().is_cpu() || [&positions, &lens].iter().any(|t| t.dims() != [len]) {
            candle_core::bail!("rows on the device are CUDA u32 tensors [b] of slots, positions and lengths");
        }
        Ok(Self {
            slots: Vec::new(),
            positions: Vec::new(),
            len,
            slots_t: slots,
            positions_t: positions,
            lens_t: lens,
            write_at: None,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the host copies are here (the CPU path reads them).
    pub(super) fn on_host(&self) -> bool {
        self.slots.len() == self.len
    }
}

impl SlotCache {
    /// `slots` slots of `capacity` positions of `kv_heads` heads of `head_dim`, zeroed.
    pub fn new(
        (slots, capacity): (usize, usize),
        (kv_heads, head_dim): (usize, usize),
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let shape = (slots, capacity, kv_heads, head_dim);
        Ok(Self { k: Tensor::zeros(shape, dtype, device)?, v: Tensor::zeros(shape, dtype, device)? })
    }

    /// Bytes a cache of this shape takes (keys and values).
    pub fn bytes(
        (slots, capacity): (usize, usize),
        (kv_heads, head_dim): (usize, usize),
        dtype: DType,
    ) -> usize {
        2 * slots * capacity * kv_heads * head_dim * dtype.size_in_bytes()
    }

    /// Bytes this cache's buffers hold (keys and values), as allocated.
    pub fn allocated_bytes(&self) -> usize {
        [&self.k, &self.v].iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }

    pub fn slots(&self) -> usize {
        self.k.dim(0).unwrap_or(0)
    }

    pub fn capacity(&self) -> usize {
        self.k.dim(1).unwrap_or(0)
    }

    /// kv_heads · head_dim, the values of one position.
    fn width(&self) -> usize {
        self.k.dim(2).unwrap_or(0) * self.k.dim(3).unwrap_or(0)
    }

    /// The buffers seen as `[slots · capacity · kv · d]`.
    fn flat(&self) -> Result<(Tensor, Tensor)> {
        Ok((self.k.flatten_all()?, self.v.flatten_all()?))
    }

    /// Writes the positions row `row` of `cache` holds (a prompt's prefill) into `slot` from 0.
    pub fn fill(&self, slot: usize, (cache, row): (&KvCache, usize)) -> Result<()> {
        let Some((k, v)) = cache.seen()? else { return Ok(()) };
        let (k, v) = (k.narrow(0, row, 1)?, v.narrow(0, row, 1)?);
        let len = k.dim(2)?;
        if len > self.capacity() || slot >= self.slots() {
            candle_core::bail!("{len} positions into slot {slot} of {} × {}", self.slots(), self.capacity());
        }
        let (fk, fv) = self.flat()?;
        let at = slot * self.capacity() * self.width();
        // [1, kv, len, d] → [len, kv, d], the slot's layout
        let run = |x: &Tensor| x.squeeze(0)?.transpose(0, 1)?.contiguous()?.flatten_all();
        fk.slice_set(&run(&k)?.to_dtype(self.k.dtype())?, 0, at)?;
        fv.slice_set(&run(&v)?.to_dtype(self.v.dtype())?, 0, at)
    }

    /// Copies the first `len` positions of slot `from` into slot `to`.
    pub fn copy_slot(&self, from: usize, to: usize, len: usize) -> Result<()> {
        if from == to || len == 0 {
            return Ok(());
        }
        let (fk, fv) = self.flat()?;
        let run = self.capacity() * self.width();
        for f in [fk, fv] {
            let part = f.narrow(0, from * run, len * self.width())?.copy()?;
            f.slice_set(&part, 0, to * run)?;
        }
        Ok(())
    }

    /// Writes each row's new keys and values (`[b, kv, 1, d]`, views of `[b, 1, kv, d]` memory
    /// too) at its place.
    pub(super) fn write(&self, k: &Tensor, v: &Tensor, rows: &DecodeRows) -> Result<()> {
        let width = self.width();
        let b = rows.len();
        let as_rows = |x: &Tensor| x.transpose(1, 2)?.contiguous()?.reshape((b, width));
        #[cfg(feature = "cuda")]
        if self.k.device().is_cuda() {
            return crate::cuda::decode_attention::write_slots(
                (&as_rows(k)?, &as_rows(v)?),
                (&self.k, &self.v),
                (&rows.slots_t, &rows.positions_t),
            );
        }
        let Some(write_at) = &rows.write_at else {
            candle_core::bail!("decode rows given on the device write a CUDA cache only");
        };
        let (k2, v2) = (self.k.reshape(((), width))?, self.v.reshape(((), width))?);
        k2.scatter_set(write_at, &as_rows(k)?, 0)?;
        v2.scatter_set(write_at, &as_rows(v)?, 0)
    }

    /// The first `len` positions of `slot` as `[1, kv, len, d]` views.
    pub(super) fn seen(&self, slot: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let view = |x: &Tensor| x.narrow(0, slot, 1)?.narrow(1, 0, len)?.transpose(1, 2);
        Ok((view(&self.k)?, view(&self.v)?))
    }

    /// The buffers, `[slots, capacity, kv, d]`, for the decode kernel.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn buffers(&self) -> (&Tensor, &Tensor) {
        (&self.k, &self.v)
    }
}
