//! The keys and values of the positions a layer has seen, for generation: one buffer per tensor
//! with room to spare, each new position written into it in place, so that a token's step copies
//! its own keys and values, not every earlier position's as a concatenation would.

use candle_core::{Result, Tensor};

/// Positions a cache makes room for at least, when it first grows.
const FIRST_CAPACITY: usize = 256;

/// Keys and values `[b, kv, len, d]` in buffers of `[b, kv, capacity, d]`.
#[derive(Debug, Default)]
pub struct KvCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every position's keys and values so far, `[b, kv, len, d]` views (`None` before the first).
    pub fn seen(&self) -> Result<Option<(Tensor, Tensor)>> {
        match (&self.k, &self.v) {
            (Some(k), Some(v)) if self.len > 0 => {
                Ok(Some((k.narrow(2, 0, self.len)?, v.narrow(2, 0, self.len)?)))
            }
            _ => Ok(None),
        }
    }

    fn capacity(&self) -> usize {
        self.k.as_ref().map_or(0, |k| k.dim(2).unwrap_or(0))
    }

    /// Appends k and v `[b, kv, t, d]` (views too) and returns every position's keys and values
    /// so far: views of the buffers on the CPU (the attention reads them strided), copies on
    /// CUDA (whose kernels take their own layouts).
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let end = self.len + k.dim(2)?;
        if end > self.capacity() {
            let capacity = end.next_power_of_two().max(FIRST_CAPACITY);
            self.k = Some(grown(self.k.as_ref(), k, self.len, capacity)?);
            self.v = Some(grown(self.v.as_ref(), v, self.len, capacity)?);
        }
        let (Some(kb), Some(vb)) = (&self.k, &self.v) else { unreachable!("made above") };
        kb.slice_set(&k.contiguous()?, 2, self.len)?;
        vb.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len = end;
        let seen = |buffer: &Tensor| -> Result<Tensor> {
            let view = buffer.narrow(2, 0, end)?;
            if view.device().is_cuda() {
                view.contiguous()
            } else {
                Ok(view)
            }
        };
        Ok((seen(kb)?, seen(vb)?))
    }
}

/// A buffer of `capacity` positions shaped like `new`, holding the first `len` positions of `old`.
fn grown(old: Option<&Tensor>, new: &Tensor, len: usize, capacity: usize) -> Result<Tensor> {
    let (b, kv, _, d) = new.dims4()?;
    let buffer = Tensor::zeros((b, kv, capacity, d), new.dtype(), new.device())?;
    if let Some(old) = old.filter(|_| len > 0) {
        buffer.slice_set(&old.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
    }
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Appended a few positions at a time, past the first capacity, the cache holds what one
    /// concatenation of every step holds.
    #[test]
    fn appends_equal_the_concatenation() -> Result<()> {
        let dev = Device::Cpu;
        let mut cache = KvCache::default();
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for (step, t) in [5usize, 1, 300, 1, 7].into_iter().enumerate() {
            // views of [b, t, kv, d] memory, as a layer hands them over
            let k = Tensor::randn(0f32, 1.0, (2, t, 3, 4), &dev)?.transpose(1, 2)?;
            let v = Tensor::randn(0f32, 1.0, (2, t, 3, 4), &dev)?.transpose(1, 2)?;
            ks.push(k.clone());
            vs.push(v.clone());
            let (all_k, all_v) = cache.append(&k, &v)?;
            let want_k = Tensor::cat(&ks, 2)?;
            assert_eq!(all_k.dims(), want_k.dims(), "step {step}");
            let same = |a: &Tensor, b: &Tensor| -> Result<bool> {
                Ok(a.flatten_all()?.to_vec1::<f32>()? == b.contiguous()?.flatten_all()?.to_vec1::<f32>()?)
            };
            assert!(same(&all_k.contiguous()?, &want_k)?, "keys at step {step}");
            assert!(same(&all_v.contiguous()?, &Tensor::cat(&vs, 2)?)?, "values at step {step}");
        }
        assert_eq!(cache.len(), 314);
        Ok(())
    }
}
