//! The training loop: micro-batches → forward/backward (checkpointed) → gradient accumulation →
//! global-norm clipping → Adafactor with a warmup schedule; evaluation, metrics, checkpoints and
//! the final PEFT adapter export.

pub mod auto_batch;
pub mod checkpoint;
pub mod loss_scale;
pub mod metrics;
pub mod plot;
pub mod trace;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use crate::config::{BatchSize, ComputeDtype, Config, TrainSection};
use crate::data::{Batch, BatchLoader, ChatTokenizer, EpochBatches, TokenizedDataset};
use crate::distributed::{all_reduce_grads, shard_rows, Collective, ReduceOp, Solo, WorldInfo, BUCKET_BYTES};
use crate::durable::{self, Saving};
use crate::export::save_adapter;
use crate::model::loss::{shift_labels, IGNORE_INDEX};
use crate::model::{CausalLm, LoraSpec};
use crate::optim::{clip_coefficient, grad_norm, Adafactor, LrSchedule};
use crate::profile::section;
use checkpoint::TrainerState;
use loss_scale::LossScaler;
use metrics::{EvalRecord, MetricsLog, StepRecord};
use trace::Trace;

pub fn lora_spec(cfg: &Config) -> LoraSpec {
    LoraSpec {
        r: cfg.lora.r,
        alpha: cfg.lora.alpha,
        dropout: cfg.lora.dropout,
        target_modules: cfg.lora.target_modules.clone(),
        rslora: cfg.lora.rslora,
    }
}

pub fn compute_dtype(d: ComputeDtype) -> DType {
    match d {
        ComputeDtype::F32 => DType::F32,
        ComputeDtype::F16 => DType::F16,
        ComputeDtype::Bf16 => DType::BF16,
    }
}

/// CUDA device 0 when built with `--features cuda` and a GPU is present, else the CPU.
pub fn select_device() -> anyhow::Result<Device> {
    parse_device("auto")
}

/// `auto` (as `select_device`), `cpu`, `cuda` or `cuda:N`. A GPU's memory pool keeps freed
/// memory for reuse (`memory::retain_freed_memory`).
pub fn parse_device(spec: &str) -> anyhow::Result<Device> {
    let device = open_device(spec)?;
    crate::memory::retain_freed_memory(&device);
    Ok(device)
}

fn open_device(spec: &str) -> anyhow::Result<Device> {
    match spec {
        "auto" => Ok(Device::cuda_if_available(0)?),
        "cpu" => Ok(Device::Cpu),
        "cuda" => {
            Ok(Device::new_cuda(0).context("opening cuda:0 (was lora-ft built with --features cuda?)")?)
        }
        _ => {
            let ordinal: usize = spec
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("device {spec:?}: expected auto, cpu, cuda or cuda:N"))?;
            let device = Device::new_cuda(ordinal)
                .with_context(|| format!("opening {spec} (was lora-ft built with --features cuda?)"))?;
            Ok(device)
        }
    }
}

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

/// Mean loss over an evaluation set (all of it, or the first `max_batches`), each rank computing
/// its shard of every batch.
pub fn evaluate(
    model: &CausalLm,
    loader: &BatchLoader,
    max_batches: usize,
    c: &dyn Collective,
) -> anyhow::Result<(f64, usize)> {
    let (mut sum, mut tokens) = (0f64, 0usize);
    let limit = if max_batches == 0 { usize::MAX } else { max_batches };
    for global in loader.epoch(0, 0).take(limit) {
        if let Some(batch) = rank_batch(&global, c) {
            let (s, n) = model.loss(&batch_tensor(&batch, model.device())?, &batch.labels)?;
            sum += s;
            tokens += n;
        }
    }
    let mut totals = [sum, tokens as f64];
    c.all_reduce_scalars(&mut totals, ReduceOp::Sum)?;
    let [sum, tokens] = totals;
    Ok((sum / tokens.max(1.0), tokens as usize))
}

pub struct TrainSummary {
    pub steps: usize,
    pub first_loss: f64,
    pub last_loss: f64,
    /// Before the first step.
    pub first_eval: Option<EvalRecord>,
    pub last_eval: Option<EvalRecord>,
    pub adapter_dir: PathBuf,
    pub tokens_per_s: f64,
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
    optimizer: Adafactor,
    schedule: LrSchedule,
    max_grad_norm: f64,
    seed: u64,
    pub scaler: LossScaler,
    /// The other ranks of a data-parallel run (`Solo` for one process).
    pub collective: Arc<dyn Collective>,
}

impl Trainer {
    /// Adafactor over the model's LoRA parameters; f16 models get dynamic loss scaling.
    pub fn new(
        model: CausalLm,
        optim: &crate::config::AdafactorSection,
        weight_decay: f64,
        schedule: LrSchedule,
        max_grad_norm: f64,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let params = model.lora_params().into_iter().map(|(_, v)| v).collect();
        let optimizer = Adafactor::new(params, optim, weight_decay)?;
        let scaler = LossScaler::new(model.dtype() == DType::F16, loss_scale::GROWTH_INTERVAL);
        let collective: Arc<dyn Collective> = Arc::new(Solo);
        Ok(Self { model, optimizer, schedule, max_grad_norm, seed, scaler, collective })
    }

