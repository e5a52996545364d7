//! Where each decoder layer's input (its checkpoint) waits between the training forward and the
//! backward that recomputes the layer from it.
//!
//! On the CPU, or with offload off, they stay on the device. On CUDA they go to page-locked host
//! memory (`offload.rs`): each is copied out on the copy stream while the next layers compute,
//! and brought back one layer ahead of the backward, so at most the last two and one fetched
//! wait on the GPU instead of all of them (Llama-2-13B at 8 × 2048: 6.25 GiB). A layer whose host
//! buffer cannot be allocated keeps its checkpoint on the device.

use candle_core::{Result, Tensor};

/// Checkpoints still on the device after their copy out started: the last ones pushed, which
/// the backward wants first, and the one the next layer's copy overlaps with.
#[cfg(feature = "cuda")]
const KEEP_ON_DEVICE: usize = 2;

/// The checkpoints of one forward, popped in reverse order by the backward.
pub struct Checkpoints<'a> {
    store: Store<'a>,
}

enum Store<'a> {
    Device(Vec<Tensor>),
    #[cfg(feature = "cuda")]
    Host(host::HostCheckpoints<'a>),
    #[cfg(not(feature = "cuda"))]
    #[allow(dead_code)]
    Never(std::marker::PhantomData<&'a ()>),
}

impl<'a> Checkpoints<'a> {
    pub fn on_device() -> Self {
        Self { store: Store::Device(Vec::new()) }
    }

    /// Checkpoints that wait in `stash`'s host buffers.
    #[cfg(feature = "cuda")]
    pub fn on_host(stash: &'a host::HostStash) -> Self {
        Self { store: Store::Host(host::HostCheckpoints::new(stash)) }
    }

    /// The input of the next layer of the forward.
    pub fn push(&mut self, x: Tensor) -> Result<()> {
        match &mut self.store {
            Store::Device(v) => {
                v.push(x);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Store::Host(h) => h.push(x),
            #[cfg(not(feature = "cuda"))]
            Store::Never(_) => unreachable!(),
        }
    }

    /// The input of the last layer not yet popped, on the device.
    pub fn pop(&mut self) -> Result<Tensor> {
        match &mut self.store {
            Store::Device(v) => v.pop().ok_or_else(|| candle_core::Error::Msg("no checkpoint left".into())),
            #[cfg(feature = "cuda")]
            Store::Host(h) => h.pop(),
            #[cfg(not(feature = "cuda"))]
            Store::Never(_) => unreachable!(),
        }
    }
}

#[cfg(feature = "cuda")]
pub mod host {
    use std::collections::VecDeque;
    use std::sync::{Mutex, MutexGuard};

    use candle_core::cuda_backend::cudarc::driver::PinnedHostSlice;
    use candle_core::{DType, Device, Result, Shape, Tensor};

    use super::super::offload::{CopyStream, InFlight};
    use super::KEEP_ON_DEVICE;

    /// The copy stream and one host buffer per layer, kept from step to step (pinning is slow)
    /// and grown when a step's checkpoints are larger.
    pub struct HostStash {
        copies: CopyStream,
        buffers: Mutex<Vec<Option<PinnedHostSlice<u8>>>>,
    }

    impl HostStash {
        pub fn new(device: &Device) -> Result<Self> {
            Ok(Self { copies: CopyStream::new(device)?, buffers: Mutex::new(Vec::new()) })
        }

        /// Bytes of page-locked host memory held.
        pub fn host_bytes(&self) -> usize {
            let buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
            buffers.iter().flatten().map(|b| b.len()).sum()
        }
    }

    enum Entry {
        /// Copied out (or being copied) to the layer's host buffer.
        Stashed { shape: Shape, dtype: DType },
        /// No host buffer could be had: kept on the device.
        Kept(Tensor),
    }

    pub struct HostCheckpoints<'a> {
        stash: &'a HostStash,
        buffers: MutexGuard<'a, Vec<Option<PinnedHostSlice<u8>>>>,
        entries: Vec<Entry>,
        /// Copies out still running, oldest first, by layer.
        leaving: VecDeque<(usize, InFlight)>,
        /// The next checkpoint the backward wants, on its way in.
        fetched: Option<(usize, InFlight)>,
    }

    impl<'a> HostCheckpoints<'a> {
        pub fn new(stash: &'a HostStash) -> Self {
            let buffers = stash.buffers.lock().unwrap_or_else(|e| e.into_inner());
            Self { stash, buffers, entries: Vec::new(), leaving: VecDeque::new(), fetched: None }
        }

        pub fn push(&mut self, x: Tensor) -> Result<()> {
            let layer = self.entries.len();
            let (shape, dtype) = (x.shape().clone(), x.dtype());
            let stash = self.stash;
            let Some(buffer) = self.buffer(layer, shape.elem_count() * dtype.size_in_bytes()) else {
                self.entries.push(Entry::Kept(x));
                return Ok(());
            };
            let leaving = stash.copies.to_host(x.contiguous()?, buffer)?;
            self.entries.push(Entry::Stashed { shape, dtype });
            self.leaving.push_back((layer, leaving));
            while self.leaving.len() > KEEP_ON_DEVICE {
                let (_, oldest) = self.leaving.pop_front().expect("non-empty");
                drop(oldest.finish()?);
            }
            Ok(())
        }

        pub fn pop(&mut self) -> Result<Tensor> {
            let layer = self
                .entries
                .len()
                .checked_sub(1)
                .ok_or_else(|| candle_core::Error::Msg("no checkpoint left".into()))?;
            let x = match self.entries.pop().expect("non-empty") {
                Entry::Kept(x) => x,
                Entry::Stashed { shape, dtype } => self.take(layer, &shape, dtype)?,
            };
            if let Some(prev) = layer.checked_sub(1) {
                self.prefetch(prev)?;
            }
            Ok(x)
        }

        /// Layer `layer`'s checkpoint on the device: still there, already fetched, or fetched now.
        fn take(&mut self, layer: usize, shape: &Shape, dtype: DType) -> Result<Tensor> {
            if let Some(i) = self.leaving.iter().position(|(l, _)| *l == layer) {
                let (_, x) = self.leaving.remove(i).expect("found");
                return x.finish();
            }
            if let Some((l, x)) = self.fetched.take() {
                if l == layer {
                    return x.finish();
                }
            }
            self.fetch(layer, shape, dtype)?.finish()
        }

        /// Starts bringing `layer`'s checkpoint in, unless it is on the device anyway.
        fn prefetch(&mut self, layer: usize) -> Result<()> {
            let Some(Entry::Stashed { shape, dtype }) = self.entries.get(layer) else { return Ok(()) };
            if self.leaving.iter().any(|(l, _)| *l == layer) {
                return Ok(());
            }
            let (shape, dtype) = (shape.clone(), *dtype);
            self.fetched = Some((layer, self.fetch(layer, &shape, dtype)?));
            Ok(())
        }

        fn fetch(&self, layer: usize, shape: &Shape, dtype: DType) -> Result<InFlight> {
            let buffer = self.buffers[layer].as_ref().expect("a stashed layer has its buffer");
            self.stash.copies.to_device(buffer, 0, shape, dtype)
        }

        /// Layer `layer`'s host buffer with at least `bytes`, allocated or grown on demand;
        /// `None` (once warned) when the driver refuses.
        fn buffer(&mut self, layer: usize, bytes: usize) -> Option<&mut PinnedHostSlice<u8>> {
            if self.buffers.len() <= layer {
                self.buffers.resize_with(layer + 1, || None);
            }
            if self.buffers[layer].as_ref().is_none_or(|b| b.len() < bytes) {
                // the old buffer's last copy must be done before it is freed
                self.stash.copies.synchronize().ok()?;
                self.buffers[layer] = None;
                match self.stash.copies.host_buffer(bytes) {
                    Ok(b) => self.buffers[layer] = Some(b),
                    Err(e) => {
                        warn_once(&e);
                        return None;
                    }
                }
            }
            self.buffers[layer].as_mut()
        }
    }

    fn warn_once(e: &candle_core::Error) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!("checkpoints stay on the GPU: page-locked host memory refused ({e})");
        });
    }
}
