//! `lora-ft init MODEL`: a commented training config for one model on one card, with the batch
//! size and max_seq_len the planner fits into the card's budget (`largest_batch`, what
//! `lora-ft estimate` lists and `batch_size = "auto"` starts from).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::run::Run;
use super::{estimate, RunShape};
use crate::arch::{Architecture, ModelConfig};
use crate::config::Config;
use crate::memory::{VramBudget, GIB};

/// Rows per optimizer step (batch × grad_accum), as the ready configs train.
pub const ROWS_PER_STEP: usize = 16;
/// The shapes tried, best first: the longest sequence with at least 4 rows a micro-batch, then
/// fewer rows (accumulation makes up the step).
const SEQ_LENS: [usize; 4] = [4096, 2048, 1024, 512];
const MIN_ROWS: usize = 4;
/// The share of the budget a chosen shape may be predicted to use: the planner's few percent of
/// error (and data it cannot see) must not stop a ready run at its first long batch.
const HEADROOM: f64 = 0.95;
/// Cards named when one is too small (GiB).
const CARDS: [u64; 9] = [8, 12, 16, 24, 32, 40, 48, 80, 141];

/// What `init` is asked for.
pub struct InitRequest<'a> {
    /// `[model] source` as given: a Hub repo id, a folder or a .gguf file.
    pub source: &'a str,
    pub revision: &'a str,
    pub model: &'a ModelConfig,
    /// The model's chat template, where one is at hand (a template that refuses a system role
    /// makes the config fold it into the first user turn).
    pub chat_template: Option<&'a str>,
    /// The card's memory in bytes.
    pub gpu_mem: u64,
    pub data: &'a DataFiles,
    /// The run's name: output.dir = runs/NAME, the adapter NAME-<data name>.
    pub name: &'a str,
    /// The command that wrote the config, for its header, and where it goes.
    pub command: &'a str,
    pub out: &'a Path,
}

/// The training (and evaluation) files of `--data`.
#[derive(Debug, Clone, PartialEq)]
pub struct DataFiles {
    pub train: PathBuf,
    pub eval: Option<PathBuf>,
    /// The data set's name (its folder's, or the file's stem), in the adapter's name.
    pub name: String,
}

impl DataFiles {
    /// A folder holding train.jsonl (and eval.jsonl, when there), or one training file.
    pub fn of(path: &Path) -> anyhow::Result<Self> {
        let name = |p: &Path| p.file_stem().map_or("data".into(), |s| s.to_string_lossy().into_owned());
        if path.is_dir() {
            let train = path.join("train.jsonl");
            if !train.is_file() {
                bail!(
                    "--data {}: a folder needs a train.jsonl (or give the training file itself)",
                    path.display()
                );
            }
            let eval = Some(path.join("eval.jsonl")).filter(|e| e.is_file());
            return Ok(Self { train, eval, name: name(path) });
        }
        if !path.is_file() {
            bail!("--data {}: no such file or folder", path.display());
        }
        Ok(Self { train: path.to_path_buf(), eval: None, name: name(path) })
    }
}

/// The config `init` writes and the shape in it.
#[derive(Debug, Clone)]
pub struct Written {
    pub toml: String,
    pub seq: usize,
    pub batch: usize,
    pub grad_accum: usize,
    pub peak: u64,
    pub budget: u64,
}