    /// One rank of a data-parallel run: gradients summed with `collective`'s other ranks.
    pub fn with_collective(self, collective: Arc<dyn Collective>) -> Self {
        Self { collective, ..self }
    }

    /// One optimizer step over the global `micro_batches` (gradient accumulation; each rank
    /// computes its shard of each); `None` when they hold no trained token.
    pub fn step(&mut self, step: usize, micro_batches: &[Batch]) -> anyhow::Result<Option<StepResult>> {
        let trained: usize = micro_batches.iter().map(target_tokens).sum();
        if trained == 0 {
            return Ok(None);
        }
        // Normalize by the trained tokens of the whole step over all ranks, so accumulation is
        // exactly a bigger batch (what HF's Trainer does with num_items_in_batch) and the sum of
        // the ranks' gradients is the one-process gradient.
        let loss_scale = self.scaler.scale();
        let local = self.local_step(step, micro_batches, loss_scale / trained as f64)?;
        let device = self.model.device().clone();
        let collective = &*self.collective;
        let grads =
            section("all-reduce", &device, || all_reduce_grads(collective, local.grads, BUCKET_BYTES))?;
        // Unscaling and clipping are folded into one gradient factor of the optimizer step:
        // the gradients are read twice per step (norm, update) and never rewritten.
        let inv_scale = 1.0 / loss_scale;
        let grad_norm = section("clip", &device, || grad_norm(&grads, inv_scale))?;
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
        }
        let loss = loss_sum / trained as f64;
        let tokens = tokens as usize;
        Ok(Some(StepResult { loss, grad_norm, applied, trained_tokens: trained, tokens, stop: stops > 0.0 }))
    }

    /// This rank's gradients (summed over the micro-batches, scaled by `grad_scale`), loss sum
    /// and tokens; zeros for a rank whose shards train nothing (a short last batch).
    fn local_step(&self, step: usize, micro_batches: &[Batch], grad_scale: f64) -> anyhow::Result<LocalStep> {
        let rank = self.collective.rank() as u64;
        let (mut grads, mut loss_sum, mut tokens): (Option<Vec<Tensor>>, f64, usize) = (None, 0.0, 0);
        for (m, global) in micro_batches.iter().enumerate() {
            let Some(batch) = rank_batch(global, &*self.collective) else { continue };
            let ids = batch_tensor(&batch, self.model.device())?;
            // each rank draws its own dropout masks (rank 0's are those of one process)
            let seed = self.seed ^ ((step as u64) << 20) ^ m as u64 ^ (rank << 52);
            let out = self
                .model
                .forward_backward(&ids, &batch.labels, grad_scale, Some(seed))
                .context(Phase("forward and backward"))?;
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

/// Where in a step an error happened: attached as context, read back by `oom_report`.
#[derive(Debug, Clone, Copy)]
pub struct Phase(pub &'static str);

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "in the {} phase", self.0)
    }
}

/// Whether `e` is the device running out of memory, in the words of CUDA or candle
/// (`CUDA_ERROR_OUT_OF_MEMORY`, "out of memory"), cuBLAS (`CUBLAS_STATUS_ALLOC_FAILED`: its
/// workspace or a batched GEMM's pointer arrays) or cuDNN (`CUDNN_STATUS_ALLOC_FAILED`).
pub fn is_out_of_memory(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    ["OUT_OF_MEMORY", "out of memory", "ALLOC_FAILED"].iter().any(|words| text.contains(words))
}

/// An out-of-memory error as users need it: the step and phase, memory in use, what the planner
/// says fits, and the checkpoint to resume from. `batch`: the run's rows per micro-batch.
pub fn oom_report(
    e: &anyhow::Error,
    (step, batch): (usize, usize),
    cfg: &Config,
    model: &CausalLm,
) -> String {
    let phase = e.downcast_ref::<Phase>().map_or("a", |p| p.0);
    let gib = |b: u64| b as f64 / crate::memory::GIB;
    let memory = match crate::memory::pool_memory(model.device()) {
        Some(p) => {
            format!("{:.2} GiB in use, {:.2} GiB at the peak", gib(p.allocated), gib(p.peak_allocated))
        }
        None => "memory in use unknown".into(),
    };
    let seq = cfg.data.max_seq_len;
    let run = crate::plan::run_shape(cfg);
    let predicted = crate::plan::estimate(model.config(), &run, seq * batch).peak();
    let advice = match crate::memory::VramBudget::of(model.device(), cfg.train.max_vram_fraction) {
        Some(budget) => {
            let fits = crate::plan::largest_batch(model.config(), &run, seq, budget.bytes());
            format!("the planner predicts {:.2} GiB for batch {batch} x {seq}; train.batch_size = {fits} fits within {:.2} GiB (lora-ft estimate CONFIG shows the parts)", gib(predicted), gib(budget.bytes()))
        }
        None => format!("the planner predicts {:.2} GiB for batch {batch} x {seq}", gib(predicted)),
    };
    format!("out of GPU memory at step {step}, {phase} phase: {memory}; {advice}; {}", resume_point(cfg))
}

