//! The run's setup: the device, the model with fresh adapters, the tokenized data, the batch
//! size, the checkpoint to resume from; then the loop (`run_loop.rs`).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use candle_core::{DType, Device};

use super::auto_batch;
use super::checkpoint::{self, TrainerState};
use super::metrics::MetricsLog;
use super::outcome::TrainSummary;
use super::run_loop::{stop_on_signals, train_loop, RunContext};
use super::step::{BatchStream, Trainer};
use super::tensorboard::TensorBoard;
use super::trace::Trace;
use crate::config::{BatchSize, Checkpointing, ComputeDtype, Config, ReportTo, TrainSection};
use crate::data::{BatchLoader, ChatTokenizer, PadTo, TokenizedDataset};
use crate::distributed::{Collective, ReduceOp};
use crate::durable;
use crate::hub::ModelFiles;
use crate::model::CausalLm;
use crate::optim::LrSchedule;
use crate::plan::run::Run;

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
    #[cfg(feature = "cuda")]
    crate::cuda::order_by_stream(&device);
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

/// The base model on `device` with fresh adapters and the run's training policy, and the name
/// PEFT should load it by.
fn load_model(
    cfg: &Config,
    run: &Run,
    files: &ModelFiles,
    device: &Device,
) -> anyhow::Result<(CausalLm, String)> {
    let source = cfg.model.expanded_source();
    // PEFT needs a base it can load: the imported folder rather than the .gguf file.
    let base_model = if source.ends_with(".gguf") { files.dir.display().to_string() } else { source };
    // before the load: a batch the planner says cannot fit is refused with settings that do
    run.check_fits()?;
    let dtype = compute_dtype(cfg.train.compute_dtype);
    tracing::info!(
        "loading {} ({dtype:?} on {device:?}, {:?})",
        files.dir.display(),
        cfg.model.quantization()
    );
    // the attention of a full-length batch built and run while the weights load: its first
    // use's graph building and kernel loading come off the first step (decoder/prepare.rs)
    let first_shape = (run.max_seq_len, run.first_batch());
    let warm_up =
        crate::model::decoder::prepare::spawn(&files.config, dtype, device, first_shape, cfg.data.packing);
    let mut model = CausalLm::load(&files.config, &files.weights, dtype, cfg.model.quantization(), device)?;
    if let Some(warm_up) = warm_up {
        let _ = warm_up.join();
        // the warm-up's buffers were transient: the budget check measures the steps' peaks
        crate::memory::reset_peak(device);
    }
    model.add_lora(run.lora(), cfg.train.seed)?;
    set_training_policy(&mut model, run)?;
    if let Some(b) = run.budget.filter(|_| run.checkpointing == Checkpointing::Auto) {
        let (layers, seq, batch) = (model.layers.len(), run.max_seq_len, run.first_batch());
        let plan = model.kept_layers().plan((seq, batch));
        tracing::info!(
            "checkpointing auto: at batch {batch} x {seq} {} of {layers} layers keep their activations on the \
             GPU within the budget of {:.2} GiB and {} in page-locked host memory (one every {} layers), the \
             others are recomputed",
            plan.kept.min(layers),
            b.bytes() as f64 / crate::memory::GIB,
            plan.offloaded,
            plan.stride
        );
    }
    Ok((model, base_model))
}

/// The run's policy for `model`'s training steps (`Run::training_policy`). With host offload an
/// untied lm_head moves to page-locked host memory first: what the host has left after it is
/// what offloaded layers may take.
pub fn set_training_policy(model: &mut CausalLm, run: &Run) -> anyhow::Result<()> {
    if run.run_shape.host_offload && model.stream_lm_head()? {
        tracing::info!(
            "lm_head moved to page-locked host memory: streamed for the loss at the shapes where the plan \
             has no room for it on the GPU, copied back where it has (checkpointing \"auto\")"
        );
    }
    model.set_training_policy(run.training_policy(model.device()));
    Ok(())
}