/// The config for `req`: the best shape that fits the card's default budget, or an error naming
/// the smallest card that takes batch 1 × 512.
pub fn write_config(req: &InitRequest) -> anyhow::Result<Written> {
    let arch = Architecture::from_config(req.model).context("lora-ft init")?;
    let budget = VramBudget::new(req.gpu_mem, None);
    let usable = (budget.bytes() as f64 * HEADROOM) as u64;
    // the run of the config written for one shape
    let run = |seq, batch, accum| -> anyhow::Result<Run> {
        let toml = render(req, &arch, (seq, batch, accum), None);
        let cfg = Config::from_toml(&toml, Path::new("lora-ft init")).context("the config init writes")?;
        Ok(Run::resolve(&cfg, req.model.clone(), Some(budget)))
    };
    // rows that fit a micro-batch at each length: all 16 at once, else a power of two with the
    // f32 gradient sums of accumulation held too
    let mut fits = Vec::new();
    // no longer than the model's positions (a toy model's may be fewer than 512)
    let max_pos = req.model.max_position_embeddings;
    let mut lengths: Vec<usize> = SEQ_LENS.into_iter().filter(|&s| s <= max_pos).collect();
    if lengths.is_empty() {
        lengths.push(max_pos);
    }
    let shortest = lengths[lengths.len() - 1];
    for &seq in &lengths {
        let rows = if run(seq, ROWS_PER_STEP, 1)?.largest_batch(usable) >= ROWS_PER_STEP {
            ROWS_PER_STEP
        } else {
            let b = run(seq, 1, 2)?.largest_batch(usable).min(ROWS_PER_STEP / 2);
            if b == 0 {
                0
            } else {
                1 << b.ilog2()
            }
        };
        fits.push((seq, rows));
    }
    let chosen = fits
        .iter()
        .find(|&&(_, rows)| rows >= MIN_ROWS)
        .or_else(|| fits.iter().find(|&&(_, rows)| rows > 0))
        .copied();
    let Some((seq, batch)) = chosen else {
        // batch 1 accumulates the step's 16 rows
        return Err(too_small(req, &run(shortest, 1, ROWS_PER_STEP)?, (budget, usable)));
    };
    let accum = ROWS_PER_STEP / batch;
    let run = run(seq, batch, accum)?;
    let peak = estimate(req.model, &run.run_shape, (seq, batch)).peak();
    // soft-capped attention scores: also the composed path's peak (builds before cuDNN took caps)
    let composed = RunShape { fused_attention: false, ..run.run_shape };
    let composed = arch.attention_softcap.map(|_| estimate(req.model, &composed, (seq, batch)).peak());
    let toml = render(req, &arch, (seq, batch, accum), Some((peak, composed, budget)));
    Config::from_toml(&toml, Path::new("lora-ft init")).context("the config init writes")?;
    Ok(Written { toml, seq, batch, grad_accum: accum, peak, budget: budget.bytes() })
}

/// Not even batch 1 × the shortest length (`run`'s) fits: the smallest card of `CARDS` whose
/// default budget takes it.
fn too_small(req: &InitRequest, run: &Run, (budget, usable): (VramBudget, u64)) -> anyhow::Error {
    let seq = run.max_seq_len;
    let peak = estimate(req.model, &run.run_shape, (seq, 1)).peak();
    let fits = |c: u64| VramBudget::new(c << 30, None).bytes() as f64 * HEADROOM >= peak as f64;
    let card = CARDS.iter().find(|&&c| fits(c));
    let smallest = match card {
        Some(c) => format!("the smallest card that takes it has {c} GiB (--gpu-mem {c}GiB)"),
        None => "no single card of up to 141 GiB takes it".into(),
    };
    anyhow::anyhow!(
        "{} needs {:.2} GiB of GPU memory at batch 1 x {seq} tokens (predicted), over the {:.2} GiB init leaves \
         itself of the budget ({HEADROOM} of {:.2} of a {:.0} GiB card); {smallest}",
        req.source,
        peak as f64 / GIB,
        usable as f64 / GIB,
        budget.fraction,
        req.gpu_mem as f64 / GIB,
    )
}

/// The display name of a source: its last path component, without `.gguf`.
pub fn model_name(source: &str) -> &str {
    let last = source.trim_end_matches('/').rsplit('/').next().unwrap_or(source);
    last.strip_suffix(".gguf").unwrap_or(last)
}