/// The newest complete checkpoint, for a message about a run that stopped.
pub fn resume_point(cfg: &Config) -> String {
    let resumes = match cfg.checkpoint.resume {
        crate::config::ResumeMode::Auto => "the same command resumes from it",
        crate::config::ResumeMode::Never => "checkpoint.resume = \"auto\" resumes from it",
    };
    match checkpoint::newest_complete(&cfg.output.dir) {
        Ok(Some((dir, state))) => format!(
            "the newest complete checkpoint, step {} ({}), is intact: {resumes}",
            state.step,
            dir.display()
        ),
        _ => "no checkpoint was written yet".into(),
    }
}

fn total_steps(cfg: &Config, batches_per_epoch: usize) -> usize {
    cfg.train.max_steps.unwrap_or_else(|| {
        ((cfg.train.epochs * batches_per_epoch as f64) / cfg.train.grad_accum as f64).ceil().max(1.0) as usize
    })
}

/// The run stopped on SIGINT/SIGTERM after writing a checkpoint of the step in progress.
#[derive(Debug, thiserror::Error)]
#[error("stopped by a signal at step {step} of {total}; checkpoint {}", checkpoint.display())]
pub struct Stopped {
    pub step: usize,
    pub total: usize,
    pub checkpoint: PathBuf,
}

/// This rank stopping because another rank failed: the failure, whatever the rank was doing.
pub fn peer_failure(e: &anyhow::Error) -> Option<&crate::distributed::DistributedError> {
    use crate::distributed::DistributedError;
    e.chain()
        .filter_map(|c| c.downcast_ref::<DistributedError>())
        .find(|d| matches!(d, DistributedError::PeerFailed(_)))
}

pub fn is_peer_failure(e: &anyhow::Error) -> bool {
    peer_failure(e).is_some()
}

/// `lora-ft train CONFIG [--trace DIR]` in one process. A write that runs out of space ends the
/// run with one message: the file, where to free space, and the checkpoint that is intact.
pub fn run(cfg: &Config, trace_dir: Option<&Path>) -> anyhow::Result<TrainSummary> {
    with_disk_full_message(cfg, || train(cfg, trace_dir, parse_device(&cfg.train.device)?, Arc::new(Solo)))
}

/// `lora-ft train CONFIG` as one rank of a data-parallel run (`world` from the launcher's
/// variables): joins the other ranks, trains its shard of every batch, and at the end says
/// goodbye, or tells the others why it failed so they stop too.
pub fn run_rank(cfg: &Config, trace_dir: Option<&Path>, world: &WorldInfo) -> anyhow::Result<TrainSummary> {
    let device_spec = rank_device(&cfg.train.device, world)?; // "cpu" or "cuda:LOCAL_RANK"
    let cfg = Config { train: TrainSection { device: device_spec, ..cfg.train.clone() }, ..cfg.clone() };
    let member =
        crate::distributed::join(world, device_spec_is_gpu(&cfg.train.device), agreed_config(&cfg)?)?;
    // one device handle for training and the collective: NCCL runs on the stream training uses
    let device = parse_device(&cfg.train.device).inspect_err(|e| member.fail(e))?;
    let collective = member.collective(&device)?;
    let result = with_disk_full_message(&cfg, || train(&cfg, trace_dir, device, Arc::clone(&collective)));
    match result {
        Ok(summary) => collective.finish().map(|()| summary),
        Err(e) if e.downcast_ref::<Stopped>().is_some() => {
            let _ = collective.finish();
            Err(e)
        }
        Err(e) if is_peer_failure(&e) => Err(e),
        Err(e) => {
            collective.abort(&format!("failed: {e:#}"));
            Err(e)
        }
    }
}

fn with_disk_full_message(
    cfg: &Config,
    train: impl FnOnce() -> anyhow::Result<TrainSummary>,
) -> anyhow::Result<TrainSummary> {
    train().map_err(|e| match durable::disk_full_message(&e) {
        Some(text) => anyhow::anyhow!("{text}; {}", resume_point(cfg)),
        None => e,
    })
}

/// The device of a rank for `train.device`: GPU LOCAL_RANK for "cuda" (and "auto" in a CUDA
/// build), the CPU for "cpu".
fn rank_device(spec: &str, world: &WorldInfo) -> anyhow::Result<String> {
    match spec {
        "cpu" => Ok("cpu".into()),
        "auto" if !candle_core::utils::cuda_is_available() => Ok("cpu".into()),
        "auto" | "cuda" => Ok(format!("cuda:{}", world.local_rank)),
        _ => anyhow::bail!(
            "train.device = {spec:?} names one GPU, but this is rank {} of {}: each rank trains on \
             cuda:LOCAL_RANK; set device = \"cuda\" (or \"cpu\")",
            world.rank,
            world.world_size
        ),
    }
}

