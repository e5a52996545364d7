//! One optimizer step: the micro-batches of the global batch (each rank computes its shard),
//! forward and backward, gradient accumulation, the all-reduce, the loss scaler's overflow check,
//! global-norm clipping folded into the optimizer step.

use std::borrow::Cow;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::loss_scale::{self, LossScaler};
use crate::data::{Batch, BatchLoader, EpochBatches};
use crate::distributed::{all_reduce_grads, shard_rows, Collective, ReduceOp, Solo, BUCKET_BYTES};
use crate::memory::{is_out_of_memory, Phase};
use crate::model::ops::loss::{shift_labels, IGNORE_INDEX};
use crate::model::CausalLm;
use crate::optim::{clip_coefficient, grad_norm, LrSchedule, Optimizer};
use crate::profile::section;

/// The phase of a step that computes this rank's gradients: before its first collective and its
/// update, with dropout seeds drawn from the step's number.
pub const FORWARD_AND_BACKWARD: &str = "forward and backward";

/// Whether a step that failed with `e` may run again as it was: it ran out of GPU memory while
/// computing its gradients, when nothing of it had been applied or shared with other ranks.
pub fn may_run_again(e: &anyhow::Error) -> bool {
    is_out_of_memory(e) && e.downcast_ref::<Phase>().is_some_and(|p| p.0 == FORWARD_AND_BACKWARD)
}

/// Set by SIGINT/SIGTERM (`run_loop::stop_on_signals`); the step agrees on it across ranks.
pub(super) static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

/// Tokens that are a prediction target after the causal shift.
pub fn target_tokens(batch: &Batch) -> usize {
    shift_labels(&batch.labels, batch.batch_size, batch.seq_len)
        .iter()
        .filter(|&&l| l != IGNORE_INDEX)
        .count()
}

/// Batches across epochs, in each epoch's seeded order, remembering the position for checkpoints.
pub struct BatchStream {
    loader: BatchLoader,
    pub epoch: u64,
    /// Rows of this epoch's order handed out so far.
    pub row: usize,
    current: EpochBatches,
}

impl BatchStream {
    pub fn new(loader: BatchLoader, epoch: u64, row: usize) -> Self {
        let current = loader.epoch_from_row(epoch, row);
        Self { loader, epoch, row, current }
    }

    pub fn next_batch(&mut self) -> Batch {
        loop {
            if let Some(b) = self.current.next() {
                self.row += b.batch_size;
                return b;
            }
            self.epoch += 1;
            self.row = 0;
            self.current = self.loader.epoch(self.epoch, 0);
        }
    }

    /// Batches of the loader's size handed out in this epoch (a checkpoint's `batch_in_epoch`).
    pub fn index(&self) -> usize {
        self.row.div_ceil(self.loader.batch_size())
    }

    pub fn epoch_progress(&self) -> f64 {
        self.epoch as f64 + self.row as f64 / self.loader.num_examples().max(1) as f64
    }
}

/// The rows of a global batch this rank computes: all of it for one process (as it is, so a
/// one-GPU run is unchanged), else its shard; `None` when the shard trains nothing.
pub fn rank_batch<'a>(global: &'a Batch, c: &dyn Collective) -> Option<Cow<'a, Batch>> {
    if c.world_size() == 1 {
        return Some(Cow::Borrowed(global));
    }
    let shard = global.shard(shard_rows(global.batch_size, c.rank(), c.world_size()));
    (target_tokens(&shard) > 0).then_some(Cow::Owned(shard))
}

pub fn batch_tensor(batch: &Batch, device: &Device) -> candle_core::Result<Tensor> {
    Tensor::from_vec(batch.input_ids.clone(), (batch.batch_size, batch.seq_len), device)
}

/// One optimizer step's inputs and results.
pub struct StepResult {
    pub loss: f64,
    pub grad_norm: f64,
    /// False when the gradients overflowed and the optimizer step was skipped.
    pub applied: bool,
    pub trained_tokens: usize,
    /// All tokens the ranks computed, padding included.
    pub tokens: usize,
    /// Some rank was asked to stop (SIGINT/SIGTERM): every rank checkpoints and stops after
    /// this step.
    pub stop: bool,
}

/// One rank's part of a step before the all-reduce.
struct LocalStep {
    grads: Vec<Tensor>,
    loss_sum: f64,
    tokens: usize,
}

/// The model with its adapters, optimizer, schedule and loss scaler: one `step` per optimizer step.
pub struct Trainer {
    pub model: CausalLm,
    pub(super) optimizer: Optimizer,
    pub(super) schedule: LrSchedule,
    max_grad_norm: f64,
    seed: u64,
    pub scaler: LossScaler,
    /// The other ranks of a data-parallel run (`Solo` for one process).
    pub collective: Arc<dyn Collective>,
}

impl Trainer {
    /// The optimizer `optim` names over the model's LoRA parameters; f16 models get dynamic
    /// loss scaling.
    pub fn new(
        model: CausalLm,
        optim: &crate::config::OptimSection,
        weight_decay: f64,
        schedule: LrSchedule,
        max_grad_norm: f64,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let params = model.lora_params().into_iter().map(|(_, v)| v).collect();
        let optimizer = Optimizer::new(params, optim, weight_decay)?;
        let scaler = LossScaler::new(model.dtype() == DType::F16, loss_scale::GROWTH_INTERVAL);
        let collective: Arc<dyn Collective> = Arc::new(Solo);
        Ok(Self { model, optimizer, schedule, max_grad_norm, seed, scaler, collective })
    }

