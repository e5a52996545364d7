//! `lora-ft eval`: the mean loss and perplexity of a model, with or without an adapter, over the
//! trained tokens of a dialogue file. Every row is rendered, masked and cut exactly as training
//! prepares it (`TokenizedDataset`'s rules: the chat template, assistant-only labels, truncation
//! to `max_seq_len` on `truncation_side`, a row left with no trained token dropped), and the mean
//! is weighted by tokens, as training's evaluation: Σ loss sums / Σ trained tokens. Dialogues with
//! `tools` are also answered turn by turn for tool-call accuracy (`tool_calls.rs`).

use std::path::Path;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::config::{DataFormat, SystemMessage, TruncationSide};
use crate::data::{read_conversations, row_name, ChatTokenizer, Example};
use crate::hub::ModelFiles;
use crate::model::CausalLm;
use crate::quant::Quantization;

mod tool_calls;
pub use tool_calls::{score_dialogue, ToolCallScore};

/// How the rows are read and cut, as the training config's `[data]` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalSettings {
    pub format: DataFormat,
    pub max_seq_len: usize,
    pub truncation_side: TruncationSide,
    /// `data.system_message`: a leading system message kept or folded, as training does.
    pub system_message: SystemMessage,
    /// Tool-call scoring with replies of at most this many tokens; `None` skips it.
    pub tool_call_tokens: Option<usize>,
}

/// One dialogue of the file as training would see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalRow {
    /// Position among the file's dialogues (blank lines not counted), from 0.
    pub index: usize,
    /// The file line it came from, from 1 (Parquet: the row, counted from 1).
    pub line: usize,
    /// Tokens before truncation.
    pub length: usize,
    pub truncated: bool,
    /// Ids and labels after truncation.
    pub example: Example,
}

impl EvalRow {
    /// Positions the loss scores (labels after the shift); 0 means training drops the row.
    pub fn trained_tokens(&self) -> usize {
        self.example.trained_tokens()
    }
}

/// One line of `--out`: the dialogue's mean loss over its trained tokens, or nulls for a dropped row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DialogueLoss {
    pub index: usize,
    pub line: usize,
    pub loss: Option<f64>,
    pub ppl: Option<f64>,
    pub tokens: usize,
    /// Tokens before truncation.
    pub length: usize,
    pub truncated: bool,
    pub dropped: bool,
    /// Dialogues with `tools`, when tool calls are scored.
    #[serde(flatten)]
    pub tool_calls: Option<ToolCallScore>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    pub dialogues: Vec<DialogueLoss>,
    /// Σ of every token's negative log-likelihood (f64).
    pub loss_sum: f64,
    pub tokens: usize,
}

impl EvalReport {
    /// Token-weighted mean loss over the whole file.
    pub fn mean_loss(&self) -> f64 {
        self.loss_sum / self.tokens.max(1) as f64
    }

    pub fn perplexity(&self) -> f64 {
        self.mean_loss().exp()
    }

    pub fn truncated(&self) -> usize {
        self.dialogues.iter().filter(|d| d.truncated && !d.dropped).count()
    }

    pub fn dropped(&self) -> usize {
        self.dialogues.iter().filter(|d| d.dropped).count()
    }

    /// What `lora-ft eval` prints: the numbers, then what truncation did.
    pub fn summary(&self, data: &Path, settings: &EvalSettings) -> String {
        let (n, dropped) = (self.dialogues.len(), self.dropped());
        let side = match settings.truncation_side {
            TruncationSide::Right => "right: the start kept",
            TruncationSide::Left => "left: the end kept",
        };
        format!(
            "{}: {n} dialogues ({} scored), {} trained tokens\nmean loss {:.6}, perplexity {:.4}\n\
             max_seq_len {} (truncation_side {side}), as training: {} dialogues cut (tokens past the cut not \
             scored), {dropped} dropped (no trained token left, not scored)\n",
            data.display(),
            n - dropped,
            self.tokens,
            self.mean_loss(),
            self.perplexity(),
            settings.max_seq_len,
            self.truncated(),
        ) + &self.tool_calls().map(|t| format!("{}\n", t.summary())).unwrap_or_default()
    }

    /// The file's tool-call counts (`None` where none were scored).
    pub fn tool_calls(&self) -> Option<ToolCallScore> {
        ToolCallScore::total(self.dialogues.iter().filter_map(|d| d.tool_calls.as_ref()))
    }

    /// One JSON object per dialogue, in file order.
    pub fn to_jsonl(&self) -> anyhow::Result<String> {
        let mut out = String::new();
        for d in &self.dialogues {
            out.push_str(&serde_json::to_string(d)?);
            out.push('\n');
        }
        Ok(out)
    }

    /// Writes `to_jsonl` to `path` whole (a temporary sibling, then renamed): an error leaves no
    /// partial file.
    pub fn write_jsonl(&self, path: &Path) -> anyhow::Result<()> {
        crate::durable::write_atomic(path, self.to_jsonl()?.as_bytes())
    }
}

