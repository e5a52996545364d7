//! `lora-ft generate`: every prompt of a prompts file answered `n` times, prompts generated
//! together a batch at a time, each reply a JSON line with its tool calls parsed out, its finish
//! reason and its token counts. Sample k of the prompt on line L draws with its own seed (the
//! settings' seed, L and k), so a reply does not depend on the batch it was generated in.

use std::io::Write;

use minijinja::Value;
use serde::Serialize;

use super::{replies_detailed, GenerationSettings};
use crate::data::{parse_tool_calls, ChatTokenizer, Conversation, ToolCall};
use crate::model::ops::dropout_mask::mix;
use crate::model::CausalLm;

/// One reply, as a line of the output file.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    /// The prompt's line in the prompts file.
    pub line: usize,
    /// Which of the prompt's `n` samples this is, from 0.
    pub sample: usize,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    /// "stop" (a stop token or string) or "length" (`max_new_tokens` or the model's context).
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// The seed of sample `k` of the prompt on line `line`: SplitMix64 (the dropout mask's hash) of
/// the settings' seed, the line, then the sample.
pub fn sample_seed(seed: u64, line: usize, k: usize) -> u64 {
    mix(mix(seed, line as u64), k as u64)
}

/// What a completions run needs besides the prompts.
pub struct Completions<'a> {
    pub model: &'a CausalLm,
    pub tokenizer: &'a ChatTokenizer,
    /// Tools for the prompts whose rows carry none.
    pub tools: Option<&'a [Value]>,
    pub stop: &'a [u32],
    pub settings: &'a GenerationSettings,
    /// Replies per prompt.
    pub n: usize,
    /// Replies generated together.
    pub batch: usize,
}

impl Completions<'_> {
    /// Answers `prompts` in order (prompt by prompt, its samples together), handing each batch's
    /// completions to `done` as they are made.
    pub fn run(
        &self,
        prompts: &[Conversation],
        done: &mut dyn FnMut(&[Completion]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(self.n >= 1, "--n must be at least 1");
        anyhow::ensure!(self.batch >= 1, "--batch must be at least 1");
        let jobs: Vec<(&Conversation, usize)> =
            prompts.iter().flat_map(|c| (0..self.n).map(move |k| (c, k))).collect();
        for chunk in jobs.chunks(self.batch) {
            let conversations: Vec<_> = chunk
                .iter()
                .map(|(c, _)| (c.messages.as_slice(), c.tools.as_deref().or(self.tools)))
                .collect();
            let seeds: Vec<u64> =
                chunk.iter().map(|(c, k)| sample_seed(self.settings.seed, c.line, *k)).collect();
            let replies = replies_detailed(
                self.model,
                self.tokenizer,
                &conversations,
                (self.stop, Some(&seeds)),
                self.settings,
            )?;
            let rows: Vec<Completion> = chunk
                .iter()
                .zip(replies)
                .map(|((c, k), (text, prompt_tokens, g))| Completion {
                    line: c.line,
                    sample: *k,
                    tool_calls: parse_tool_calls(&text),
                    text,
                    finish_reason: g.finish.as_str(),
                    prompt_tokens,
                    completion_tokens: g.tokens.len(),
                })
                .collect();
            done(&rows)?;
        }
        Ok(())
    }
}

/// Writes completions as JSON lines.
pub fn write_jsonl(out: &mut impl Write, rows: &[Completion]) -> anyhow::Result<()> {
    for row in rows {
        serde_json::to_writer(&mut *out, row)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}
