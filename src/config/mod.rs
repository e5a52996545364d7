//! The TOML schema of a training run. Every section rejects unknown keys, and every error names
//! the file and the key path (`train.lr`), so a typo never silently falls back to a default.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quant::Quantization;

mod batch_size;
mod data_format;
mod lora;
mod optim;
pub mod reference;
pub use batch_size::BatchSize;
pub use data_format::DataFormat;
pub use lora::{LoraSpec, ALL_TARGET_MODULES};
pub use optim::{AdafactorFlavor, AdafactorSection, AdamwSection, OptimName, OptimSection};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // not a `source`: the message already holds it, and `{:#}` would say it twice
    #[error("{file}: cannot read: {error}")]
    Read { file: PathBuf, error: std::io::Error },
    #[error("{file}: {key}: {message}")]
    Invalid { file: PathBuf, key: String, message: String },
}

/// A training run's config file: `lora-ft train CONFIG`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The base model and how its frozen weights are stored.
    pub model: ModelSection,
    /// The LoRA adapters: rank, scale, dropout and which projections they adapt.
    #[serde(default)]
    pub lora: LoraSpec,
    /// The training data: files, format, sequence length, packing.
    pub data: DataSection,
    /// The training loop: batch, steps, schedule, precision, device and memory policy.
    #[serde(default)]
    pub train: TrainSection,
    /// The optimizer and its settings.
    #[serde(default)]
    pub optim: OptimSection,
    /// Checkpoints: how often, how many, and resuming.
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Where the run and the adapter are written.
    #[serde(default)]
    pub output: OutputSection,
}

/// Where the base model comes from: a Hub repo id, a local HF folder, or a `.gguf` file.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A Hub repo id (`mistralai/Mistral-7B-v0.1`; `HF_TOKEN` and `HF_HOME` are
    /// honoured, a cached model works offline), a local HF folder, or a `.gguf` file (imported
    /// once into the cache). `${LORA_FT_CACHE}` and a leading `~/` are expanded.
    pub source: String,
    /// The Hub revision (branch, tag or commit) of a repo id.
    #[serde(default = "default_revision")]
    pub revision: String,
    /// Storage of the frozen projection weights: 4-bit NF4 in bitsandbytes' format (QLoRA), or
    /// dense in the compute dtype.
    #[serde(default)]
    pub quantization: QuantizationKind,
    /// Quantize NF4's absmax values to 8-bit codes (bitsandbytes' `bnb_4bit_use_double_quant`,
    /// its `compress_statistics`).
    #[serde(default = "default_double_quant")]
    pub double_quant: bool,
    /// A Jinja file in place of the model's chat template (its special tokens stay the model's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QuantizationKind {
    /// 4-bit NormalFloat with a 16-bit absmax per block of 64, byte for byte bitsandbytes'.
    #[default]
    Nf4,
    /// Dense weights in `train.compute_dtype`.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TruncationSide {
    /// Keep the start of the conversation (drop the tail).
    Right,
    /// Keep the end of the conversation (drop the head).
    Left,
}

/// What to do with a conversation's leading system message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SystemMessage {
    /// Give it to the chat template as it is (a template without a system role refuses the row).
    #[default]
    Keep,
    /// Fold its text into the first user turn as "{system}\n\n{user}" (for Gemma 2, Mistral v0.1).
    Fold,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// The training file: JSON Lines, or Parquet when it ends in `.parquet`.
    pub train: PathBuf,
    /// The evaluation file, read like `train`; without it the run has no eval loss.
    #[serde(default)]
    pub eval: Option<PathBuf>,
    /// How a row reads as a conversation.
    #[serde(default = "default_format")]
    pub format: DataFormat,
    /// The longest row in tokens; longer conversations are cut at `truncation_side`.
    #[serde(default = "default_max_seq_len")]
    pub max_seq_len: usize,
    /// Which end of a conversation longer than `max_seq_len` is kept.
    #[serde(default = "default_truncation")]
    pub truncation_side: TruncationSide,
    /// What to do with a conversation's leading system message (Gemma 2's template refuses a
    /// system role: `"fold"`).
    #[serde(default)]
    pub system_message: SystemMessage,
    /// Whole dialogues packed into rows of `max_seq_len` (best-fit decreasing), each attending
    /// only to itself, with its own positions.
    #[serde(default)]
    pub packing: bool,
    /// Without packing: each epoch's shuffled rows sorted by length within windows of 50
    /// batches (less padding).
    #[serde(default)]
    pub group_by_length: bool,
    /// Each batch padded to a length that is a multiple of this (at most `max_seq_len`), and each
    /// rank's shard cut at one: fewer shapes, so fewer of cuDNN's attention graphs to build and
    /// fewer memory plans. 1: padded to the longest row only.
    #[serde(default = "default_pad_to_multiple_of")]
    pub pad_to_multiple_of: usize,
    /// Prompts (JSONL of `{"messages", "tools"?}` ending in a user turn) the model answers at the
    /// start, at each evaluation and at the end, into `<output.dir>/samples.jsonl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_prompts: Option<PathBuf>,
    /// The most tokens generated for each of `eval_prompts`.
    #[serde(default = "default_eval_max_new_tokens")]
    pub eval_max_new_tokens: usize,
}

