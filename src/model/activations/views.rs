//! A tensor's view of its buffer (shape, strides, start offset), rebuilt over a copy of that
//! buffer: offloaded activations (`layer_offload.rs`) copy whole buffers out and back, once
//! each however many tensors view them (q, k and v heads are strided views of their
//! projections; the attention's saved context shares its output's memory), and the backward
//! gets tensors laid out exactly as the forward left them. Candle has no constructor from a
//! layout, so the view is rebuilt from the buffer with the ops that make views: narrow, reshape
//! and permute.

use candle_core::{bail, Result, Tensor};

/// Where a tensor's elements sit in its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    shape: Vec<usize>,
    stride: Vec<usize>,
    start: usize,
}

impl View {
    pub fn of(t: &Tensor) -> Self {
        let layout = t.layout();
        Self { shape: t.dims().to_vec(), stride: layout.stride().to_vec(), start: layout.start_offset() }
    }

    /// Whether `over` can rebuild this view from a buffer of `len` elements: its dims of more
    /// than one element, outermost stride first, each stride a multiple of the next one's span
    /// (no overlap, no broadcast), within the buffer.
    pub fn rebuildable(&self, len: usize) -> bool {
        self.plan(len).is_some()
    }

    /// This view over `buffer`, a 1-D tensor holding the copied buffer.
    pub fn over(&self, buffer: &Tensor) -> Result<Tensor> {
        let len = buffer.elem_count();
        let Some(plan) = self.plan(len) else {
            bail!("the view {self:?} cannot be rebuilt over a buffer of {len} elements");
        };
        let Plan { order, parent, corner, trailing } = plan;
        if order.is_empty() {
            return buffer.narrow(0, self.start, 1)?.reshape(self.shape.as_slice());
        }
        let outer = self.stride[order[0]];
        let size = |j: usize| self.shape[order[j]];
        let mut t = buffer.narrow(0, corner[0] * outer, size(0) * outer)?;
        let mut dims = vec![size(0)];
        dims.extend_from_slice(&parent[1..]);
        if let Some(inner) = trailing {
            dims.push(inner);
        }
        t = t.reshape(dims)?;
        for (j, &at) in corner.iter().enumerate().take(order.len()).skip(1) {
            t = t.narrow(j, at, size(j))?;
        }
        if trailing.is_some() {
            t = t.narrow(order.len(), corner[order.len()], 1)?.squeeze(order.len())?;
        }
        // t's dims are in `order`; put each back at its own position
        let mut ranked: Vec<usize> = (0..order.len()).collect();
        ranked.sort_by_key(|&j| order[j]);
        t = t.permute(ranked)?;
        // the one-element dims come back as unit dims in place
        for (d, &n) in self.shape.iter().enumerate() {
            if n == 1 {
                t = t.unsqueeze(d)?;
            }
        }
        Ok(t)
    }

    /// The dims of more than one element outermost first, the buffer as the parent array they
    /// index (each stride a whole number of the next one's rows), and the start's coordinates in
    /// it; `None` where the layout is no such view or leaves the buffer.
    fn plan(&self, len: usize) -> Option<Plan> {
        let mut order: Vec<usize> = (0..self.shape.len()).filter(|&d| self.shape[d] > 1).collect();
        order.sort_by(|&a, &b| self.stride[b].cmp(&self.stride[a]));
        if order.is_empty() {
            return (self.start < len).then_some(Plan {
                order,
                parent: vec![],
                corner: vec![],
                trailing: None,
            });
        }
        let stride = |j: usize| self.stride[order[j]];
        let innermost = stride(order.len() - 1);
        if innermost == 0 {
            return None;
        }
        let mut parent = vec![0];
        for j in 1..order.len() {
            if stride(j - 1) % stride(j) != 0 {
                return None;
            }
            parent.push(stride(j - 1) / stride(j));
        }
        let trailing = (innermost > 1).then_some(innermost);
        let mut corner = Vec::with_capacity(order.len() + 1);
        let mut rest = self.start;
        for j in 0..order.len() {
            corner.push(rest / stride(j));
            rest %= stride(j);
        }
        if trailing.is_some() {
            corner.push(rest);
        }
        for j in 1..order.len() {
            if corner[j] + self.shape[order[j]] > parent[j] {
                return None;
            }
        }
        let end = (corner[0] + self.shape[order[0]]) * stride(0);
        (end <= len).then_some(Plan { order, parent, corner, trailing })
    }
}