fn device_spec_is_gpu(spec: &str) -> bool {
    spec.starts_with("cuda")
}

/// What every rank must agree on: the config, less the device (each rank has its own).
fn agreed_config(cfg: &Config) -> anyhow::Result<serde_json::Value> {
    let mut value = serde_json::to_value(cfg)?;
    if let Some(train) = value.get_mut("train").and_then(|t| t.as_object_mut()) {
        train.remove("device");
    }
    Ok(value)
}

/// The base model on `device` with fresh adapters, and the name PEFT should load it by.
fn load_model(
    cfg: &Config,
    device: &Device,
    budget: Option<crate::memory::VramBudget>,
) -> anyhow::Result<(CausalLm, crate::hub::ModelFiles, String)> {
    let source = cfg.model.expanded_source();
    let files = crate::hub::resolve(&source, &cfg.model.revision)?;
    // PEFT needs a base it can load: the imported folder rather than the .gguf file.
    let base_model = if source.ends_with(".gguf") { files.dir.display().to_string() } else { source };
    // before the load: a batch the planner says cannot fit is refused with settings that do
    if let (BatchSize::Fixed(batch), Some(budget)) = (cfg.train.batch_size, budget) {
        let m = crate::model::ModelConfig::from_file(&files.config)?;
        let shape = (cfg.data.max_seq_len, batch);
        crate::plan::check_fits(&m, &crate::plan::run_shape(cfg), shape, budget.bytes())
            .map_err(anyhow::Error::msg)?;
    }
    let dtype = compute_dtype(cfg.train.compute_dtype);
    tracing::info!(
        "loading {} ({dtype:?} on {device:?}, {:?})",
        files.dir.display(),
        cfg.model.quantization()
    );
    let mut model = CausalLm::load(&files.config, &files.weights, dtype, cfg.model.quantization(), device)?;
    model.add_lora(&lora_spec(cfg), cfg.train.seed)?;
    set_host_offload(&mut model, cfg.train.host_offload)?;
    Ok((model, files, base_model))
}

/// Checkpoints and lm_head in host memory during steps (CUDA), or everything on the device.
pub fn set_host_offload(model: &mut CausalLm, on: bool) -> anyhow::Result<()> {
    model.offload_checkpoints = on && model.device().is_cuda();
    if on && model.stream_lm_head()? {
        tracing::info!("lm_head streamed from page-locked host memory for the loss");
    }
    Ok(())
}

/// The tokenized training set (logged, checked against the model) and the evaluation set.
fn load_data(
    cfg: &Config,
    dir: &Path,
    vocab_size: usize,
    log: bool,
) -> anyhow::Result<(TokenizedDataset, Option<TokenizedDataset>, u32)> {
    let tokenizer = ChatTokenizer::from_dir(dir)?;
    let (max_len, side) = (cfg.data.max_seq_len, cfg.data.truncation_side);
    let train_set = TokenizedDataset::from_jsonl(&cfg.data.train, &tokenizer, max_len, side)?;
    let s = &train_set.stats;
    if log {
        tracing::info!(
            "{}: {} rows, {} truncated, {} dropped (no trained token left), {} trained tokens",
            cfg.data.train.display(),
            s.rows,
            s.truncated,
            s.dropped,
            s.trained_tokens
        );
    }
    anyhow::ensure!(!train_set.examples.is_empty(), "{}: no usable rows", cfg.data.train.display());
    check_token_ids(&train_set.examples, vocab_size, &cfg.data.train)?;
    let eval_set = match &cfg.data.eval {
        Some(path) => {
            let set = TokenizedDataset::from_jsonl(path, &tokenizer, max_len, side)?;
            check_token_ids(&set.examples, vocab_size, path)?;
            Some(set)
        }
        None => None,
    };
    Ok((train_set, eval_set, tokenizer.pad_id()))
}

