//! `data.eval_prompts`: what the model answers as it trains. At the start (the untrained model:
//! the base, its LoRA B zero), at each evaluation (`train.eval_every`) and at the end, the model
//! answers every prompt greedily (the chat template with the prompt's tools and the generation
//! prompt, eval mode, a KV cache) and `<output.dir>/samples.jsonl` gets one line per prompt:
//! `{"step", "prompt", "question", "answer", "tool_calls"}`. Rank 0 generates; the others wait
//! at a barrier. A resumed run keeps the lines up to its checkpoint's step (the base answers among
//! them) and drops the later ones, which it writes again; at the end the first prompts' base and
//! tuned answers are printed side by side.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::metrics::MetricsLog;
use crate::config::Config;
use crate::data::{parse_tool_calls, read_prompts_jsonl, row_name, ChatTokenizer, Conversation, ToolCall};
use crate::distributed::Collective;
use crate::durable::Writing;
use crate::generate::{replies_with_tools, stop_ids, GenerationSettings};
use crate::model::CausalLm;

pub const SAMPLES_FILE: &str = "samples.jsonl";

/// How many prompts the end of the run prints, base beside tuned.
const SHOWN: usize = 3;

/// One line of samples.jsonl.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    /// The optimizer steps the model had taken (0: the base model).
    pub step: usize,
    /// The prompt's position in the prompts file, from 0.
    pub prompt: usize,
    /// The text of the prompt's last user message.
    pub question: String,
    /// The reply as generated (special tokens dropped, those that carry a tool call kept).
    pub answer: String,
    /// The calls parsed from `answer` (`data::parse_tool_calls`), `[]` where none.
    pub tool_calls: Vec<ToolCall>,
}

/// The prompts and what answering them takes; `None` in `prompts` on ranks other than 0.
pub(super) struct Samples {
    prompts: Option<(Vec<Conversation>, ChatTokenizer, Vec<u32>)>,
    settings: GenerationSettings,
    path: PathBuf,
}

impl Samples {
    /// `None` without `data.eval_prompts`. Rank 0 reads and renders every prompt (a bad one is an
    /// error naming file:line before training starts) and trims samples.jsonl to the lines of
    /// steps up to `start` (none for a run that starts at step 0).
    pub(super) fn open(
        cfg: &Config,
        model_dir: &Path,
        start: usize,
        rank: usize,
    ) -> anyhow::Result<Option<Self>> {
        let Some(file) = &cfg.data.eval_prompts else { return Ok(None) };
        let settings =
            GenerationSettings { max_new_tokens: cfg.data.eval_max_new_tokens, ..Default::default() };
        let path = cfg.output.dir.join(SAMPLES_FILE);
        if rank != 0 {
            return Ok(Some(Self { prompts: None, settings, path }));
        }
        let prompts = read_prompts_jsonl(file).context("data.eval_prompts")?;
        let tokenizer = ChatTokenizer::load(model_dir, cfg.model.chat_template.as_deref())?
            .with_system_message(cfg.data.system_message);
        for p in &prompts {
            let messages = tokenizer.prepare(&p.messages).with_context(|| row_name(file, p.line))?;
            tokenizer
                .template()
                .render_tools(&messages, p.tools.as_deref(), true)
                .with_context(|| format!("data.eval_prompts: {}", row_name(file, p.line)))?;
        }
        let stop = stop_ids(model_dir, &tokenizer);
        std::fs::create_dir_all(&cfg.output.dir)
            .with_context(|| format!("creating {}", cfg.output.dir.display()))?;
        let kept: Vec<SampleRecord> = match start {
            0 => Vec::new(),
            _ => read_samples(&path)?.into_iter().filter(|r| r.step <= start).collect(),
        };
        crate::durable::write_atomic(&path, to_jsonl(&kept)?.as_bytes())?;
        Ok(Some(Self { prompts: Some((prompts, tokenizer, stop)), settings, path }))
    }

    /// The model after `step` steps answers every prompt (rank 0), appended to samples.jsonl;
    /// every rank then waits for it.
    pub(super) fn answer(
        &self,
        model: &CausalLm,
        step: usize,
        c: &dyn Collective,
    ) -> anyhow::Result<Vec<SampleRecord>> {
        let mut records = Vec::new();
        if let Some((prompts, tokenizer, stop)) = &self.prompts {
            // every prompt answered together: a decoding step reads the weights once for all
            let prepared =
                prompts.iter().map(|p| tokenizer.prepare(&p.messages)).collect::<Result<Vec<_>, _>>()?;
            let asked: Vec<_> =
                prepared.iter().zip(prompts).map(|(m, p)| (&m[..], p.tools.as_deref())).collect();
            let answers = replies_with_tools(model, tokenizer, &asked, stop, &self.settings)
                .with_context(|| format!("answering data.eval_prompts at step {step}"))?;
            for (index, (messages, answer)) in prepared.iter().zip(answers).enumerate() {
                let question = messages.iter().rev().find(|m| m.role == "user").map(|m| m.content.clone());
                let tool_calls = parse_tool_calls(&answer);
                records.push(SampleRecord {
                    step,
                    prompt: index,
                    question: question.unwrap_or_default(),
                    answer,
                    tool_calls,
                });
            }
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&self.path)
                .with_context(|| format!("opening {}", self.path.display()))?;
            file.write_all(to_jsonl(&records)?.as_bytes())
                .and_then(|()| file.flush())
                .with_context(|| Writing(self.path.clone()))?;
        }
        c.barrier()?;
        Ok(records)
    }

    /// The first prompts' answers of the run's first step (the base model) beside `last`'s.
    pub(super) fn print_comparison(&self, last: &[SampleRecord], log: &MetricsLog) -> anyhow::Result<()> {
        if self.prompts.is_none() || last.is_empty() {
            return Ok(());
        }
        let all = read_samples(&self.path)?;
        let first_step = all.iter().map(|r| r.step).min().unwrap_or(0);
        let one_line = |text: &str| text.trim().replace('\n', "\\n");
        let mut out = format!(
            "{}: base (step {first_step}) and tuned (step {}) answers",
            self.path.display(),
            last[0].step
        );
        for tuned in last.iter().take(SHOWN) {
            let base = all.iter().find(|r| r.step == first_step && r.prompt == tuned.prompt);
            out.push_str(&format!(
                "\n[{}] question: {}\n    base:  {}\n    tuned: {}",
                tuned.prompt,
                one_line(&tuned.question),
                base.map_or("(none)".into(), |b| one_line(&b.answer)),
                one_line(&tuned.answer)
            ));
        }
        log.println(out);
        Ok(())
    }
}

/// The whole lines of a samples.jsonl (none where there is no file); a torn last line is skipped.
pub fn read_samples(path: &Path) -> anyhow::Result<Vec<SampleRecord>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

fn to_jsonl(records: &[SampleRecord]) -> anyhow::Result<String> {
    let mut out = String::new();
    for r in records {
        out.push_str(&serde_json::to_string(r)?);
        out.push('\n');
    }
    Ok(out)
}