    /// One rank of a data-parallel run: gradients summed with `collective`'s other ranks.
    pub fn with_collective(self, collective: Arc<dyn Collective>) -> Self {
        Self { collective, ..self }
    }

    /// One optimizer step over the global `micro_batches` (gradient accumulation; each rank
    /// computes its shard of each); `None` when they hold no trained token. An error in the
    /// phase `FORWARD_AND_BACKWARD` left the trainer as it was: no collective had run and nothing
    /// was applied, so the step can run again (`may_run_again`).
    pub fn step(&mut self, step: usize, micro_batches: &[Batch]) -> anyhow::Result<Option<StepResult>> {
        let trained: usize = micro_batches.iter().map(target_tokens).sum();
        if trained == 0 {
            return Ok(None);
        }
        // Normalize by the trained tokens of the whole step over all ranks, so accumulation is
        // exactly a bigger batch (what HF's Trainer does with num_items_in_batch) and the sum of
        // the ranks' gradients is the one-process gradient.
        let loss_scale = self.scaler.scale();
        crate::profile::timeline::start(self.model.device())?;
        let local = self.local_step(step, micro_batches, loss_scale / trained as f64)?;
        let device = self.model.device().clone();
        let collective = &*self.collective;
        let grads =
            section("all-reduce", &device, || all_reduce_grads(collective, local.grads, BUCKET_BYTES))?;
        // Unscaling and clipping are folded into one gradient factor of the optimizer step:
        // the gradients are read twice per step (norm, update) and never rewritten.
        let inv_scale = 1.0 / loss_scale;
        let grad_norm = section("clip", &device, || grad_norm(&grads, inv_scale))?;
        crate::profile::timeline::mark(&device, || "clip".into())?;
        // Every rank holds the same summed gradients, so the same norm; the overflow decision is
        // still agreed explicitly (any rank's inf/nan skips the step everywhere), in the one
        // round that also sums the loss and tokens and agrees on a stop request.
        let stop = STOP_REQUESTED.load(std::sync::atomic::Ordering::SeqCst);
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        let mut agreed = [local.loss_sum, local.tokens as f64, flag(!grad_norm.is_finite()), flag(stop)];
        self.collective.all_reduce_scalars(&mut agreed, ReduceOp::Sum)?;
        let [loss_sum, tokens, overflowed, stops] = agreed;
        let applied = self.scaler.update(overflowed == 0.0);
        if applied {
            // max_grad_norm = 0 turns clipping off; the norm is still reported.
            let max_norm = if self.max_grad_norm > 0.0 { self.max_grad_norm } else { f64::INFINITY };
            let grad_mult = inv_scale * clip_coefficient(max_norm, grad_norm);
            let lr = self.schedule.lr_at(step);
            section("optimizer", &device, || self.optimizer.step_scaled(&grads, grad_mult, lr))
                .context(Phase("optimizer"))?;
            crate::profile::timeline::mark(&device, || "optimizer".into())?;
        }
        let loss = loss_sum / trained as f64;
        let tokens = tokens as usize;
        Ok(Some(StepResult { loss, grad_norm, applied, trained_tokens: trained, tokens, stop: stops > 0.0 }))
    }

    /// This rank's gradients (summed over the micro-batches, scaled by `grad_scale`), loss sum
    /// and tokens; zeros for a rank whose shards train nothing (a short last batch).
    fn local_step(&self, step: usize, micro_batches: &[Batch], grad_scale: f64) -> anyhow::Result<LocalStep> {
        let rank = self.collective.rank() as u64;
        // the shapes this step plans are the ones a retry or an over-budget peak gives a layer up
        self.model.kept_layers().begin_step();
        let (mut grads, mut loss_sum, mut tokens): (Option<Vec<Tensor>>, f64, usize) = (None, 0.0, 0);
        for (m, global) in micro_batches.iter().enumerate() {
            let Some(batch) = rank_batch(global, &*self.collective) else { continue };
            let ids = batch_tensor(&batch, self.model.device())?;
            // each rank draws its own dropout masks (rank 0's are those of one process)
            let seed = self.seed ^ ((step as u64) << 20) ^ m as u64 ^ (rank << 52);
            let last = m + 1 == micro_batches.len();
            let out = super::injected_oom::injected_oom(step + 1, last)
                .and_then(|()| {
                    self.model.forward_backward_packed(
                        &ids,
                        &batch.labels,
                        &batch.seq_lens,
                        grad_scale,
                        Some(seed),
                    )
                })
                .context(Phase(FORWARD_AND_BACKWARD))?;
            crate::profile::timeline::mark(self.model.device(), || "forward and backward returned".into())?;
            loss_sum += out.loss_sum;
            tokens += batch.batch_size * batch.seq_len;
            grads = Some(match grads {
                None => out.grads,
                // accumulated in f32: the backward hands them over in the compute dtype
                Some(acc) => acc
                    .iter()
                    .zip(&out.grads)
                    .map(|(a, g)| a.to_dtype(DType::F32)? + g.to_dtype(DType::F32)?)
                    .collect::<candle_core::Result<_>>()?,
            });
        }
        let grads = match grads {
            Some(g) => g,
            None => self.zero_grads()?,
        };
        Ok(LocalStep { grads, loss_sum, tokens })
    }

    fn zero_grads(&self) -> candle_core::Result<Vec<Tensor>> {
        let device = self.model.device();
        self.model.lora_params().iter().map(|(_, v)| Tensor::zeros(v.shape(), DType::F32, device)).collect()
    }
}