fn train(
    cfg: &Config,
    trace_dir: Option<&Path>,
    device: Device,
    collective: Arc<dyn Collective>,
) -> anyhow::Result<TrainSummary> {
    let (rank, world_size) = (collective.rank(), collective.world_size());
    let budget = crate::memory::VramBudget::of(&device, cfg.train.max_vram_fraction);
    if cfg.train.batch_size == BatchSize::Auto && budget.is_none() {
        anyhow::bail!(auto_batch::refused_on(&device));
    }
    let (model, files, base_model) = load_model(cfg, &device, budget)?;
    let (train_set, eval_set, pad_id) = load_data(cfg, &files.dir, model.config().vocab_size, rank == 0)?;
    let run_dir = cfg.output.dir.clone();
    let start = match cfg.checkpoint.resume {
        crate::config::ResumeMode::Auto => checkpoint::newest_complete(&run_dir)?,
        crate::config::ResumeMode::Never => None,
    };
    let resumed = start.as_ref().map(|(_, state)| state);
    let examples = train_set.examples.len();
    let batch_size = agreed_batch_size(cfg, &model, examples, resumed, budget, &*collective)?;
    // every rank builds the global batches (those of one process with batch_size × world_size
    // rows, so the data order is the same for any number of ranks) and trains its shard
    let global_batch = batch_size * world_size;
    let eval_loader =
        eval_set.map(|set| BatchLoader::new(Arc::new(set.examples), global_batch, pad_id, None));
    let loader = BatchLoader::new(Arc::new(train_set.examples), global_batch, pad_id, Some(cfg.train.seed));
    let total = total_steps(cfg, loader.num_batches());
    if rank == 0 {
        write_run_config(cfg, batch_size)?;
    }
    let schedule = LrSchedule::new(cfg.train.schedule, cfg.train.lr, cfg.train.warmup_steps, total);
    let (max_grad_norm, seed) = (cfg.train.max_grad_norm, cfg.train.seed);
    let mut trainer = Trainer::new(model, &cfg.optim, cfg.train.weight_decay, schedule, max_grad_norm, seed)?
        .with_collective(collective);
    let rows_per_step = global_batch * cfg.train.grad_accum;
    let (start, epoch, row) = match start {
        Some((dir, state)) => {
            resume(&mut trainer, &dir, &state, (total, rows_per_step))?;
            (state.step, state.epoch, state.resume_row(global_batch))
        }
        None => (0, 0, 0),
    };
    agree_on_start(&*trainer.collective, (start, epoch, row))?;
    stop_on_signals();
    let mut stream = BatchStream::new(loader, epoch, row);
    let spec = lora_spec(cfg);
    let mut log = match (rank, world_size) {
        (0, 1) => MetricsLog::open(&run_dir.join("metrics.jsonl"), total, start)?,
        (0, _) => MetricsLog::open(&run_dir.join("metrics.jsonl"), total, start)?.with_log_lines(),
        _ => MetricsLog::silent(),
    };
    let trace = trace_dir
        .filter(|_| rank == 0)
        .map(|dir| Trace::start(dir, &trainer.model, &spec, &base_model, eval_loader.as_ref()))
        .transpose()?;
    let run = RunContext {
        cfg,
        eval_loader: eval_loader.as_ref(),
        start,
        total,
        batch_size,
        base_model: &base_model,
        spec: &spec,
    };
    train_loop(&run, &mut trainer, &mut stream, &mut log, trace)
}

/// `<output.dir>/config.json`: the config the run trains with, "auto" batch size resolved.
fn write_run_config(cfg: &Config, batch_size: usize) -> anyhow::Result<()> {
    let run_dir = &cfg.output.dir;
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let ran = Config {
        train: TrainSection { batch_size: BatchSize::Fixed(batch_size), ..cfg.train.clone() },
        ..cfg.clone()
    };
    durable::write_atomic(&run_dir.join("config.json"), serde_json::to_string_pretty(&ran)?.as_bytes())
}

/// Every rank must start at the same step and row: one that sees another checkpoint (an
/// output.dir that is not shared between machines) would train other rows with other weights.
fn agree_on_start(c: &dyn Collective, (step, epoch, row): (usize, u64, usize)) -> anyhow::Result<()> {
    if c.world_size() == 1 {
        return Ok(());
    }
    let ours = [step as f64, epoch as f64, row as f64];
    let (mut low, mut high) = (ours, ours);
    c.all_reduce_scalars(&mut low, ReduceOp::Min)?;
    c.all_reduce_scalars(&mut high, ReduceOp::Max)?;
    anyhow::ensure!(
        low == high,
        "the ranks do not start from the same checkpoint: rank {} starts at step {step} (epoch {epoch}, row {row}), \
         others between step {} and {}; every rank must see the same output.dir (on several machines, a shared \
         filesystem)",
        c.rank(),
        low[0],
        high[0]
    );
    Ok(())
}

/// Every token id of the data must be a row of the embedding table (the GPU lookup reads an id
/// past it as zeros; a tokenizer with more tokens than the model's table produces one).
fn check_token_ids(examples: &[crate::data::Example], vocab_size: usize, file: &Path) -> anyhow::Result<()> {
    let max = examples.iter().flat_map(|e| e.input_ids.iter().copied()).max().unwrap_or(0);
    anyhow::ensure!(
        (max as usize) < vocab_size,
        "{}: the tokenizer produced token id {max}, but the model's embedding table has {vocab_size} rows \
         (tokenizer and model do not match)",
        file.display()
    );
    Ok(())
}

/// The rows per micro-batch: the config's number; for "auto", the one of the checkpoint the run
/// resumes from (its data position counts batches of that size), else probed on the GPU.
fn batch_size(
    cfg: &Config,
    model: &CausalLm,
    examples: usize,
    resumed: Option<&TrainerState>,
    budget: Option<crate::memory::VramBudget>,
) -> anyhow::Result<usize> {
    match (cfg.train.batch_size, resumed.and_then(|s| s.batch_size)) {
        (BatchSize::Fixed(batch), _) => Ok(batch),
        (BatchSize::Auto, Some(batch)) => {
            tracing::info!("batch_size = \"auto\": batch {batch}, as the checkpoint resumed from");
            Ok(batch)
        }
        (BatchSize::Auto, None) => auto_batch::probe_batch_size(cfg, model, examples, budget),
    }
}