/// The learning rate after a linear warmup, as transformers' schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Half a cosine from `lr` down to 0 at the last step.
    Cosine,
    /// A straight line from `lr` down to 0 at the last step.
    Linear,
    /// `lr` throughout.
    Constant,
}

/// The dtype activations and the unquantized weights compute in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ComputeDtype {
    /// The CPU's dtype.
    F32,
    /// With dynamic loss scaling.
    F16,
    /// For models whose activations overflow f16 (Gemma).
    Bf16,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
// `default` lets a section name only the keys it changes; unknown keys are still errors.
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Rows per micro-batch, or "auto": the largest that fits, probed on the GPU before training.
    pub batch_size: BatchSize,
    /// Micro-batches per optimizer step; the loss is normalized over all their trained tokens.
    pub grad_accum: usize,
    /// Passes over the training set; ignored when `max_steps` is set.
    pub epochs: f64,
    /// Optimizer steps; overrides `epochs` when present.
    pub max_steps: Option<usize>,
    /// The peak learning rate.
    pub lr: f64,
    /// The learning rate's shape over the run.
    pub schedule: Schedule,
    /// Optimizer steps of linear warmup from 0 to `lr`.
    pub warmup_steps: usize,
    /// Decoupled weight decay (`p *= 1 - lr·wd`) for every optimizer, as TrainingArguments'.
    pub weight_decay: f64,
    /// Global-norm gradient clipping; 0 turns it off.
    pub max_grad_norm: f64,
    /// Seeds the LoRA initialization, the shuffling and dropout.
    pub seed: u64,
    /// The dtype the step computes in.
    pub compute_dtype: ComputeDtype,
    /// `auto` (the first GPU when built with CUDA and one is present, else the CPU), `cpu`,
    /// `cuda` or `cuda:N`; `lora-ft train --device` overrides it.
    pub device: String,
    /// Share of the GPU's memory the run may use, as PyTorch's per-process memory fraction:
    /// omitted, 0.90 on cards up to 32 GiB and 0.92 above (the rest is the reserve for the CUDA
    /// context, cuBLAS workspaces and pool fragmentation). A step whose peak goes over it stops
    /// the run with the numbers and what to lower. Ignored on the CPU.
    pub max_vram_fraction: Option<f64>,
    /// Plan for a card of this many GiB instead of the one present (e.g. 24 on an 80 GB card, to
    /// see what a smaller card's users get): the budget is `max_vram_fraction` of the smaller.
    /// `lora-ft train --gpu-mem` overrides it.
    pub gpu_mem: Option<f64>,
    /// What a step keeps for its backward. `"auto"`: on a GPU, every activation of as many of
    /// the last layers as the memory budget holds (the planner picks the count per step shape),
    /// and only the input of the others, which the backward recomputes; `"full"` recomputes
    /// every layer (the least memory); `"none"` recomputes none. The gradients are the same.
    pub checkpointing: Checkpointing,
    /// On a GPU, the checkpoints, an untied lm_head and (with `checkpointing = "auto"`) the
    /// activations of layers the GPU has no room to keep wait in page-locked host memory during a
    /// step, copied on a second stream while the GPU computes. `false` keeps everything on the
    /// GPU.
    pub host_offload: bool,
    /// The gated MLP runs in row tiles (of at most 64M `[rows, intermediate]` values) once a
    /// step has more rows than one holds: gate, up, act and their gradients for one tile at a
    /// time instead of every row's. `false` runs each layer's MLP over all rows at once.
    pub mlp_tiles: bool,
    /// Evaluate every N optimizer steps (0: only at the end).
    pub eval_every: usize,
    /// Cap on eval batches per evaluation (0: the whole eval set).
    pub eval_batches: usize,
    /// Log (and write to metrics.jsonl) every N optimizer steps.
    pub log_every: usize,
    /// Where else the metrics go besides metrics.jsonl: `["tensorboard"]` writes TensorBoard
    /// event files into `<output.dir>/tb/`.
    pub report_to: Vec<ReportTo>,
}

