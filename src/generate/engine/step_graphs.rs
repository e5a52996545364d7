//! The decode step as CUDA graphs, as vLLM and llama.cpp run it: a step is thousands of small
//! kernels (a few per projection and norm, every layer), each costing the host a launch, which
//! at small batches takes longer than the GPU's work. So the step of each batch size is recorded
//! once, for the sizes a batch is padded up to (`padded_rows`), and replayed with one launch.
//! A recording reads its rows' token ids, slots, positions and lengths from one input buffer,
//! refilled before each replay, and leaves its logits in one output buffer; padding rows repeat
//! the last real row (the same key and value written twice to the same place; their logits
//! unread). One set of recordings per adapter, dropped when the adapter is.

use std::sync::Arc;

use candle_core::Tensor;
#[cfg(feature = "cuda")]
use candle_core::DType;

#[cfg(feature = "cuda")]
use crate::model::DecodeRows;
use crate::model::{CausalLm, DecoderLayer, SlotCache};

/// The rows a step of `rows` sequences is padded to: a power of two up to 8, then multiples of
/// 8 to 64, of 32 to 256, of 64 beyond (few recordings, little padding), `max` at most.
pub fn padded_rows(rows: usize, max: usize) -> usize {
    let step = match rows {
        0..=8 => return rows.next_power_of_two().min(max),
        9..=64 => 8,
        65..=256 => 32,
        _ => 64,
    };
    rows.div_ceil(step).saturating_mul(step).min(max)
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct StepGraphs {
    /// Off on the CPU, where asked, or after a recording failed (the steps then run eagerly).
    on: bool,
    max_rows: usize,
    /// u32 `[4 · max_rows]`: a recording of n rows reads its ids, slots, positions and lengths
    /// after the step from the first 4n, n each.
    inputs: Option<Tensor>,
    /// f32 `[max_rows, vocab]`: a recording of n rows writes its logits to the first n rows.
    logits: Option<Tensor>,
    recorded: Vec<Recorded>,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct Recorded {
    /// The adapter's layers (`None`: the model's own), kept so the graph's weights stay alive.
    layers: Option<Arc<Vec<DecoderLayer>>>,
    rows: usize,
    #[cfg(feature = "cuda")]
    graph: crate::cuda::graph::Graph,
}

/// One decode step's rows, as the scheduler gives them.
pub struct StepRows<'a> {
    pub ids: &'a [u32],
    pub slots: &'a [usize],
    pub positions: &'a [usize],
}

impl StepGraphs {
    /// Recordings of steps of up to `max_rows` rows, on where `model` is on CUDA and `on`.
    pub fn new(model: &CausalLm, max_rows: usize, on: bool) -> Self {
        let on = on && cfg!(feature = "cuda") && model.device().is_cuda();
        Self { on, max_rows, inputs: None, logits: None, recorded: Vec::new() }
    }

    /// The logits `[b, vocab]` (f32) of one step of `rows` through `layers` (of adapter
    /// `adapter`; `None`: the model's), replayed or recorded; `None` where steps run eagerly
    /// (the caller runs the step itself).
    pub fn decode(
        &mut self,
        model: &CausalLm,
        (adapter, layers): (&Option<Arc<Vec<DecoderLayer>>>, &[DecoderLayer]),
        caches: &[SlotCache],
        rows: StepRows,
    ) -> anyhow::Result<Option<Tensor>> {
        if !self.on || rows.ids.is_empty() {
            return Ok(None);
        }
        // an adapter dropped from the engine and no longer decoding: its recordings go
        self.recorded.retain(|r| r.layers.as_ref().is_none_or(|l| Arc::strong_count(l) > 1));
        let b = rows.ids.len();
        let n = padded_rows(b, self.max_rows).max(b);
        let pad = |values: Vec<u32>| {
            let last = values[b - 1];
            values.into_iter().chain(std::iter::repeat_n(last, n - b))
        };
        let inputs: Vec<u32> = pad(rows.ids.to_vec())
            .chain(pad(rows.slots.iter().map(|&s| s as u32).collect()))
            .chain(pad(rows.positions.iter().map(|&p| p as u32).collect()))
            .chain(pad(rows.positions.iter().map(|&p| p as u32 + 1).collect()))
            .collect();
        let same = |r: &Recorded| {
            r.rows == n
                && match (&r.layers, adapter) {
                    (None, None) => true,
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                }
        };
        if let Some(recorded) = self.recorded.iter().find(|r| same(r)) {
            return self.replay(recorded, &inputs, b).map(Some);
        }
        self.record(model, (adapter, layers), caches, &inputs, b).map(Some)
    }

    #[cfg(feature = "cuda")]
    fn replay(&self, recorded: &Recorded, inputs: &[u32], b: usize) -> anyhow::Result<Tensor> {
        let (Some(buffer), Some(logits)) = (&self.inputs, &self.logits) else {
            anyhow::bail!("a recorded step without its buffers");
        };
        let fresh = Tensor::from_slice(inputs, inputs.len(), buffer.device())?;
        buffer.slice_set(&fresh, 0, 0)?;
        recorded.graph.launch()?;
        Ok(logits.narrow(0, 0, b)?)
    }

    #[cfg(not(feature = "cuda"))]
    fn replay(&self, _: &Recorded, _: &[u32], _: usize) -> anyhow::Result<Tensor> {
        anyhow::bail!("steps are recorded on CUDA only")
    }

    /// Runs the step eagerly at its padded size (its logits are this step's; the run also loads
    /// every kernel and sizes every workspace the recording will use), then records it. A
    /// recording that fails turns recordings off, with a warning; the eager logits stand.
    #[cfg(feature = "cuda")]
    fn record(
        &mut self,
        model: &CausalLm,
        (adapter, layers): (&Option<Arc<Vec<DecoderLayer>>>, &[DecoderLayer]),
        caches: &[SlotCache],
        inputs: &[u32],
        b: usize,
    ) -> anyhow::Result<Tensor> {
        let n = inputs.len() / 4;
        let device = model.device();
        let section = |i: usize| &inputs[i * n..(i + 1) * n];
        let ids = Tensor::from_slice(section(0), (n, 1), device)?;
        let as_usize = |i: usize| section(i).iter().map(|&v| v as usize).collect::<Vec<_>>();
        let eager_rows = DecodeRows::new(as_usize(1), as_usize(2), &caches[0])?;
        let eager = model.forward_slots_of(layers, &ids, caches, &eager_rows)?.narrow(0, 0, b)?;
        if self.inputs.is_none() {
            self.inputs = Some(Tensor::zeros(4 * self.max_rows, DType::U32, device)?);
            self.logits = Some(Tensor::zeros((self.max_rows, model.config().vocab_size), DType::F32, device)?);
        }
        let (Some(buffer), Some(logits)) = (&self.inputs, &self.logits) else { unreachable!("made above") };
        buffer.slice_set(&Tensor::from_slice(inputs, inputs.len(), device)?, 0, 0)?;
        let recording = crate::cuda::graph::Graph::capture(device, || {
            let part = |i: usize| buffer.narrow(0, i * n, n);
            let rows = DecodeRows::on_device(part(1)?, part(2)?, part(3)?)?;
            let out = model.forward_slots_of(layers, &part(0)?.unsqueeze(1)?, caches, &rows)?;
            logits.slice_set(&out, 0, 0)
        });
        match recording {
            Ok((graph, ())) => {
                tracing::debug!("recorded the decode step of {n} rows as a CUDA graph");
                self.recorded.push(Recorded { layers: adapter.clone(), rows: n, graph });
            }
            Err(e) => {
                tracing::warn!("decode steps run without CUDA graphs: recording one failed: {e}");
                self.on = false;
                self.recorded.clear();
            }
        }
        Ok(eager)
    }

    #[cfg(not(feature = "cuda"))]
    fn record(
        &mut self,
        _: &CausalLm,
        _: (&Option<Arc<Vec<DecoderLayer>>>, &[DecoderLayer]),
        _: &[SlotCache],
        _: &[u32],
        _: usize,
    ) -> anyhow::Result<Tensor> {
        anyhow::bail!("steps are recorded on CUDA only")
    }
}
