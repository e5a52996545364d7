//! `lora-ft bench`: measurements to set beside the reference stack's, printed as JSON lines.

use crate::model::activations::LayerKind;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device};
use serde::Serialize;

use crate::config::{
    AdafactorFlavor, AdafactorSection, ComputeDtype, Config, LoraSpec, ModelSection, OptimSection,
    QuantizationKind, TrainSection,
};
use crate::memory::{device_memory, pool_memory, reset_peak, GIB};
use crate::model::CausalLm;
use crate::quant::Quantization;

pub mod flops;
mod generate;
pub use generate::{generate, GenerateOptions};
mod start;
pub use start::{first_steps, kernels, FirstSteps};

/// What loading a model cost.
#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub model: String,
    pub quantization: String,
    pub dtype: String,
    pub load_s: f64,
    /// Bytes of the tensors the model holds (embeddings, norms, lm_head, quantized projections).
    pub model_gib: f64,
    /// Allocated in the memory pool after loading, and its peak while loading (`None` on the CPU).
    pub allocated_gib: Option<f64>,
    pub peak_allocated_gib: Option<f64>,
    /// Growth of the device's used memory across the load (driver view; `None` on the CPU).
    pub device_used_gib: Option<f64>,
}

/// config.json and weights: a local folder needs no tokenizer; otherwise the full resolution.
fn model_files(model: &str) -> anyhow::Result<(std::path::PathBuf, Vec<std::path::PathBuf>)> {
    crate::hub::config_and_weights(model, "main")
}

