//! The loop over optimizer steps: evaluation, metrics, the memory budget, checkpoints, a stop on
//! Ctrl-C, and at the end the adapter and the plot.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use super::checkpoint::{self, TrainerState};
use super::metrics::MetricsLog;
use super::outcome::{resume_point, Stopped, TrainSummary};
use super::plot;
use super::records::{EvalRecord, StepRecord};
use super::samples::Samples;
use super::step::{batch_tensor, rank_batch, BatchStream, StepResult, Trainer, STOP_REQUESTED};
use super::trace::Trace;
use crate::config::Config;
use crate::data::{Batch, BatchLoader};
use crate::distributed::{Collective, ReduceOp};
use crate::durable::Saving;
use crate::memory::{is_out_of_memory, Phase};
use crate::model::CausalLm;
use crate::peft_adapter::save_adapter;
use crate::plan::run::Run;

/// SIGINT / SIGTERM (Ctrl-C, a preempted machine) ask the loop to checkpoint after the current
/// step and stop; a second one kills at once.
pub(super) fn stop_on_signals() {
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
pub(super) struct RunContext<'a> {
    pub(super) cfg: &'a Config,
    /// The run resolved from `cfg`: the LoRA settings, the shapes, the budget.
    pub(super) run: &'a Run,
    pub(super) eval_loader: Option<&'a BatchLoader>,
    /// The first step to run (a resumed run's checkpoint step).
    pub(super) start: usize,
    pub(super) total: usize,
    /// Rows per micro-batch (`batch_size = "auto"` resolved).
    pub(super) batch_size: usize,
    pub(super) base_model: &'a str,
    /// `data.eval_prompts`, answered at the start, at each evaluation and at the end.
    pub(super) samples: Option<&'a Samples>,
}