/// `train.report_to`: a tracker that gets the run's metrics besides metrics.jsonl.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReportTo {
    /// Event files in `<output.dir>/tb/` (`tensorboard --logdir <output.dir>/tb`).
    Tensorboard,
}

/// `train.checkpointing`: what a step keeps for its backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Checkpointing {
    /// The planner keeps as many layers' activations as the memory budget holds.
    Auto,
    /// Every layer recomputes (the least memory).
    Full,
    /// No layer recomputes.
    None,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
// `default` lets a section name only the keys it changes; unknown keys are still errors.
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// Save a checkpoint every N optimizer steps (0: only at the end).
    pub every: usize,
    /// Keep only the newest N checkpoints (0: keep all).
    pub keep_last: usize,
    /// "auto": continue from the newest complete checkpoint in `output.dir` (a partial or corrupt
    /// one is skipped with a warning); "never": start from step 0.
    pub resume: ResumeMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResumeMode {
    /// Continue from the newest complete checkpoint in `output.dir`.
    #[default]
    Auto,
    /// Start from step 0.
    Never,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
// `default` lets a section name only the keys it changes; unknown keys are still errors.
#[serde(deny_unknown_fields, default)]
pub struct OutputSection {
    /// Run directory: checkpoints/, metrics.jsonl, metrics.png, samples.jsonl, tb/.
    pub dir: PathBuf,
    /// Adapter name: the adapter is written to `<adapters_dir>/<adapter_name>/`.
    pub adapter_name: String,
    /// The folder the finished adapter is written into, in PEFT's format.
    pub adapters_dir: PathBuf,
}

fn default_revision() -> String {
    "main".into()
}
fn default_double_quant() -> bool {
    true
}
fn default_format() -> DataFormat {
    DataFormat::Messages
}
fn default_max_seq_len() -> usize {
    1024
}
fn default_pad_to_multiple_of() -> usize {
    64
}
fn default_eval_max_new_tokens() -> usize {
    128
}
fn default_truncation() -> TruncationSide {
    TruncationSide::Right
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            batch_size: BatchSize::Fixed(4),
            grad_accum: 1,
            epochs: 1.0,
            max_steps: None,
            lr: 2e-4,
            schedule: Schedule::Cosine,
            warmup_steps: 0,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            seed: 42,
            compute_dtype: ComputeDtype::F16,
            device: "auto".into(),
            max_vram_fraction: None,
            gpu_mem: None,
            checkpointing: Checkpointing::Auto,
            host_offload: true,
            mlp_tiles: true,
            eval_every: 0,
            eval_batches: 0,
            log_every: 1,
            report_to: Vec::new(),
        }
    }
}

impl Default for CheckpointSection {
    fn default() -> Self {
        Self { every: 0, keep_last: 2, resume: ResumeMode::Auto }
    }
}

impl Default for OutputSection {
    fn default() -> Self {
        Self { dir: "runs/default".into(), adapter_name: "default".into(), adapters_dir: "adapters".into() }
    }
}

impl ModelSection {
    /// How `CausalLm::load` stores the projection weights.
    pub fn quantization(&self) -> Quantization {
        match self.quantization {
            QuantizationKind::Nf4 => Quantization::Nf4 { double_quant: self.double_quant },
            QuantizationKind::None => Quantization::None,
        }
    }

