//! Where the activations of the layers the planner offloads (`LayerKind::Offloaded`) wait
//! between the forward and the backward: in page-locked host memory on CUDA, else on the device
//! (then they are simply kept).
//!
//! After an offloaded layer's forward, every buffer its saved activations view is copied out on
//! a copy stream while the next layers compute (`offload.rs`: events order the copies, nothing
//! blocks the host). Its device memory goes back when the next offloaded layer is pushed — the
//! planner spaces them so that the copy is done by then (`plan/keep.rs`) — so one such layer is
//! on its way out at a time. The backward brings a layer's buffers back one offloaded layer
//! ahead and rebuilds each tensor as the same view of them (`views.rs`): its backward reads
//! exactly what a kept layer's reads, and the gradients are the same bits.

use std::collections::HashMap;

use candle_core::{Result, Tensor};

/// What a layer keeps for its backward, as offloading sees it (layer/saved.rs for a decoder
/// layer): its activation tensors, listed in the same order every time.
pub trait SavedActivations {
    fn activations_mut(&mut self) -> Vec<&mut Tensor>;
}

/// The offloaded layers of one step.
pub struct OffloadedLayers<'a, S> {
    store: Store<'a, S>,
}

enum Store<'a, S> {
    Device(HashMap<usize, S>),
    #[cfg(feature = "cuda")]
    Host(host::HostLayers<'a, S>),
    #[cfg(not(feature = "cuda"))]
    #[allow(dead_code)]
    Never(std::marker::PhantomData<&'a ()>),
}

impl<'a, S: SavedActivations> OffloadedLayers<'a, S> {
    /// Kept on the device (no host memory: the CPU, or offload off).
    pub fn on_device() -> Self {
        Self { store: Store::Device(HashMap::new()) }
    }

    /// In `stash`'s host buffers, for this step's offloaded `layers` (the other layers' buffers,
    /// from steps of other shapes, are freed: the host memory stays that of one plan).
    #[cfg(feature = "cuda")]
    pub fn on_host(stash: &'a host::LayerStash, layers: &[usize]) -> Result<Self> {
        Ok(Self { store: Store::Host(host::HostLayers::new(stash, layers)?) })
    }

    /// Layer `layer`'s activations after its forward.
    pub fn push(&mut self, layer: usize, saved: S) -> Result<()> {
        match &mut self.store {
            Store::Device(map) => {
                map.insert(layer, saved);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Store::Host(h) => h.push(layer, saved),
            #[cfg(not(feature = "cuda"))]
            Store::Never(_) => unreachable!(),
        }
    }

    /// The forward is done: the last layer's copies out finish, and `first`, the offloaded layer
    /// the backward reaches first, starts on its way in behind the layers above it.
    pub fn start_backward(&mut self, first: Option<usize>) -> Result<()> {
        match &mut self.store {
            Store::Device(_) => {
                let _ = first; // on the device already
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Store::Host(h) => h.start_backward(first),
            #[cfg(not(feature = "cuda"))]
            Store::Never(_) => unreachable!(),
        }
    }

    /// Layer `layer`'s activations on the device for its backward; `next`, the offloaded layer
    /// the backward reaches after it, starts on its way in.
    pub fn pop(&mut self, layer: usize, next: Option<usize>) -> Result<S> {
        match &mut self.store {
            // `next` is on the device already
            Store::Device(map) => map.remove(&layer).ok_or_else(|| {
                let _ = next;
                candle_core::Error::Msg(format!("layer {layer} was not offloaded"))
            }),
            #[cfg(feature = "cuda")]
            Store::Host(h) => h.pop(layer, next),
            #[cfg(not(feature = "cuda"))]
            Store::Never(_) => unreachable!(),
        }
    }
}

#[cfg(feature = "cuda")]
pub mod host {
    use std::collections::HashMap;
    use std::sync::{Mutex, MutexGuard};

    use candle_core::cuda_backend::cudarc::driver::PinnedHostSlice;
    use candle_core::{DType, Device, Result, Shape, Tensor};

    use super::super::offload::{CopyStream, InFlight};
    use super::super::views::View;
    use super::SavedActivations;

    /// The copy stream and each offloaded layer's host buffers (one per device buffer), kept
    /// from step to step (pinning is slow) and grown when a step's activations are larger.
    pub struct LayerStash {
        copies: CopyStream,
        buffers: Mutex<HashMap<usize, Vec<PinnedHostSlice<u8>>>>,
    }

    impl LayerStash {
        pub fn new(device: &Device) -> Result<Self> {
            Ok(Self { copies: CopyStream::new(device)?, buffers: Mutex::new(HashMap::new()) })
        }
    }

    /// A layer while its activations are out: the saved struct holding placeholders, each
    /// activation's buffer and view, and each buffer's length and dtype.
    struct Out<S> {
        saved: S,
        views: Vec<Option<(usize, View)>>,
        buffers: Vec<(usize, DType)>,
    }

    pub struct HostLayers<'a, S> {
        stash: &'a LayerStash,
        host: MutexGuard<'a, HashMap<usize, Vec<PinnedHostSlice<u8>>>>,
        out: HashMap<usize, Out<S>>,
        /// Layers whose host buffers could not be had: kept on the device (warned once).
        kept: HashMap<usize, S>,
        /// The copies out of the last layer pushed.
        leaving: Vec<InFlight>,
        /// The next layer the backward wants, on its way in.
        fetched: Option<(usize, Vec<InFlight>)>,
    }

    impl<'a, S: SavedActivations> HostLayers<'a, S> {
        pub fn new(stash: &'a LayerStash, layers: &[usize]) -> Result<Self> {
            let mut host = stash.buffers.lock().unwrap_or_else(|e| e.into_inner());
            if host.keys().any(|l| !layers.contains(l)) {
                // no copy may still read or write a buffer that is freed
                stash.copies.synchronize()?;
                host.retain(|l, _| layers.contains(l));
            }
            Ok(Self {
                stash,
                host,
                out: HashMap::new(),
                kept: HashMap::new(),
                leaving: Vec::new(),
                fetched: None,
            })
        }

        /// The last layer's copies out done (the compute stream waits for them, the host does
        /// not), and its device memory back in the pool.
        fn finish_leaving(&mut self) -> Result<()> {
            for copy in self.leaving.drain(..) {
                drop(copy.finish()?);
            }
            Ok(())
        }

        pub fn push(&mut self, layer: usize, mut saved: S) -> Result<()> {
            self.finish_leaving()?;
            let stream = self.stash.copies.compute_stream();
            let (mut bases, mut buffers, mut sources) = (Vec::new(), Vec::new(), Vec::<Tensor>::new());
            let mut views = Vec::new();
            for t in saved.activations_mut() {
                if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
                    views.push(None); // stays on the device
                    continue;
                }
                let (mut base, mut elems) = crate::cuda::buffer_span(t, &stream)?;
                let mut view = View::of(t);
                if !view.rebuildable(elems) {
                    // a view the ops cannot rebuild: its values in a buffer of their own
                    *t = t.copy()?;
                    (base, elems) = crate::cuda::buffer_span(t, &stream)?;
                    view = View::of(t);
                }
                let buffer = match bases.iter().position(|&b| b == base) {
                    Some(i) => i,
                    None => {
                        bases.push(base);
                        buffers.push((elems, t.dtype()));
                        sources.push(t.clone());
                        bases.len() - 1
                    }
                };
                views.push(Some((buffer, view)));
            }
            if !self.reserve(layer, &buffers)? {
                self.kept.insert(layer, saved);
                return Ok(());
            }
            // the saved struct lets go of its activations; `sources` holds each buffer until its
            // copy is done
            let placeholder = Tensor::zeros(1, DType::F32, &self.stash.copies.device())?;
            for (t, view) in saved.activations_mut().into_iter().zip(&views) {
                if view.is_some() {
                    *t = placeholder.clone();
                }
            }
            let host = self.host.get_mut(&layer).expect("reserved");
            for (i, source) in sources.into_iter().enumerate() {
                self.leaving.push(self.stash.copies.buffer_to_host(source, &mut host[i])?);
            }
            self.out.insert(layer, Out { saved, views, buffers });
            Ok(())
        }

        /// Layer `layer`'s host buffers, at least `buffers` large, allocated or grown; `false`
        /// (warned once) where the driver refuses page-locked memory: the layer then stays on
        /// the device.
        fn reserve(&mut self, layer: usize, buffers: &[(usize, DType)]) -> Result<bool> {
            let host = self.host.entry(layer).or_default();
            for (i, (elems, dtype)) in buffers.iter().enumerate() {
                let bytes = elems * dtype.size_in_bytes();
                if host.get(i).is_none_or(|b| b.len() < bytes) {
                    // the old buffer's last copy must be done before it is freed
                    self.stash.copies.synchronize()?;
                    let fresh = match self.stash.copies.host_buffer(bytes) {
                        Ok(b) => b,
                        Err(e) => {
                            static WARNED: std::sync::Once = std::sync::Once::new();
                            WARNED.call_once(|| {
                                tracing::warn!(
                                    "an offloaded layer stays on the GPU: page-locked host memory refused ({e})"
                                )
                            });
                            return Ok(false);
                        }
                    };
                    match host.get_mut(i) {
                        Some(b) => *b = fresh,
                        None => host.push(fresh),
                    }
                }
            }
            Ok(true)
        }

        pub fn start_backward(&mut self, first: Option<usize>) -> Result<()> {
            self.finish_leaving()?;
            if let Some(first) = first.filter(|f| self.out.contains_key(f)) {
                self.fetched = Some((first, self.fetch(first)?));
            }
            Ok(())
        }

        pub fn pop(&mut self, layer: usize, next: Option<usize>) -> Result<S> {
            self.finish_leaving()?;
            if let Some(saved) = self.kept.remove(&layer) {
                if let Some(next) = next.filter(|n| self.out.contains_key(n)) {
                    self.fetched = Some((next, self.fetch(next)?));
                }
                return Ok(saved);
            }
            let incoming = match self.fetched.take() {
                Some((l, copies)) if l == layer => copies,
                _ => self.fetch(layer)?,
            };
            let Out { mut saved, views, .. } = self
                .out
                .remove(&layer)
                .ok_or_else(|| candle_core::Error::Msg(format!("layer {layer} was not offloaded")))?;
            let buffers = incoming.into_iter().map(InFlight::finish).collect::<Result<Vec<_>>>()?;
            if let Some(next) = next.filter(|n| self.out.contains_key(n)) {
                self.fetched = Some((next, self.fetch(next)?));
            }
            for (t, view) in saved.activations_mut().into_iter().zip(&views) {
                if let Some((buffer, view)) = view {
                    *t = view.over(&buffers[*buffer])?;
                }
            }
            Ok(saved)
        }

        fn fetch(&self, layer: usize) -> Result<Vec<InFlight>> {
            let (Some(out), Some(host)) = (self.out.get(&layer), self.host.get(&layer)) else {
                candle_core::bail!("layer {layer} was not offloaded");
            };
            (out.buffers.iter().zip(host))
                .map(|(&(elems, dtype), buffer)| {
                    self.stash.copies.to_device(buffer, 0, &Shape::from(elems), dtype)
                })
                .collect()
        }
    }
}