/// `batch_size`, and for "auto" the smallest any rank's probe found: every rank must train
/// the same rows per micro-batch.
fn agreed_batch_size(
    cfg: &Config,
    model: &CausalLm,
    examples: usize,
    resumed: Option<&TrainerState>,
    budget: Option<crate::memory::VramBudget>,
    c: &dyn Collective,
) -> anyhow::Result<usize> {
    let ours = batch_size(cfg, model, examples, resumed, budget)?;
    if c.world_size() == 1 || cfg.train.batch_size != BatchSize::Auto {
        return Ok(ours);
    }
    let mut smallest = [ours as f64];
    c.all_reduce_scalars(&mut smallest, ReduceOp::Min)?;
    let agreed = smallest[0] as usize;
    if agreed < ours {
        tracing::info!("batch {ours} fits this GPU; every rank trains {agreed}, what fits the smallest");
    }
    Ok(agreed)
}

/// Continues from checkpoint `dir`: the adapter into the model's own adapters (the optimizer
/// holds them), the optimizer state, the loss scaler. The schedule, the dropout seeds and the
/// data order are functions of the step and the seed, so the run goes on as if never stopped;
/// with another number of ranks the data goes on from the checkpoint's row.
fn resume(
    trainer: &mut Trainer,
    dir: &Path,
    state: &TrainerState,
    (total, rows_per_step): (usize, usize),
) -> anyhow::Result<()> {
    tracing::info!("resuming from {} (step {} of {total})", dir.display(), state.step);
    if state.total_steps != total {
        tracing::warn!(
            "the checkpoint was written for {} steps, this config runs {total}",
            state.total_steps
        );
    }
    if let Some(before) = state.rows_per_step.filter(|&r| r != rows_per_step) {
        tracing::warn!(
            "the checkpoint's run trained {before} rows per optimizer step, this one trains {rows_per_step} \
             (batch_size x ranks x grad_accum): the data order goes on where it stopped, but the steps are not \
             those of the first run; set train.batch_size or grad_accum to keep {before}"
        );
    }
    crate::export::set_adapter_values(&trainer.model, dir)?;
    let file = dir.join(checkpoint::OPTIMIZER_STATE);
    let tensors = candle_core::safetensors::load(&file, &Device::Cpu)
        .with_context(|| format!("reading {}", file.display()))?;
    trainer
        .optimizer
        .load_state(&tensors, state.step as u64)
        .with_context(|| format!("{}", file.display()))?;
    if let Some(scaler) = &state.loss_scaler {
        trainer.scaler = scaler.clone();
    }
    Ok(())
}

static STOP_REQUESTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// SIGINT / SIGTERM (Ctrl-C, a preempted machine) ask the loop to checkpoint after the current
/// step and stop; a second one kills at once.
fn stop_on_signals() {
    use std::sync::atomic::Ordering;
    // one handler per process (tests run several trainings in one)
    let _ = ctrlc::set_handler(|| {
        if STOP_REQUESTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\nstopping after this step: a checkpoint is written first (again to stop at once)");
    });
}

/// What the loop reads and never changes.
struct RunContext<'a> {
    cfg: &'a Config,
    eval_loader: Option<&'a BatchLoader>,
    /// The first step to run (a resumed run's checkpoint step).
    start: usize,
    total: usize,
    /// Rows per micro-batch (`batch_size = "auto"` resolved).
    batch_size: usize,
    base_model: &'a str,
    spec: &'a LoraSpec,
}