/// The tokenized training set (logged, checked against the model) and the evaluation set, rows
/// cut at `max_len` tokens.
fn load_data(
    cfg: &Config,
    max_len: usize,
    dir: &Path,
    vocab_size: usize,
    log: bool,
) -> anyhow::Result<(TokenizedDataset, Option<TokenizedDataset>, u32)> {
    let tokenizer = ChatTokenizer::load(dir, cfg.model.chat_template.as_deref())?
        .with_system_message(cfg.data.system_message);
    let (side, format) = (cfg.data.truncation_side, cfg.data.format);
    let train_set = TokenizedDataset::from_file(&cfg.data.train, format, &tokenizer, max_len, side)?;
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
    let mut train_set = train_set;
    if cfg.data.packing {
        let (rows, p) = crate::data::pack(std::mem::take(&mut train_set.examples), max_len);
        if log {
            tracing::info!(
                "data.packing: {} dialogues in {} rows of {max_len} tokens ({:.1}% filled)",
                p.dialogues,
                p.rows,
                100.0 * p.fill()
            );
        }
        train_set.examples = rows;
    }
    let eval_set = match &cfg.data.eval {
        Some(path) => {
            let set = TokenizedDataset::from_file(path, format, &tokenizer, max_len, side)?;
            check_token_ids(&set.examples, vocab_size, path)?;
            Some(set)
        }
        None => None,
    };
    Ok((train_set, eval_set, tokenizer.pad_id()))
}

pub(super) fn train(
    cfg: &Config,
    trace_dir: Option<&Path>,
    device: Device,
    collective: Arc<dyn Collective>,
) -> anyhow::Result<TrainSummary> {
    let (rank, world_size) = (collective.rank(), collective.world_size());
    let budget = crate::memory::VramBudget::of(&device, cfg.train.max_vram_fraction, cfg.train.gpu_mem);
    if cfg.train.batch_size == BatchSize::Auto && budget.is_none() {
        anyhow::bail!(auto_batch::refused_on(&device));
    }
    let files = crate::hub::resolve(&cfg.model.expanded_source(), &cfg.model.revision)?;
    // the run put together once: everything below reads it, not the config's copies of it
    let run = Run::resolve(cfg, crate::arch::ModelConfig::from_file(&files.config)?, budget);
    let (model, base_model) = load_model(cfg, &run, &files, &device)?;
    let vocab_size = model.config().vocab_size;
    let (train_set, eval_set, pad_id) = load_data(cfg, run.max_seq_len, &files.dir, vocab_size, rank == 0)?;
    let run_dir = cfg.output.dir.clone();
    let start = match cfg.checkpoint.resume {
        crate::config::ResumeMode::Auto => checkpoint::newest_complete(&run_dir)?,
        crate::config::ResumeMode::Never => None,
    };
    let resumed = start.as_ref().map(|(_, state)| state);
    let examples = train_set.examples.len();
    let batch_size = agreed_batch_size(cfg, &run, &model, (examples, resumed), &*collective)?;
    // every rank builds the global batches (those of one process with batch_size × world_size
    // rows, so the data order is the same for any number of ranks) and trains its shard
    let global_batch = batch_size * world_size;
    let pad_to = PadTo { multiple: cfg.data.pad_to_multiple_of, most: run.max_seq_len };
    let eval_loader = eval_set
        .map(|set| BatchLoader::new(Arc::new(set.examples), global_batch, pad_id, None).padded_to(pad_to));
    let loader = BatchLoader::new(Arc::new(train_set.examples), global_batch, pad_id, Some(cfg.train.seed))
        .grouped_by_length(cfg.data.group_by_length)
        .padded_to(pad_to);
    let total = total_steps(cfg, run.grad_accum, loader.num_batches());
    let ran = (rank == 0).then(|| write_run_config(cfg, batch_size)).transpose()?;
    let schedule = LrSchedule::new(cfg.train.schedule, cfg.train.lr, cfg.train.warmup_steps, total);
    let (max_grad_norm, seed) = (cfg.train.max_grad_norm, cfg.train.seed);
    let mut trainer = Trainer::new(model, &cfg.optim, cfg.train.weight_decay, schedule, max_grad_norm, seed)?
        .with_collective(collective);
    let rows_per_step = global_batch * run.grad_accum;
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
    let mut log = match (rank, world_size) {
        (0, 1) => MetricsLog::open(&run_dir.join("metrics.jsonl"), total, start)?,
        (0, _) => MetricsLog::open(&run_dir.join("metrics.jsonl"), total, start)?.with_log_lines(),
        _ => MetricsLog::silent(),
    };
    if let Some(ran) = ran.filter(|c| c.train.report_to.contains(&ReportTo::Tensorboard)) {
        log = log.with_tensorboard(TensorBoard::create(&run_dir.join("tb"), start, &ran)?);
    }
    let trace = trace_dir
        .filter(|_| rank == 0)
        .map(|dir| Trace::start(dir, &trainer.model, run.lora(), &base_model, eval_loader.as_ref()))
        .transpose()?;
    let samples = super::samples::Samples::open(cfg, &files.dir, start, rank)?;
    let context = RunContext {
        samples: samples.as_ref(),
        cfg,
        run: &run,
        eval_loader: eval_loader.as_ref(),
        start,
        total,
        batch_size,
        base_model: &base_model,
    };
    train_loop(&context, &mut trainer, &mut stream, &mut log, trace)
}

