//! The output projection, on the device or streamed from the host.
//!
//! A training step uses lm_head once, for the loss, and it is the largest dense tensor of the
//! frozen model (313 MiB for Llama-2-13B in f16). On CUDA the trainer moves an untied lm_head to
//! mapped page-locked host memory; the loss then streams it in, `VOCAB_CHUNK` rows at a time,
//! each chunk copied on the copy stream while the previous one computes, with an online
//! log-sum-exp over the chunks (src/cuda/cross_entropy.cu) and the gradient accumulated in f32.
//! The target rows of the gradient's one-hot term are gathered straight from mapped memory.

use candle_core::{Result, Tensor};

use super::loss::{cross_entropy, LossOutput};

/// lm_head rows per streamed chunk: 40 MiB at hidden 5120 in f16, two on the device at once.
pub const VOCAB_CHUNK: usize = 4096;

/// Where lm_head `[vocab, hidden]` lives.
pub enum LmHead {
    Device(Tensor),
    #[cfg(feature = "cuda")]
    Host(host::HostLmHead),
}

impl LmHead {
    /// Logits `[n, vocab]` of hidden states `[n, hidden]`, in the compute dtype, soft-capped
    /// where the family does.
    pub fn logits(&self, h: &Tensor, softcap: Option<f64>) -> Result<Tensor> {
        let logits = match self {
            // f32 on the CPU: lm_head read where it lies (one token's logits as dot products)
            Self::Device(w) if super::cpu::takes(&[h, w]) => {
                super::cpu::gemm::matmul(h, false, w, true, 1.0)?
            }
            Self::Device(w) => h.matmul(&w.t()?)?,
            #[cfg(feature = "cuda")]
            Self::Host(w) => match w.resident() {
                Some(w) => h.matmul(&w.t()?)?,
                None => w.logits(h)?,
            },
        };
        match softcap {
            None => Ok(logits),
            Some(cap) => Ok(super::softcap::softcap(&logits, cap)?.0),
        }
    }

    /// The summed cross-entropy of `hidden` against `targets` (see loss.rs `cross_entropy`).
    /// The streamed head does not soft-cap: a model with capped logits keeps its head on the
    /// device (Gemma 2's is the embedding table anyway).
    pub fn cross_entropy(
        &self,
        hidden: &Tensor,
        targets: &[i64],
        grad_scale: Option<f64>,
        chunk_rows: usize,
        softcap: Option<f64>,
    ) -> Result<LossOutput> {
        match self {
            Self::Device(w) => cross_entropy(hidden, w, targets, grad_scale, chunk_rows, softcap),
            #[cfg(feature = "cuda")]
            Self::Host(w) => match w.resident() {
                Some(w) => cross_entropy(hidden, &w, targets, grad_scale, chunk_rows, softcap),
                None if softcap.is_some() => {
                    candle_core::bail!("a streamed lm_head does not soft-cap the logits")
                }
                None => w.cross_entropy(hidden, targets, grad_scale),
            },
        }
    }