fn train_loop(
    run: &RunContext,
    trainer: &mut Trainer,
    stream: &mut BatchStream,
    log: &mut MetricsLog,
    mut trace: Option<Trace>,
) -> anyhow::Result<TrainSummary> {
    let RunContext { cfg, eval_loader, start, total, batch_size, .. } = *run;
    let started = Instant::now();
    let (mut first_loss, mut last_loss, mut all_tokens) = (f64::NAN, f64::NAN, 0usize);
    // The untrained model's eval loss first, so the log shows what training changed.
    let first_eval = eval_loader.map(|l| eval_record(trainer, l, cfg, start, log)).transpose()?;
    let mut last_eval = first_eval.clone();
    let budget = crate::memory::VramBudget::of(trainer.model.device(), cfg.train.max_vram_fraction);
    for step in start..total {
        let t0 = Instant::now();
        let micro: Vec<Batch> = (0..cfg.train.grad_accum).map(|_| stream.next_batch()).collect();
        if let Some(trace) = trace.as_mut() {
            trace.record(step + 1, &micro)?;
        }
        let result = trainer.step(step, &micro);
        let result = result.map_err(|e| match is_out_of_memory(&e) {
            true => anyhow::anyhow!(
                "{}\n  caused by: {e:#}",
                oom_report(&e, (step + 1, batch_size), cfg, &trainer.model)
            ),
            false => e,
        });
        // every rank sees the same global batches: all of them skip this step, or none
        let Some(r) = result? else {
            log.println(format!("step {step}: no trained tokens in these batches, skipped"));
            continue;
        };
        let done = step + 1;
        all_tokens += r.tokens;
        if first_loss.is_nan() {
            first_loss = r.loss;
        }
        last_loss = r.loss;
        anyhow::ensure!(r.loss.is_finite(), "step {done}: the loss is {} — lower train.lr?", r.loss);
        // one read of the pool per step serves the budget check and the metrics
        let gpu = budget.and(crate::memory::pool_memory(trainer.model.device()));
        if let (Some(budget), Some(pool)) = (budget, gpu) {
            budget.check(pool.peak_allocated).map_err(|over| {
                anyhow::anyhow!(
                    "step {done}: {over}; lower train.batch_size ({}) or data.max_seq_len ({}), or raise \
                     train.max_vram_fraction",
                    batch_size,
                    cfg.data.max_seq_len
                )
            })?;
        }
        if !r.applied {
            log.println(format!(
                "step {done}: gradients overflowed in f16, step skipped; loss scale now {}",
                trainer.scaler.scale()
            ));
        }
        if done % cfg.train.log_every == 0 || done == total {
            log.step(&step_record(trainer, stream, &r, (done, step), (t0, started), gpu))?;
        }
        let eval_now = cfg.train.eval_every > 0 && done % cfg.train.eval_every == 0;
        if let Some(loader) = eval_loader.filter(|_| eval_now || done == total) {
            last_eval = Some(eval_record(trainer, loader, cfg, done, log)?);
        }
        if (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0) || done == total || r.stop {
            let dir = save_checkpoint(run, trainer, stream, done)?;
            if r.stop && done < total {
                log.println(format!("stopped at step {done}: {} (the same command resumes)", dir.display()));
                log.finish();
                return Err(Stopped { step: done, total, checkpoint: dir }.into());
            }
        }
    }
    log.finish();
    trace.map(Trace::finish).transpose()?;
    let adapter_dir = save_results(run, trainer)?;
    let tokens_per_s = all_tokens as f64 / started.elapsed().as_secs_f64();
    Ok(TrainSummary { steps: total, first_loss, last_loss, first_eval, last_eval, adapter_dir, tokens_per_s })
}

fn step_record(
    trainer: &Trainer,
    stream: &BatchStream,
    r: &StepResult,
    (done, step): (usize, usize),
    (step_started, run_started): (Instant, Instant),
    gpu: Option<crate::memory::PoolMemory>,
) -> StepRecord {
    let gib = |b: u64| b as f64 / crate::memory::GIB;
    StepRecord {
        step: done,
        epoch: stream.epoch_progress(),
        loss: r.loss,
        lr: trainer.schedule.lr_at(step),
        grad_norm: r.grad_norm,
        loss_scale: trainer.scaler.scale(),
        skipped_steps: trainer.scaler.skipped,
        trained_tokens: r.trained_tokens,
        tokens: r.tokens,
        tokens_per_s: r.tokens as f64 / step_started.elapsed().as_secs_f64(),
        elapsed_s: run_started.elapsed().as_secs_f64(),
        gpu_allocated_gib: gpu.map(|m| gib(m.allocated)),
        gpu_peak_gib: gpu.map(|m| gib(m.peak_allocated)),
    }
}

/// Checkpoint `done`, written by rank 0 alone (whole or not at all); every rank then waits for
/// it, so none goes on, or stops, before it exists, and a failed save stops them all.
fn save_checkpoint(
    run: &RunContext,
    trainer: &Trainer,
    stream: &BatchStream,
    done: usize,
) -> anyhow::Result<PathBuf> {
    let (cfg, c) = (run.cfg, &*trainer.collective);
    let dir = checkpoint::checkpoint_dir(&cfg.output.dir, done);
    if c.rank() == 0 {
        let state = TrainerState {
            step: done,
            total_steps: run.total,
            epoch: stream.epoch,
            batch_in_epoch: stream.index(),
            seed: cfg.train.seed,
            loss_scaler: Some(trainer.scaler.clone()),
            batch_size: Some(run.batch_size),
            rows_in_epoch: Some(stream.row),
            world_size: Some(c.world_size()),
            rows_per_step: Some(run.batch_size * c.world_size() * cfg.train.grad_accum),
        };
        let opt_state = trainer.optimizer.state_tensors();
        checkpoint::save(&cfg.output.dir, &trainer.model, run.spec, run.base_model, opt_state, &state)
            .context(Phase("save"))
            .with_context(|| Saving(format!("checkpoint step {done}")))?;
        checkpoint::prune(&cfg.output.dir, cfg.checkpoint.keep_last)?;
    }
    c.barrier()?;
    Ok(dir)
}