/// Reads and tokenizes every dialogue of `path` (errors name `file:line`), cut as training cuts
/// them; `vocab_size`: the model's, every token id must be below it.
pub fn tokenize_file(
    path: &Path,
    tokenizer: &ChatTokenizer,
    settings: &EvalSettings,
    vocab_size: usize,
) -> anyhow::Result<Vec<EvalRow>> {
    let conversations = read_conversations(path, settings.format)?;
    let mut rows = Vec::with_capacity(conversations.len());
    for (index, conv) in conversations.iter().enumerate() {
        let at = || row_name(path, conv.line);
        let mut example =
            tokenizer.encode_with_tools(&conv.messages, conv.tools.as_deref()).with_context(at)?;
        let length = example.len();
        let truncated = example.truncate(settings.max_seq_len, settings.truncation_side);
        if let Some(&id) = example.input_ids.iter().find(|&&id| id as usize >= vocab_size) {
            anyhow::bail!(
                "{}: the tokenizer produced token id {id}, but the model's embedding table has {vocab_size} rows \
                 (tokenizer and model do not match)",
                at()
            );
        }
        rows.push(EvalRow { index, line: conv.line, length, truncated, example });
    }
    let cut = rows.iter().filter(|r| r.truncated && r.trained_tokens() > 0).count();
    let dropped: Vec<usize> = rows.iter().filter(|r| r.trained_tokens() == 0).map(|r| r.line).collect();
    if cut > 0 {
        tracing::warn!(
            "{}: {cut} dialogues are longer than max_seq_len {} and are cut as training cuts them",
            path.display(),
            settings.max_seq_len
        );
    }
    if !dropped.is_empty() {
        tracing::warn!(
            "{}: lines {dropped:?} have no trained token left after the cut and are not scored (training drops them)",
            path.display()
        );
    }
    Ok(rows)
}

/// Scores every row, one forward each (no padding: a row's loss is its own), in eval mode.
pub fn evaluate(model: &CausalLm, rows: &[EvalRow]) -> anyhow::Result<EvalReport> {
    let progress = progress_bar(rows.iter().map(EvalRow::trained_tokens).sum());
    let (mut loss_sum, mut tokens) = (0f64, 0usize);
    let mut dialogues = Vec::with_capacity(rows.len());
    for row in rows {
        let n = row.trained_tokens();
        let (loss, ppl) = if n == 0 {
            (None, None)
        } else {
            let ids = Tensor::new(row.example.input_ids.as_slice(), model.device())?.unsqueeze(0)?;
            let (sum, scored) = model
                .loss(&ids, &row.example.labels)
                .with_context(|| format!("dialogue {} (line {})", row.index, row.line))?;
            debug_assert_eq!(scored, n);
            loss_sum += sum;
            tokens += scored;
            let mean = sum / scored as f64;
            (Some(mean), Some(mean.exp()))
        };
        progress.inc(n as u64);
        dialogues.push(DialogueLoss {
            index: row.index,
            line: row.line,
            loss,
            ppl,
            tokens: n,
            length: row.length,
            truncated: row.truncated,
            dropped: n == 0,
            tool_calls: None,
        });
    }
    progress.finish_and_clear();
    anyhow::ensure!(tokens > 0, "no dialogue has a trained token left to score");
    Ok(EvalReport { dialogues, loss_sum, tokens })
}

fn progress_bar(tokens: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(tokens as u64);
    let style =
        indicatif::ProgressStyle::with_template("scoring {bar:30} {pos}/{len} tokens [{elapsed}<{eta}]");
    bar.set_style(style.unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    bar
}

/// What to evaluate and how to load it.
pub struct EvalModel<'a> {
    /// Hub repo id, HF folder or .gguf file.
    pub source: &'a str,
    pub revision: &'a str,
    /// A PEFT adapter folder.
    pub adapter: Option<&'a Path>,
    pub dtype: DType,
    pub quantization: Quantization,
    /// A Jinja file in place of the model's chat template.
    pub chat_template: Option<&'a Path>,
}

/// The model's files (the tokenizer among them), resolved without loading any weight.
pub fn resolve(m: &EvalModel) -> anyhow::Result<ModelFiles> {
    crate::hub::resolve(m.source, m.revision)
}

/// The base model from `files` on `device`, as training stores it, and the adapter if any.
pub fn load_model(m: &EvalModel, files: &ModelFiles, device: &Device) -> anyhow::Result<CausalLm> {
    tracing::info!("loading {} ({:?} on {device:?}, {:?})", files.dir.display(), m.dtype, m.quantization);
    let mut model = CausalLm::load(&files.config, &files.weights, m.dtype, m.quantization, device)?;
    if let Some(adapter) = m.adapter {
        let spec = crate::peft_adapter::load_adapter(&mut model, adapter)
            .with_context(|| format!("loading adapter {}", adapter.display()))?;
        tracing::info!(
            "adapter {}: r {}, scale {}, {:?}",
            adapter.display(),
            spec.r,
            spec.scale(),
            spec.target_modules
        );
    }
    Ok(model)
}

/// The whole command: tokenize first (a bad file fails before any weight is read), load, score.
pub fn run(
    m: &EvalModel,
    data: &Path,
    settings: &EvalSettings,
    device: &Device,
) -> anyhow::Result<EvalReport> {
    let files = resolve(m)?;
    let config = crate::arch::ModelConfig::from_file(&files.config)?;
    let tokenizer =
        ChatTokenizer::load(&files.dir, m.chat_template)?.with_system_message(settings.system_message);
    let rows = tokenize_file(data, &tokenizer, settings, config.vocab_size)?;
    let model = load_model(m, &files, device)?;
    let mut report = evaluate(&model, &rows)?;
    if let Some(max_new_tokens) = settings.tool_call_tokens {
        let stop = crate::generate::stop_ids(&files.dir, &tokenizer);
        let conversations = read_conversations(data, settings.format)?;
        let with_tools = conversations.iter().filter(|c| c.tools.is_some()).count();
        if with_tools > 0 {
            tracing::info!("tool calls: answering the assistant turns of {with_tools} dialogues with tools");
        }
        for (d, conv) in report.dialogues.iter_mut().zip(&conversations) {
            d.tool_calls = score_dialogue(&model, &tokenizer, conv, &stop, max_new_tokens)
                .with_context(|| row_name(data, conv.line))?;
        }
    }
    Ok(report)
}