    /// A streamed lm_head kept on the device as well (`true`, a copy of the host table) or
    /// streamed again (`false`, the copy freed): the step's plan (`LayerPlan::
    /// lm_head_resident`). An lm_head on the device stays there.
    pub fn set_resident(&self, on: bool) -> Result<()> {
        match self {
            Self::Device(_) => {
                let _ = on; // nothing to move
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Self::Host(w) => w.set_resident(on),
        }
    }

    /// Starts copying the first `chunks` vocab chunks of a streamed lm_head to the device, for
    /// the next loss to read before it streams the rest (`LayerPlan::lm_head_prefetch`). No-op
    /// for a head on the device or a resident copy.
    pub fn prefetch(&self, chunks: usize) -> Result<()> {
        match self {
            Self::Device(_) => {
                let _ = chunks;
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Self::Host(w) => w.prefetch(chunks),
        }
    }

    /// Drops chunks prefetched for a loss that did not run (a step that failed before it).
    pub fn drop_prefetched(&self) {
        #[cfg(feature = "cuda")]
        if let Self::Host(w) = self {
            w.drop_prefetched();
        }
    }

    /// Whether the loss streams the head from host memory (no device copy).
    pub fn streams(&self) -> bool {
        match self {
            Self::Device(_) => false,
            #[cfg(feature = "cuda")]
            Self::Host(w) => w.resident().is_none(),
        }
    }

    /// The tensor, when it is on the device.
    pub fn on_device(&self) -> Option<&Tensor> {
        match self {
            Self::Device(w) => Some(w),
            #[cfg(feature = "cuda")]
            Self::Host(_) => None,
        }
    }
}

#[cfg(feature = "cuda")]
pub mod host {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use candle_core::{DType, Device, Result, Shape, Tensor};

    use super::VOCAB_CHUNK;
    use crate::cuda::cross_entropy::OnlineSoftmax;
    use crate::cuda::mapped::MappedTable;
    use crate::model::activations::offload::{CopyStream, InFlight};
    use crate::model::ops::loss::{LossOutput, IGNORE_INDEX};

    pub struct HostLmHead {
        table: Arc<MappedTable>,
        copies: CopyStream,
        hidden: usize,
        chunk_rows: usize,
        /// A device copy of the whole table, for the shapes whose plan has room for it.
        resident: Mutex<Option<Tensor>>,
        /// The first chunks, copied ahead of the loss (`prefetch`), in order.
        prefetched: Mutex<VecDeque<InFlight>>,
    }

    impl HostLmHead {
        /// A host copy of the device tensor `w` (`None` where the driver will not map it).
        pub fn new(w: &Tensor) -> Result<Option<Self>> {
            Self::with_chunk(w, VOCAB_CHUNK)
        }

        pub fn with_chunk(w: &Tensor, chunk_rows: usize) -> Result<Option<Self>> {
            let hidden = w.dim(1)?;
            let Some(table) = MappedTable::for_table(&w.to_device(&Device::Cpu)?, w.device()) else {
                return Ok(None);
            };
            Ok(Some(Self {
                table,
                copies: CopyStream::new(w.device())?,
                hidden,
                chunk_rows: chunk_rows.max(1),
                resident: Mutex::new(None),
                prefetched: Mutex::new(VecDeque::new()),
            }))
        }

        /// The device copy, when there is one.
        pub fn resident(&self) -> Option<Tensor> {
            lock(&self.resident).clone()
        }

        /// Copies the table to the device (once) or frees that copy.
        pub fn set_resident(&self, on: bool) -> Result<()> {
            let mut resident = lock(&self.resident);
            match (on, resident.is_some()) {
                (true, false) => {
                    let shape = Shape::from((self.table.rows(), self.hidden));
                    let copy = self.copies.to_device(self.table.pinned(), 0, &shape, self.table.dtype())?;
                    *resident = Some(copy.finish()?);
                }
                (false, true) => *resident = None,
                _ => {}
            }
            Ok(())
        }

        /// Starts copying chunks up to the first `chunks` (of those not prefetched yet) on the
        /// copy stream, each once the compute stream's queued work is done with the memory it
        /// takes; they wait on the device for the next loss.
        pub fn prefetch(&self, chunks: usize) -> Result<()> {
            if self.resident().is_some() {
                return Ok(()); // the loss reads the device copy
            }
            let mut prefetched = lock(&self.prefetched);
            let vocab = self.table.rows();
            while prefetched.len() < chunks && prefetched.len() * self.chunk_rows < vocab {
                let start = prefetched.len() * self.chunk_rows;
                prefetched.push_back(self.fetch(start)?);
            }
            Ok(())
        }

        /// Frees the prefetched chunks (once the compute stream has waited for their copies).
        pub fn drop_prefetched(&self) {
            lock(&self.prefetched).clear();
        }

        /// Each chunk's first row and its rows on the device: the prefetched ones first, while
        /// the copy stream brings the others in, one chunk ahead of the chunk computing
        /// (`prefetched + 2` chunks on the device at most).
        fn for_each_chunk(&self, mut f: impl FnMut(usize, &Tensor) -> Result<()>) -> Result<()> {
            let vocab = self.table.rows();
            let mut ahead = std::mem::take(&mut *lock(&self.prefetched));
            let mut next = ahead.len() * self.chunk_rows;
            let mut fetch_next = |ahead: &mut VecDeque<InFlight>| -> Result<()> {
                if next < vocab {
                    ahead.push_back(self.fetch(next)?);
                    next += self.chunk_rows;
                }
                Ok(())
            };
            fetch_next(&mut ahead)?;
            for start in (0..vocab).step_by(self.chunk_rows) {
                let w = ahead.pop_front().expect("fetched in order").finish()?;
                fetch_next(&mut ahead)?;
                f(start, &w)?;
            }
            Ok(())
        }

        fn fetch(&self, start: usize) -> Result<InFlight> {
            let rows = self.chunk_rows.min(self.table.rows() - start);
            let dtype = self.table.dtype();
            let row_bytes = self.hidden * dtype.size_in_bytes();
            let shape = Shape::from((rows, self.hidden));
            self.copies.to_device(self.table.pinned(), start * row_bytes, &shape, dtype)
        }

        pub fn logits(&self, h: &Tensor) -> Result<Tensor> {
            let mut parts = Vec::new();
            self.for_each_chunk(|_, w| {
                parts.push(h.matmul(&w.t()?)?);
                Ok(())
            })?;
            Tensor::cat(&parts, 1)
        }

        pub fn cross_entropy(
            &self,
            hidden: &Tensor,
            targets: &[i64],
            grad_scale: Option<f64>,
        ) -> Result<LossOutput> {
            let device = hidden.device();
            let rows: Vec<u32> =
                (0..targets.len() as u32).filter(|&i| targets[i as usize] != IGNORE_INDEX).collect();
            let n = rows.len();
            if n == 0 {
                let d_hidden = grad_scale.map(|_| hidden.zeros_like()).transpose()?;
                return Ok(LossOutput { loss_sum: 0.0, n_tokens: 0, d_hidden });
            }
            let idx = Tensor::new(rows.as_slice(), device)?;
            let tgt: Vec<u32> = rows.iter().map(|&i| targets[i as usize] as u32).collect();
            let tgt = Tensor::from_vec(tgt, n, device)?;
            let hs = hidden.index_select(&idx, 0)?.contiguous()?;
            let stats = OnlineSoftmax::new(n, self.hidden, grad_scale.is_some(), device)?;
            self.for_each_chunk(|start, w| stats.add_chunk(&hs, w, &tgt, start))?;
            let loss_sum = stats.loss()?.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
            let d_hidden = match grad_scale {
                None => None,
                Some(scale) => {
                    let d_rows = stats.d_rows(&self.table.gather(&tgt)?, scale)?;
                    Some(crate::model::ops::rows::rows_among(hidden, &rows, &d_rows)?)
                }
            };
            Ok(LossOutput { loss_sum, n_tokens: n, d_hidden })
        }
    }

    /// A lock whose holder panicked leaves a value that is still whole (a tensor or copies).
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::model::ops::loss::cross_entropy;

        /// Streamed in chunks that do not divide the vocabulary, against the device loss: the
        /// same loss and hidden gradient, ignored rows included; and the same logits. Without
        /// cudarc's event tracking, as training runs (`cuda::order_by_stream`).
        #[test]
        fn streamed_loss_matches_the_device_loss() {
            let gpu = Device::new_cuda(0).unwrap();
            crate::cuda::order_by_stream(&gpu);
            let max_abs = |t: &Tensor| t.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let targets = [3, -100, 0, 299, -100, 2, 7, 150, 9, 10, -100];
            for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-3), (DType::BF16, 2e-2)] {
                let hidden = Tensor::randn(0f32, 1.0, (11, 32), &gpu).unwrap().to_dtype(dtype).unwrap();
                let head = Tensor::randn(0f32, 1.0, (300, 32), &gpu).unwrap().to_dtype(dtype).unwrap();
                let want = cross_entropy(&hidden, &head, &targets, Some(0.25), 4, None).unwrap();
                let streamed = HostLmHead::with_chunk(&head, 64).unwrap().expect("maps");
                let got = streamed.cross_entropy(&hidden, &targets, Some(0.25)).unwrap();
                assert_eq!(got.n_tokens, want.n_tokens);
                let rel = (got.loss_sum - want.loss_sum).abs() / want.loss_sum.abs();
                assert!(rel < 1e-4, "{dtype:?} loss {} vs {}", got.loss_sum, want.loss_sum);
                let f32_of = |t: Tensor| t.to_dtype(DType::F32).unwrap();
                let (wd, gd) = (f32_of(want.d_hidden.unwrap()), f32_of(got.d_hidden.unwrap()));
                let err = max_abs(&(&gd - &wd).unwrap()) / max_abs(&wd);
                assert!(err < tol, "{dtype:?} gradient {err}");
                // chunks prefetched (some, every one and more than there are, or dropped again)
                // read the same rows in the same order: the same bits
                for (chunks, drop) in [(2, false), (5, false), (100, false), (3, true)] {
                    streamed.prefetch(chunks).unwrap();
                    assert_eq!(lock(&streamed.prefetched).len(), chunks.min(5), "{dtype:?}");
                    if drop {
                        streamed.drop_prefetched();
                    }
                    let again = streamed.cross_entropy(&hidden, &targets, Some(0.25)).unwrap();
                    assert!(lock(&streamed.prefetched).is_empty(), "{dtype:?} {chunks}: consumed");
                    assert_eq!(again.loss_sum, got.loss_sum, "{dtype:?} {chunks}");
                    let d = f32_of(again.d_hidden.unwrap());
                    assert_eq!(max_abs(&(d - &gd).unwrap()), 0.0, "{dtype:?} {chunks}");
                }
                let eval = streamed.cross_entropy(&hidden, &targets, None).unwrap();
                assert!(
                    (eval.loss_sum - got.loss_sum).abs() < 1e-4 * got.loss_sum.abs()
                        && eval.d_hidden.is_none()
                );
                let logits = f32_of(streamed.logits(&hidden).unwrap());
                let want_logits = f32_of(hidden.matmul(&head.t().unwrap()).unwrap());
                let err = max_abs(&(logits - &want_logits).unwrap()) / max_abs(&want_logits);
                assert!(err < tol, "{dtype:?} logits {err}");
                // kept on the device for a shape: the device loss itself, to the bit; freed again
                let head = super::super::LmHead::Host(streamed);
                head.set_resident(true).unwrap();
                // the resident copy is what the loss reads: nothing to prefetch
                head.prefetch(2).unwrap();
                if let super::super::LmHead::Host(w) = &head {
                    assert!(lock(&w.prefetched).is_empty(), "{dtype:?}: prefetched beside a resident copy");
                }
                let resident = head.cross_entropy(&hidden, &targets, Some(0.25), 4, None).unwrap();
                assert_eq!(resident.loss_sum, want.loss_sum, "{dtype:?}");
                assert_eq!(max_abs(&(f32_of(resident.d_hidden.unwrap()) - &wd).unwrap()), 0.0, "{dtype:?}");
                head.set_resident(false).unwrap();
                let super::super::LmHead::Host(streamed) = head else { unreachable!() };
                assert!(streamed.resident().is_none());
            }
        }
    }
}