pub(super) fn train_loop(
    context: &RunContext,
    trainer: &mut Trainer,
    stream: &mut BatchStream,
    log: &mut MetricsLog,
    mut trace: Option<Trace>,
) -> anyhow::Result<TrainSummary> {
    let RunContext { cfg, run, eval_loader, start, total, batch_size, .. } = *context;
    let started = Instant::now();
    let (mut first_loss, mut last_loss, mut all_tokens) = (f64::NAN, f64::NAN, 0usize);
    // The untrained model's eval loss first, so the log shows what training changed.
    let first_eval = eval_loader.map(|l| eval_record(trainer, l, cfg, start, log)).transpose()?;
    let mut last_eval = first_eval.clone();
    // the base model's answers (a resumed run has them in samples.jsonl already)
    let mut answers = match context.samples.filter(|_| start == 0) {
        Some(samples) => samples.answer(&trainer.model, start, &*trainer.collective)?,
        None => Vec::new(),
    };
    let budget = run.budget;
    let mut graphs = crate::model::ops::attention::graph_builds();
    for step in start..total {
        let t0 = Instant::now();
        let micro: Vec<Batch> = (0..run.grad_accum).map(|_| stream.next_batch()).collect();
        if let Some(trace) = trace.as_mut() {
            trace.record(step + 1, &micro)?;
        }
        // a step out of GPU memory before anything of it was applied runs again (recovery.rs)
        let result = trainer.step_recovering(step, &micro, |line| log.println(line));
        let result = result.map_err(|e| match is_out_of_memory(&e) {
            true => anyhow::anyhow!(
                "{}\n  caused by: {e:#}",
                oom_report(&e, (step + 1, batch_size), (run, cfg), &trainer.model)
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
            if let Err(over) = budget.check(pool.peak_allocated) {
                // checkpointing "auto" planned to the budget's edge: keep a layer fewer, go on
                let layers = trainer.model.layers.len();
                anyhow::ensure!(
                    trainer.model.kept_layers().keep_fewer(layers),
                    "step {done}: {over}; lower train.batch_size ({batch_size}) or data.max_seq_len ({}), or \
                     raise train.max_vram_fraction",
                    run.max_seq_len
                );
                log.println(format!(
                    "step {done}: {over}; the steps of its shape from now on keep one layer's activations fewer on the GPU \
                     (train.checkpointing = \"auto\")"
                ));
                crate::memory::reset_peak(trainer.model.device());
            }
        }
        if !r.applied {
            log.println(format!(
                "step {done}: gradients overflowed in f16, step skipped; loss scale now {}",
                trainer.scaler.scale()
            ));
        }
        let built = crate::model::ops::attention::graph_builds();
        if built.0 > graphs.0 {
            tracing::debug!(
                "step {done}: cuDNN built {} attention graphs for this step's new shapes in {:.3} s",
                built.0 - graphs.0,
                built.1 - graphs.1
            );
        }
        graphs = built;
        if done % cfg.train.log_every == 0 || done == total {
            log.step(&step_record(trainer, stream, &r, (done, step), (t0, started), gpu))?;
        }
        let eval_now = cfg.train.eval_every > 0 && done % cfg.train.eval_every == 0;
        if let Some(loader) = eval_loader.filter(|_| eval_now || done == total) {
            last_eval = Some(eval_record(trainer, loader, cfg, done, log)?);
        }
        if let Some(samples) = context.samples.filter(|_| eval_now || done == total) {
            answers = samples.answer(&trainer.model, done, &*trainer.collective)?;
        }
        if (cfg.checkpoint.every > 0 && done % cfg.checkpoint.every == 0) || done == total || r.stop {
            let dir = save_checkpoint(context, trainer, stream, done)?;
            if r.stop && done < total {
                log.println(format!("stopped at step {done}: {} (the same command resumes)", dir.display()));
                log.finish();
                return Err(Stopped { step: done, total, checkpoint: dir }.into());
            }
        }
    }
    if let Some(samples) = context.samples {
        samples.print_comparison(&answers, log)?;
    }
    if graphs.0 > 0 {
        tracing::info!(
            "cuDNN built {} attention graphs (a forward and a backward per shape) in {:.2} s",
            graphs.0,
            graphs.1
        );
    }
    log.finish();
    trace.map(Trace::finish).transpose()?;
    let adapter_dir = save_results(context, trainer)?;
    let tokens_per_s = all_tokens as f64 / started.elapsed().as_secs_f64();
    Ok(TrainSummary {
        steps: total,
        first_step: start,
        first_loss,
        last_loss,
        first_eval,
        last_eval,
        adapter_dir,
        tokens_per_s,
    })
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
    context: &RunContext,
    trainer: &Trainer,
    stream: &BatchStream,
    done: usize,
) -> anyhow::Result<PathBuf> {
    let RunContext { cfg, run, total, batch_size, base_model, .. } = *context;
    let c = &*trainer.collective;
    let dir = checkpoint::checkpoint_dir(&cfg.output.dir, done);
    if c.rank() == 0 {
        let state = TrainerState {
            step: done,
            total_steps: total,
            epoch: stream.epoch,
            batch_in_epoch: stream.index(),
            seed: cfg.train.seed,
            loss_scaler: Some(trainer.scaler.clone()),
            batch_size: Some(batch_size),
            rows_in_epoch: Some(stream.row),
            world_size: Some(c.world_size()),
            rows_per_step: Some(batch_size * c.world_size() * run.grad_accum),
            optimizer: Some(trainer.optimizer.name()),
        };
        let opt_state = trainer.optimizer.state_tensors();
        checkpoint::save(&cfg.output.dir, &trainer.model, run.lora(), base_model, opt_state, &state)
            .context(Phase("save"))
            .with_context(|| Saving(format!("checkpoint step {done}")))?;
        checkpoint::prune(&cfg.output.dir, cfg.checkpoint.keep_last)?;
    }
    c.barrier()?;
    Ok(dir)
}

/// The final adapter and the metrics plot, by rank 0; the others wait for the adapter.
fn save_results(context: &RunContext, trainer: &Trainer) -> anyhow::Result<PathBuf> {
    let RunContext { cfg, run, base_model, .. } = *context;
    let adapter_dir = cfg.output.adapters_dir.join(&cfg.output.adapter_name);
    if trainer.collective.rank() == 0 {
        save_adapter(&trainer.model, run.lora(), base_model, &adapter_dir)
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

/// An out-of-memory error as users need it: the step and phase, memory in use, what the planner
/// says fits (`Run::oom_advice`), and the checkpoint to resume from. `batch`: the run's rows per
/// micro-batch.
pub fn oom_report(
    e: &anyhow::Error,
    (step, batch): (usize, usize),
    (run, cfg): (&Run, &Config),
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
    let advice = run.oom_advice(batch);
    format!("out of GPU memory at step {step}, {phase} phase: {memory}; {advice}; {}", resume_point(cfg))
}