/// The TOML text for one shape (`(seq, batch, grad_accum)`), headed by the prediction once known.
fn render(
    req: &InitRequest,
    arch: &Architecture,
    (seq, batch, accum): (usize, usize, usize),
    prediction: Option<(u64, Option<u64>, VramBudget)>,
) -> String {
    let training = &arch.declaration().training;
    let card = req.gpu_mem as f64 / GIB;
    let mut out = format!(
        "# {} on one {card:.0} GB GPU. Build with `cargo build --release --features cuda`.\n\
         #   lora-ft train {}\n\
         # Written by `{}`\n\
         # ({}, {:.2}e9 parameters, {}).\n",
        model_name(req.source),
        req.out.display(),
        req.command,
        arch.family,
        req.model.parameter_count() as f64 / 1e9,
        training.compute_dtype,
    );
    if let Some((peak, composed, budget)) = prediction {
        out += &format!(
            "# Peak GPU memory {:.2} GiB predicted (`lora-ft estimate`, {batch} x {seq}, dropout 0.05{}),\n\
             # within {HEADROOM} of the budget of {:.2} GiB (train.max_vram_fraction's default, {:.2} of the card).\n",
            peak as f64 / GIB,
            if accum > 1 { ", with grad_accum's kept gradients" } else { "" },
            budget.bytes() as f64 / GIB,
            budget.fraction,
        );
        out += "# That is with every layer recomputed (train.checkpointing = \"full\"); with \"auto\", the\n\
                # default, the steps keep the last layers' activations as far as the budget holds, for\n\
                # speed: the peak then nears the budget (`lora-ft estimate` prints the layers kept).\n";
        if let Some(composed) = composed {
            out += &format!(
                "# With the soft-capped attention scores on the composed path instead of cuDNN: {:.2} GiB{}.\n",
                composed as f64 / GIB,
                if composed > budget.bytes() { ", over the budget" } else { "" }
            );
        }
    }
    let toml_str = |s: &str| toml::Value::String(s.to_string()).to_string();
    let path = |p: &Path| toml_str(&p.display().to_string());
    out += &format!("[model]\nsource = {}    # a Hub repo id, a local HF folder or a .gguf file; HF_TOKEN / HF_HOME are honoured\n", toml_str(req.source));
    out += &format!("revision = {}\n\n", toml_str(req.revision));
    out += "[lora]\nr = 16\nalpha = 32\ndropout = 0.05\n\
            target_modules = [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]\n\n";
    out += &format!(
        "[data]   # rendered with the model's own chat template (tokenizer_config.json)\ntrain = {}\n",
        path(&req.data.train)
    );
    match &req.data.eval {
        Some(eval) => out += &format!("eval = {}\n", path(eval)),
        None => out += "# eval = \"eval.jsonl\"   # held-out dialogues, scored every eval_every steps\n",
    }
    out += &format!(
        "max_seq_len = {seq}   # with batch_size, what the planner fits on this card\n\
         pad_to_multiple_of = 64   # each batch padded to its longest row rounded up to this: few shapes, few cuDNN graphs to build\n\
         truncation_side = \"right\"\n"
    );
    if refuses_system(arch, req.chat_template) {
        out += "system_message = \"fold\"   # the chat template refuses a system role: its text goes before the first user turn\n";
    }
    out += &format!("\n[train]\nbatch_size = {batch}\ngrad_accum = {accum}   # {ROWS_PER_STEP} rows per optimizer step\nepochs = 2\nlr = 2e-4\nschedule = \"cosine\"\nwarmup_steps = 10\nmax_grad_norm = 1.0\nseed = 42\n");
    out += &format!("compute_dtype = \"{}\"", training.compute_dtype);
    out += &training.compute_dtype_reason.map(|why| format!("   # {why}")).unwrap_or_default();
    out += "\n";
    out += "eval_every = 50\n\n[optim]\nflavor = \"hf\"   # absolute lr; \"torch\" scales each step by the parameter RMS (see README)\n\n\
            [checkpoint]\nevery = 50\nkeep_last = 3\n\n";
    out += &format!(
        "[output]\ndir = {}\nadapter_name = {}\n",
        toml_str(&format!("runs/{}", req.name)),
        toml_str(&format!("{}-{}", req.name, req.data.name))
    );
    out
}

/// Whether the config folds the system message: the family's template refuses one (its
/// declaration says so), or the template says so itself.
fn refuses_system(arch: &Architecture, template: Option<&str>) -> bool {
    arch.declaration().training.folds_system_message
        || template.is_some_and(|t| t.contains("System role not supported"))
}

#[cfg(test)]
#[path = "init_tests.rs"]
mod tests;