    /// `source` with `${LORA_FT_CACHE}` (default `~/.cache/lora-ft`) and a leading `~/`
    /// expanded, so shipped configs can point at the demo model wherever the cache is.
    pub fn expanded_source(&self) -> String {
        let cache = crate::cache::dir().display().to_string();
        let s = self.source.replace("${LORA_FT_CACHE}", &cache);
        match (s.strip_prefix("~/"), std::env::var_os("HOME")) {
            (Some(rest), Some(home)) => format!("{}/{rest}", home.to_string_lossy()),
            _ => s,
        }
    }
}

impl Config {
    /// Reads and validates a config file. Relative data paths stay relative to the working
    /// directory (as users type them on the command line).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| ConfigError::Read { file: path.to_path_buf(), error })?;
        Self::from_toml(&text, path)
    }

    pub fn from_toml(text: &str, file: &Path) -> Result<Self, ConfigError> {
        let de = toml::Deserializer::new(text);
        let cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let message = e.into_inner().message().trim().to_string();
            ConfigError::Invalid { file: file.to_path_buf(), key, message }
        })?;
        cfg.validate().map_err(|(key, message)| ConfigError::Invalid {
            file: file.to_path_buf(),
            key: key.to_string(),
            message,
        })?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        let l = &self.lora;
        check(l.r > 0, "lora.r", "must be at least 1")?;
        check(l.alpha > 0.0, "lora.alpha", "must be positive")?;
        check((0.0..1.0).contains(&l.dropout), "lora.dropout", "must be in [0, 1)")?;
        check(!l.target_modules.is_empty(), "lora.target_modules", "must name at least one module")?;
        let device = self.train.device.as_str();
        let cuda_n = device.strip_prefix("cuda:").is_some_and(|n| n.parse::<usize>().is_ok());
        check(
            matches!(device, "auto" | "cpu" | "cuda") || cuda_n,
            "train.device",
            "must be auto, cpu, cuda or cuda:N",
        )?;
        if let Some(f) = self.train.max_vram_fraction {
            check(f > 0.0 && f <= 1.0, "train.max_vram_fraction", "must be in (0, 1]")?;
        }
        if let Some(g) = self.train.gpu_mem {
            check(g > 0.0 && g < 1e6, "train.gpu_mem", "must be a positive size in GiB, e.g. 24")?;
        }
        for m in &l.target_modules {
            if !ALL_TARGET_MODULES.contains(&m.as_str()) {
                return Err((
                    "lora.target_modules",
                    format!("unknown module {m:?}; expected some of {ALL_TARGET_MODULES:?}"),
                ));
            }
        }
        check(self.data.max_seq_len >= 2, "data.max_seq_len", "must be at least 2")?;
        check(self.data.eval_max_new_tokens > 0, "data.eval_max_new_tokens", "must be at least 1")?;
        check(
            self.data.pad_to_multiple_of > 0,
            "data.pad_to_multiple_of",
            "must be at least 1 (1: no rounding)",
        )?;
        let both = self.data.packing && self.data.group_by_length;
        check(!both, "data.group_by_length", "sorts nothing with data.packing = true")?;
        let t = &self.train;
        check(t.batch_size != BatchSize::Fixed(0), "train.batch_size", "must be at least 1")?;
        check(t.grad_accum > 0, "train.grad_accum", "must be at least 1")?;
        check(t.lr > 0.0 && t.lr.is_finite(), "train.lr", "must be a positive number")?;
        check(t.max_steps != Some(0), "train.max_steps", "must be at least 1")?;
        check(t.epochs > 0.0 || t.max_steps.is_some(), "train.epochs", "must be positive")?;
        check(t.weight_decay >= 0.0, "train.weight_decay", "must be >= 0")?;
        check(t.max_grad_norm >= 0.0, "train.max_grad_norm", "must be >= 0 (0 turns clipping off)")?;
        check(t.log_every > 0, "train.log_every", "must be at least 1")?;
        self.optim.validate()?;
        check(!self.output.adapter_name.is_empty(), "output.adapter_name", "must not be empty")?;
        Ok(())
    }
}

fn check(ok: bool, key: &'static str, message: &str) -> Result<(), (&'static str, String)> {
    if ok {
        Ok(())
    } else {
        Err((key, message.to_string()))
    }
}

#[cfg(test)]
mod tests;