/// The final adapter and the metrics plot, by rank 0; the others wait for the adapter.
fn save_results(run: &RunContext, trainer: &Trainer) -> anyhow::Result<PathBuf> {
    let cfg = run.cfg;
    let adapter_dir = cfg.output.adapters_dir.join(&cfg.output.adapter_name);
    if trainer.collective.rank() == 0 {
        save_adapter(&trainer.model, run.spec, run.base_model, &adapter_dir)
            .with_context(|| Saving(format!("the final adapter {}", adapter_dir.display())))?;
        // the adapter is the result: a plot that fails is only worth a warning
        match plot::plot_run(&cfg.output.dir, None) {
            Ok(png) => tracing::info!("metrics plot: {}", png.display()),
            Err(e) => tracing::warn!("no metrics plot: {e:#}"),
        }
    }
    trainer.collective.barrier()?;
    Ok(adapter_dir)
}

fn eval_record(
    trainer: &Trainer,
    loader: &BatchLoader,
    cfg: &Config,
    step: usize,
    log: &mut MetricsLog,
) -> anyhow::Result<EvalRecord> {
    let (loss, tokens) = evaluate(&trainer.model, loader, cfg.train.eval_batches, &*trainer.collective)?;
    let record = EvalRecord { step, eval_loss: loss, eval_ppl: loss.exp(), eval_tokens: tokens };
    log.eval(&record)?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Quantization;

    #[test]
    fn a_token_id_past_the_embedding_table_is_refused() {
        let examples = vec![crate::data::Example { input_ids: vec![1, 2, 99], labels: vec![-100, 2, 99] }];
        let file = Path::new("data/train.jsonl");
        assert!(check_token_ids(&examples, 100, file).is_ok());
        let err = check_token_ids(&examples, 99, file).unwrap_err().to_string();
        assert!(
            err.contains("data/train.jsonl") && err.contains("token id 99") && err.contains("99 rows"),
            "{err}"
        );
    }

    fn tiny_llama() -> (PathBuf, CausalLm) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
        let (config, weights) = crate::hub::local_weights(&dir).unwrap();
        let model = CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap();
        (dir, model)
    }

    /// A config of the tiny Llama with `train` (TOML lines), its run directory under a temp dir.
    fn tiny_config(model_dir: &Path, train: &str, name: &str) -> Config {
        let run = std::env::temp_dir().join(format!("lora-ft-{name}-{}", std::process::id()));
        let toml = format!(
            "[model]\nsource = \"{}\"\n[data]\ntrain = \"t.jsonl\"\nmax_seq_len = 64\n[train]\n\
             {train}\n[output]\ndir = \"{}\"\n",
            model_dir.display(),
            run.display()
        );
        Config::from_toml(&toml, Path::new("run.toml")).unwrap()
    }

    /// A CUDA out-of-memory error becomes one message with the step, the phase, the planner's
    /// advice and the checkpoint to resume from; other errors are not taken for one.
    #[test]
    fn out_of_memory_is_reported_with_step_phase_and_advice() {
        let (dir, model) = tiny_llama();
        let cfg = tiny_config(&dir, "batch_size = 4", "oom");
        let oom = Err::<(), _>(anyhow::anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"))
            .context(Phase("optimizer"))
            .unwrap_err();
        assert!(is_out_of_memory(&oom));
        let text = oom_report(&oom, (7, 4), &cfg, &model);
        assert!(text.starts_with("out of GPU memory at step 7, optimizer phase"), "{text}");
        assert!(text.contains("the planner predicts") && text.contains("batch 4 x 64"), "{text}");
        assert!(text.contains("no checkpoint was written yet"), "{text}");
        assert!(!is_out_of_memory(&anyhow::anyhow!("shape mismatch")));
        let cublas = anyhow::anyhow!("cublas error: CUBLAS_STATUS_ALLOC_FAILED").context(Phase("backward"));
        assert!(is_out_of_memory(&cublas));
    }

    /// "auto" is refused on the CPU before anything is read; a resumed "auto" run keeps its
    /// checkpoint's batch size, a fixed one its own.
    #[test]
    fn auto_batch_size_is_refused_on_the_cpu_and_kept_from_a_checkpoint() {
        let (dir, model) = tiny_llama();
        let auto = tiny_config(&dir, "batch_size = \"auto\"\ndevice = \"cpu\"", "auto");
        let err = match run(&auto, None) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("\"auto\" trained on the CPU"),
        };
        assert!(err.contains("\"auto\" probes GPU memory") && err.contains("set a number"), "{err}");
        assert!(!auto.output.dir.exists());
        let err = batch_size(&auto, &model, 100, None, None).unwrap_err().to_string();
        assert!(err.contains("\"auto\" probes GPU memory"), "{err}");
        let state = TrainerState {
            step: 3,
            total_steps: 10,
            epoch: 0,
            batch_in_epoch: 3,
            seed: 42,
            loss_scaler: None,
            batch_size: Some(6),
            rows_in_epoch: None,
            world_size: None,
            rows_per_step: None,
        };
        assert_eq!(batch_size(&auto, &model, 100, Some(&state), None).unwrap(), 6);
        let fixed = tiny_config(&dir, "batch_size = 4", "fixed");
        assert_eq!(batch_size(&fixed, &model, 100, Some(&state), None).unwrap(), 4);
    }
}