/// Loads `model` (HF folder, Hub id or .gguf) and reports time and memory.
pub fn load(
    model: &str,
    quantization: Quantization,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<LoadReport> {
    let (config, weights) = model_files(model)?;
    let before = device_memory(device);
    reset_peak(device);
    let started = Instant::now();
    let lm = CausalLm::load(&config, &weights, dtype, quantization, device)?;
    let after = device_memory(device);
    let load_s = started.elapsed().as_secs_f64();
    let pool = pool_memory(device);
    let used = before.zip(after).map(|(b, a)| (a.used as f64 - b.used as f64) / GIB);
    Ok(LoadReport {
        model: model.to_string(),
        quantization: format!("{quantization:?}"),
        dtype: format!("{dtype:?}"),
        load_s,
        model_gib: lm.base_size_in_bytes() as f64 / GIB,
        allocated_gib: pool.map(|p| p.allocated as f64 / GIB),
        peak_allocated_gib: pool.map(|p| p.peak_allocated as f64 / GIB),
        device_used_gib: used,
    })
}

static PROCESS_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Marks the start of the process (the first thing `main` does): `first_step_s` counts from it.
pub fn mark_process_start() {
    PROCESS_START.get_or_init(Instant::now);
}

/// One row of `lora-ft bench train`: the anchor script's fields, side by side.
#[derive(Debug, Serialize)]
pub struct TrainRow {
    pub seq: usize,
    pub bs: usize,
    pub step_s: Option<f64>,
    pub tok_s: Option<f64>,
    pub peak_alloc_gib: Option<f64>,
    pub peak_reserved_gib: Option<f64>,
    pub loss: Option<f64>,
    /// Model FLOPs utilization: (4·N + 6·N_lora + 3·A) FLOPs per token at `tok_s`, over the
    /// H100/H200's dense peak (`flops::PEAK_FLOPS`, 989 TFLOP/s); `flops.rs` says what each term
    /// counts. (Rows written before 2026-11-26 held 6·N over 790 TFLOP/s here.)
    pub mfu: Option<f64>,
    /// Hardware FLOPs utilization: the same with checkpointing's recomputed forward of the layers
    /// not kept, (6·N + 8·N_lora + 4·A) − (kept / layers)·(2·N + 2·N_lora + A), over the peak.
    pub hfu: Option<f64>,
    pub error: Option<String>,
    /// Layers whose activations the step kept instead of recomputing (`--checkpointing`), on the
    /// GPU or in host memory.
    pub kept_layers: Option<usize>,
    /// Of those, the ones kept in page-locked host memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offloaded_layers: Option<usize>,
    /// Of those, the ones that kept the cheap kernels' outputs too (`LayerKind::KeptAll`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub complete_layers: Option<usize>,
    /// First shape only: seconds from process start to the end of the first training step
    /// (CUDA context, load and quantization, adapters, kernel JIT, the step itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_step_s: Option<f64>,
    /// First shape only, with `--first-step-cold-warm`: the same on a cold, fresh and warm
    /// driver JIT cache, each in a child process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_steps: Option<FirstSteps>,
    /// With LORA_FT_PROFILE=1: seconds per step in each section, largest first (sections
    /// synchronize the device, so the step itself is slower than unprofiled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<Vec<(String, f64)>>,
    /// First shape only: seconds from process start to each milestone before the first step
    /// ("model loaded", "adapters added", "trainer ready"), then, with LORA_FT_PROFILE=1, the
    /// first step's own sections ("first step: NAME", seconds) — where a cold start goes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub startup: Option<Vec<(String, f64)>>,
    /// With `--hold-card`: the card (GiB) the run was held to, the rest of the GPU's memory held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card_gib: Option<f64>,
    /// What a warm-up step that ran out of GPU memory changed to run, as `lora-ft train` does
    /// (train/recovery.rs): the pool trimmed, layers given up. The timed steps run with it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recovered: Vec<String>,
    /// With `LORA_FT_TIMELINE=1`: the timed steps' marks as (name, GPU ms, host ms) from the
    /// first one's start (profile.rs `timeline`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<(String, f64, f64)>>,
}

/// What `bench train` sets beyond the model and the shapes.
pub struct TrainOptions {
    /// Timed steps per shape.
    pub steps: usize,
    pub lora_dropout: f64,
    /// `train.host_offload`.
    pub host_offload: bool,
    /// `train.mlp_tiles`.
    pub mlp_tiles: bool,
    /// `train.checkpointing`, planned within `max_vram_fraction` of the card or of `gpu_mem` GiB.
    pub checkpointing: crate::config::Checkpointing,
    pub gpu_mem: Option<f64>,
    /// With `gpu_mem`: hold the GPU's memory beyond that card for the whole run
    /// (`memory::HeldMemory`), so that the run has what the card would have, not only the plan.
    pub hold_card: bool,
    /// First steps timed in child processes (`--first-step-cold-warm`): reported on the first
    /// row instead of this process's own, which they delayed.
    pub first_steps: Option<FirstSteps>,
}

/// The recipe of ../shared/anchors/peft_qlora_baseline.py: LoRA r=16 (alpha 32, no dropout) on
/// all seven projections, torch-flavoured Adafactor at lr 2e-4, clipping at 1.0, loss scaling in
/// f16, random token ids as inputs and labels, 2 warm-up steps then `steps` timed ones.
/// `lora_dropout` > 0 measures the cost of LoRA dropout (the anchor has none).
pub fn train(
    model: &str,
    quantization: Quantization,
    dtype: DType,
    device: &Device,
    shapes: &[(usize, usize)],
    options: &TrainOptions,
    mut report: impl FnMut(&TrainRow),
) -> anyhow::Result<Vec<TrainRow>> {
    let TrainOptions { steps, lora_dropout, gpu_mem, .. } = *options;
    anyhow::ensure!(
        (0.0..1.0).contains(&lora_dropout),
        "--lora-dropout must be in [0, 1), got {lora_dropout}"
    );
    // held until the shapes are done
    let held = match (options.hold_card, gpu_mem) {
        (true, Some(gib)) => Some(crate::memory::HeldMemory::beyond(device, gib)?),
        (true, None) => anyhow::bail!("--hold-card needs --gpu-mem: the card to hold the GPU to"),
        (false, _) => None,
    };
    let card_gib = held.as_ref().and(gpu_mem);
    if let (Some(held), Some(gib)) = (&held, card_gib) {
        tracing::info!(
            "holding {:.2} GiB of the GPU: the run has what a {gib} GiB card has",
            held.bytes as f64 / GIB
        );
    }
    let (config, weights) = model_files(model)?;
    let cfg = recipe(quantization, dtype, options)?;
    let budget = crate::memory::VramBudget::of(device, cfg.train.max_vram_fraction, cfg.train.gpu_mem);
    let run = crate::plan::run::Run::resolve(&cfg, crate::arch::ModelConfig::from_file(&config)?, budget);
    let mut startup = Startup::default();
    // the first shape's attention built and run while the weights load (decoder/prepare.rs)
    let warm_up = shapes
        .first()
        .and_then(|&shape| crate::model::decoder::prepare::spawn(&config, dtype, device, shape, false));
    let mut lm = CausalLm::load(&config, &weights, dtype, quantization, device)?;
    startup.mark("model loaded", device)?;
    // joined before anything else uses the device from this thread (cuBLAS and curand handles are
    // one per device, not safe from two threads at once)
    if let Some(warm_up) = warm_up {
        let _ = warm_up.join();
        startup.mark("attention warmed up", device)?;
    }
    lm.add_lora(run.lora(), 0)?;
    startup.mark("adapters added", device)?;
    crate::train::set_training_policy(&mut lm, &run)?;
    let schedule = crate::optim::LrSchedule::new(crate::config::Schedule::Constant, 2e-4, 0, usize::MAX);
    let mut trainer = crate::train::Trainer::new(lm, &cfg.optim, 0.0, schedule, 1.0, 0)?;
    let vocab = trainer.model.config().vocab_size as u32;
    startup.mark("trainer ready", device)?;
    let mut rows = Vec::new();
    for &(seq, bs) in shapes {
        let first = rows.is_empty();
        let startup = first.then(|| std::mem::take(&mut startup.0));
        let row = match time_shape(&mut trainer, vocab, (seq, bs), steps, startup) {
            Ok(row) if first && options.first_steps.is_some() => {
                TrainRow { first_step_s: None, first_steps: options.first_steps.clone(), ..row }
            }
            Ok(row) => row,
            Err(e) => TrainRow {
                seq,
                bs,
                step_s: None,
                tok_s: None,
                peak_alloc_gib: None,
                peak_reserved_gib: None,
                loss: None,
                mfu: None,
                hfu: None,
                error: Some(oom_or(e)),
                kept_layers: None,
                offloaded_layers: None,
                complete_layers: None,
                first_step_s: None,
                first_steps: None,
                profile: None,
                startup: None,
                card_gib: None,
                timeline: None,
                recovered: Vec::new(),
            },
        };
        let row = TrainRow { card_gib, ..row };
        report(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The anchor recipe with `options` as a training config, resolved into the run it times as
/// `lora-ft train` resolves one (`plan::run::Run`).
fn recipe(quantization: Quantization, dtype: DType, options: &TrainOptions) -> anyhow::Result<Config> {
    let base =
        Config::from_toml("[model]\nsource = \"\"\n[data]\ntrain = \"\"\n", Path::new("lora-ft bench"))?;
    let (kind, double_quant) = match quantization {
        Quantization::Nf4 { double_quant } => (QuantizationKind::Nf4, double_quant),
        Quantization::None => (QuantizationKind::None, base.model.double_quant),
    };
    let compute_dtype = match dtype {
        DType::F32 => ComputeDtype::F32,
        DType::BF16 => ComputeDtype::Bf16,
        _ => ComputeDtype::F16,
    };
    let lora = LoraSpec {
        r: 16,
        alpha: 32.0,
        dropout: options.lora_dropout,
        target_modules: crate::model::PROJECTIONS.iter().map(|p| p.to_string()).collect(),
        rslora: false,
    };
    let train = TrainSection {
        compute_dtype,
        checkpointing: options.checkpointing,
        host_offload: options.host_offload,
        mlp_tiles: options.mlp_tiles,
        gpu_mem: options.gpu_mem,
        ..base.train
    };
    let optim =
        OptimSection::adafactor(&AdafactorSection { flavor: AdafactorFlavor::Torch, ..Default::default() });
    Ok(Config {
        model: ModelSection { quantization: kind, double_quant, ..base.model },
        lora,
        train,
        optim,
        ..base
    })
}

fn oom_or(e: anyhow::Error) -> String {
    if crate::memory::is_out_of_memory(&e) {
        match e.downcast_ref::<crate::memory::Phase>() {
            Some(phase) => format!("OOM {phase}"),
            None => "OOM".into(),
        }
    } else {
        format!("{e:#}")
    }
}

/// Milestones of a run's start, in seconds from process start (`TrainRow::startup`).
#[derive(Default)]
struct Startup(Vec<(String, f64)>);

impl Startup {
    /// `what` is done once the device has finished the work queued so far.
    fn mark(&mut self, what: &str, device: &Device) -> anyhow::Result<()> {
        device.synchronize()?;
        if let Some(t) = PROCESS_START.get() {
            self.0.push((what.to_string(), t.elapsed().as_secs_f64()));
        }
        Ok(())
    }
}

/// A retry of a step out of memory (`Trainer::step_recovering`), logged and kept for the row.
fn noted(recovered: &mut Vec<String>, (seq, bs): (usize, usize), line: String) {
    tracing::info!("{seq} x {bs}: {line}");
    recovered.push(line);
}

/// `startup`: on the run's first shape, the milestones so far; its first step `first_step_s`
/// times, and the row reports them with the first step's profiled sections.
fn time_shape(
    trainer: &mut crate::train::Trainer,
    vocab: u32,
    (seq, bs): (usize, usize),
    steps: usize,
    mut startup: Option<Vec<(String, f64)>>,
) -> anyhow::Result<TrainRow> {
    let device = trainer.model.device().clone();
    let layers = trainer.model.layers.len();
    let batch = [crate::data::Batch::random(vocab, (seq, bs), (seq * 1000 + bs) as u64)];
    reset_peak(&device);
    let mut first_step_s = None;
    let mut recovered = Vec::new();
    for step in 0..2 {
        let note = |line| noted(&mut recovered, (seq, bs), line);
        trainer.step_recovering(step, &batch, note)?.context("no trained token: a shape needs seq ≥ 2")?;
        if let (Some(startup), 0) = (startup.as_mut(), step) {
            device.synchronize()?;
            first_step_s = PROCESS_START.get().map(|t| t.elapsed().as_secs_f64());
            let sections = crate::profile::take();
            startup.extend(sections.into_iter().map(|(name, s, _)| (format!("first step: {name}"), s)));
            #[cfg(feature = "cuda")]
            {
                let (loads, seconds) = crate::cuda::candle_modules::ptx_loads();
                startup.push(("PTX modules the driver compiled".into(), loads as f64));
                startup.push(("their loads, s".into(), seconds));
            }
        }
    }
    device.synchronize()?;
    crate::profile::take(); // the warm-up steps' sections
    if crate::profile::timeline::enabled() {
        crate::profile::timeline::take()?; // and marks
    }
    // timed again from the start where a timed step ran out of memory and ran again
    let (mut loss, mut elapsed) = (f64::NAN, None);
    for _ in 0..2 {
        let (before, started) = (recovered.len(), Instant::now());
        for step in 2..2 + steps {
            let note = |line| noted(&mut recovered, (seq, bs), line);
            loss = trainer.step_recovering(step, &batch, note)?.map_or(f64::NAN, |r| r.loss);
        }
        device.synchronize()?;
        if recovered.len() == before {
            elapsed = Some(started.elapsed());
            break;
        }
    }
    let elapsed = elapsed.context("out of GPU memory in the timed steps twice over")?;
    let step_s = elapsed.as_secs_f64() / steps as f64;
    let timeline = crate::profile::timeline::enabled().then(crate::profile::timeline::take).transpose()?;
    let tok_s = (seq * bs) as f64 / step_s;
    let sections = crate::profile::take();
    let profile = crate::profile::enabled()
        .then(|| sections.into_iter().map(|(name, s, _)| (name.to_string(), s / steps as f64)).collect());
    let pool = pool_memory(&device);
    // what the steps kept: the layers placed, not the plan's counts
    let kinds = trainer.model.kept_layers().kinds(layers, (seq, bs));
    let kept = kinds.iter().filter(|&&k| k != LayerKind::Recomputed).count();
    let lora_params = trainer.model.lora_params().iter().map(|(_, v)| v.elem_count()).sum();
    let flops = flops::per_token(trainer.model.config(), &trainer.model.arch, lora_params, seq, kept);
    Ok(TrainRow {
        seq,
        bs,
        step_s: Some(step_s),
        tok_s: Some(tok_s),
        peak_alloc_gib: pool.map(|p| p.peak_allocated as f64 / GIB),
        peak_reserved_gib: pool.map(|p| p.peak_reserved as f64 / GIB),
        loss: Some(loss),
        mfu: Some(tok_s * flops.model / flops::PEAK_FLOPS),
        hfu: Some(tok_s * flops.hardware / flops::PEAK_FLOPS),
        error: None,
        kept_layers: Some(kept),
        offloaded_layers: Some(kinds.iter().filter(|&&k| k == LayerKind::Offloaded).count()),
        complete_layers: Some(kinds.iter().filter(|&&k| k == LayerKind::KeptAll).count()),
        first_step_s,
        first_steps: None,
        profile,
        startup,
        card_gib: None,
        timeline,
        recovered,
    })
}

/// One row of `lora-ft bench attention`: causal attention alone, forward and backward, at one
/// shape (the same fields as scripts/bench/attention_ref.py prints for torch's SDPA).
#[derive(Debug, Serialize)]
pub struct AttentionRow {
    pub seq: usize,
    pub bs: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The implementation that ran: "cudnn", "flash" (LORA_FT_ATTENTION picks) or "composed".
    pub kernel: &'static str,
    pub fwd_ms: f64,
    pub bwd_ms: f64,
    /// Causal FLOPs (the visible half of the scores): forward 2 matmuls, backward 5, over the time.
    pub fwd_tflops: f64,
    pub bwd_tflops: f64,
}

/// Times `model::attention::attention` and its backward on random q, k, v of shape
/// `[bs, heads, seq, head_dim]` / `[bs, kv_heads, seq, head_dim]` (causal, no window): `iters`
/// calls each after one warm-up, synchronized before and after.
pub fn attention(
    device: &Device,
    dtype: DType,
    (seq, bs): (usize, usize),
    (heads, kv_heads, head_dim): (usize, usize, usize),
    iters: usize,
) -> anyhow::Result<AttentionRow> {
    use crate::model::ops::attention::{attention, attention_backward, ScoreRule};
    use candle_core::Tensor;
    anyhow::ensure!(
        kv_heads > 0 && heads % kv_heads == 0,
        "--heads ({heads}) must be a multiple of --kv-heads ({kv_heads})"
    );
    let rand = |h: usize| Tensor::randn(0f32, 1.0, (bs, h, seq, head_dim), device)?.to_dtype(dtype);
    let (q, k, v, d_context) = (rand(heads)?, rand(kv_heads)?, rand(kv_heads)?, rand(heads)?);
    let timed = |f: &dyn Fn() -> candle_core::Result<()>| -> anyhow::Result<f64> {
        f()?;
        device.synchronize()?;
        let started = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        device.synchronize()?;
        Ok(started.elapsed().as_secs_f64() / iters.max(1) as f64)
    };
    let rule = ScoreRule::causal(head_dim, None);
    let fwd_s = timed(&|| attention(&q, &k, &v, None, &rule).map(drop))?;
    let (_, saved) = attention(&q, &k, &v, None, &rule)?;
    let bwd_s = timed(&|| attention_backward(&q, &k, &v, None, &rule, &saved, &d_context).map(drop))?;
    let fwd_flops = 2.0 * (bs * heads * seq * seq * head_dim) as f64;
    Ok(AttentionRow {
        seq,
        bs,
        heads,
        kv_heads,
        head_dim,
        kernel: saved.kernel_name(),
        fwd_ms: fwd_s * 1e3,
        bwd_ms: bwd_s * 1e3,
        fwd_tflops: fwd_flops / fwd_s / 1e12,
        bwd_tflops: 2.5 * fwd_flops / bwd_s / 1e12,
    })
}