struct Plan {
    /// Dims of more than one element, largest stride first.
    order: Vec<usize>,
    /// The parent array's sizes beyond the first (index 0 unused).
    parent: Vec<usize>,
    /// The start's coordinates, one per dim of `order` (and the trailing one).
    corner: Vec<usize>,
    /// The innermost stride where it is more than one element: a trailing parent dim.
    trailing: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// Each view of a buffer, rebuilt over a copy of the buffer, has the same layout and the
    /// same values.
    #[test]
    fn views_come_back_with_their_layout_and_values() -> Result<()> {
        let dev = Device::Cpu;
        let buffer = Tensor::arange(0u32, 2 * 6 * 3 * 4 * 5, &dev)?.to_dtype(DType::F32)?;
        let base = buffer.reshape((2 * 6, 3 * 4 * 5))?;
        // a copy of the buffer `t` views (as the offload copies it)
        let copy_of_buffer = |t: &Tensor| -> Result<Tensor> {
            let (storage, _) = t.storage_and_layout();
            match &*storage {
                candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => Tensor::new(v.as_slice(), &dev),
                _ => candle_core::bail!("an f32 CPU tensor"),
            }
        };
        let views = [
            base.clone(),
            // heads: [b, t, n, d] seen as [b, n, t, d]
            buffer.reshape((2, 6, 3, 20))?.transpose(1, 2)?,
            // q, k, v narrowed out of one fused projection, then as heads (a narrow's reshape
            // is a copy: a buffer of its own)
            base.narrow(1, 20, 20)?,
            base.narrow(1, 40, 20)?.reshape((2, 6, 4, 5))?.transpose(1, 2)?,
            buffer.reshape((2, 6, 3, 4, 5))?.narrow(2, 1, 1)?.squeeze(2)?.transpose(1, 2)?,
            base.narrow(0, 3, 5)?,
            base.narrow(0, 11, 1)?.narrow(1, 7, 9)?,
            base.t()?,
            buffer.reshape((2, 6, 3, 4, 5))?.permute((4, 0, 3, 1, 2))?.narrow(1, 1, 1)?,
            buffer.narrow(0, 17, 1)?.reshape(())?,
        ];
        for (i, v) in views.iter().enumerate() {
            let view = View::of(v);
            let copy = copy_of_buffer(v)?;
            assert!(view.rebuildable(copy.elem_count()), "view {i}");
            let back = view.over(&copy)?;
            assert_eq!(back.dims(), v.dims(), "view {i}");
            let (a, b) = (back.layout(), v.layout());
            let non_unit = |l: &candle_core::Layout| {
                l.dims().iter().zip(l.stride()).filter(|(&n, _)| n > 1).map(|(_, &s)| s).collect::<Vec<_>>()
            };
            assert_eq!((a.start_offset(), non_unit(a)), (b.start_offset(), non_unit(b)), "view {i}");
            let flat = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
            assert_eq!(flat(&back)?, flat(v)?, "view {i}");
        }
        Ok(())
    }

    #[test]
    fn broadcasts_overlaps_and_views_past_the_buffer_are_refused() -> Result<()> {
        let dev = Device::Cpu;
        let row = Tensor::arange(0f32, 8.0, &dev)?;
        assert!(!View::of(&row.reshape((1, 8))?.broadcast_as((4, 8))?).rebuildable(8));
        assert!(View::of(&row.narrow(0, 2, 6)?).rebuildable(8));
        assert!(!View::of(&row.narrow(0, 2, 6)?).rebuildable(7));
        let m = Tensor::arange(0f32, 12.0, &dev)?.reshape((3, 4))?;
        // a row stride that is not a whole number of the inner rows: [3, 2] with strides [3, 2]
        let odd = View { shape: vec![3, 2], stride: vec![3, 2], start: 0 };
        assert!(!odd.rebuildable(12));
        assert!(odd.over(&m.flatten_all()?).is_err());
        Ok(())
    }
}