/// Optimizer steps: `train.max_steps`, else the epochs' batches over `grad_accum` micro-batches
/// a step.
fn total_steps(cfg: &Config, grad_accum: usize, batches_per_epoch: usize) -> usize {
    cfg.train.max_steps.unwrap_or_else(|| {
        ((cfg.train.epochs * batches_per_epoch as f64) / grad_accum as f64).ceil().max(1.0) as usize
    })
}

/// `<output.dir>/config.json`: the config the run trains with, "auto" batch size resolved; it is
/// returned (TensorBoard's `config` text).
fn write_run_config(cfg: &Config, batch_size: usize) -> anyhow::Result<Config> {
    let run_dir = &cfg.output.dir;
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let ran = Config {
        train: TrainSection { batch_size: BatchSize::Fixed(batch_size), ..cfg.train.clone() },
        ..cfg.clone()
    };
    durable::write_atomic(&run_dir.join("config.json"), serde_json::to_string_pretty(&ran)?.as_bytes())?;
    Ok(ran)
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
pub(super) fn check_token_ids(
    examples: &[crate::data::Example],
    vocab_size: usize,
    file: &Path,
) -> anyhow::Result<()> {
    let max = examples.iter().flat_map(|e| e.input_ids.iter().copied()).max().unwrap_or(0);
    anyhow::ensure!(
        (max as usize) < vocab_size,
        "{}: the tokenizer produced token id {max}, but the model's embedding table has {vocab_size} rows \
         (tokenizer and model do not match)",
        file.display()
    );
    Ok(())
}

/// The rows per micro-batch: the run's number; for "auto", the one of the checkpoint the run
/// resumes from (its data position counts batches of that size), else probed on the GPU.
pub(super) fn batch_size(
    cfg: &Config,
    run: &Run,
    model: &CausalLm,
    (examples, resumed): (usize, Option<&TrainerState>),
) -> anyhow::Result<usize> {
    match (run.batch_size, resumed.and_then(|s| s.batch_size)) {
        (BatchSize::Fixed(batch), _) => Ok(batch),
        (BatchSize::Auto, Some(batch)) => {
            tracing::info!("batch_size = \"auto\": batch {batch}, as the checkpoint resumed from");
            Ok(batch)
        }
        (BatchSize::Auto, None) => auto_batch::probe_batch_size(cfg, run, model, examples),
    }
}

/// `batch_size`, and for "auto" the smallest any rank's probe found: every rank must train
/// the same rows per micro-batch.
fn agreed_batch_size(
    cfg: &Config,
    run: &Run,
    model: &CausalLm,
    (examples, resumed): (usize, Option<&TrainerState>),
    c: &dyn Collective,
) -> anyhow::Result<usize> {
    let ours = batch_size(cfg, run, model, (examples, resumed))?;
    if c.world_size() == 1 || run.batch_size != BatchSize::Auto {
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
    let (saved, ours) = (state.optimizer(), trainer.optimizer.name());
    anyhow::ensure!(
        saved == ours,
        "{}: the checkpoint holds the state of optim.name = \"{}\", and this config trains with \"{}\": \
         set optim.name = \"{}\" to resume it, or train into another output.dir",
        dir.display(),
        saved.as_str(),
        ours.as_str(),
        saved.as_str()
    );
    crate::peft_adapter::set_adapter_values(&trainer.model, dir)?;
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
