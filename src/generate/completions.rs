//! `lora-ft generate`: every prompt of a prompts file (`prompts.rs`: chat or text) answered `n`
//! times, prompts generated together a batch at a time, each reply a JSON line with its finish
//! reason and its token counts, and a chat prompt's with its tool calls parsed out. Sample k of the prompt on line L draws with its own seed (the
//! settings' seed, L and k), so a reply does not depend on the batch it was generated in.

use std::io::Write;

use anyhow::Context;
use minijinja::Value;
use serde::Serialize;

use super::prompts::Prompt;
use super::{chat_prompt_ids, replies_to_ids, text_prompt_ids, GenerationSettings};
use crate::data::{parse_tool_calls, ChatTokenizer, ToolCall};
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
    /// The calls a chat prompt's reply makes; absent for a text prompt (its completion is text,
    /// no tool calls are parsed out of it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
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
        prompts: &[Prompt],
        done: &mut dyn FnMut(&[Completion]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(self.n >= 1, "--n must be at least 1");
        anyhow::ensure!(self.batch >= 1, "--batch must be at least 1");
        let jobs: Vec<(&Prompt, usize)> =
            prompts.iter().flat_map(|p| (0..self.n).map(move |k| (p, k))).collect();
        for chunk in jobs.chunks(self.batch) {
            let ids = chunk.iter().map(|(p, _)| self.prompt_ids(p)).collect::<anyhow::Result<Vec<_>>>()?;
            let seeds: Vec<u64> =
                chunk.iter().map(|(p, k)| sample_seed(self.settings.seed, p.line(), *k)).collect();
            let replies = replies_to_ids(
                self.model,
                self.tokenizer.tokenizer(),
                &ids,
                (self.stop, Some(&seeds)),
                self.settings,
            )?;
            let rows: Vec<Completion> = chunk
                .iter()
                .zip(replies)
                .map(|((p, k), (text, prompt_tokens, g))| Completion {
                    line: p.line(),
                    sample: *k,
                    tool_calls: matches!(p, Prompt::Chat(_)).then(|| parse_tool_calls(&text)),
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

    /// A prompt's ids: a chat prompt rendered with the template (its row's tools, else the
    /// run's), a text prompt as it is; an error names the prompt's line.
    pub fn prompt_ids(&self, prompt: &Prompt) -> anyhow::Result<Vec<u32>> {
        match prompt {
            Prompt::Chat(c) => {
                chat_prompt_ids(self.tokenizer, &c.messages, c.tools.as_deref().or(self.tools))
                    .with_context(|| format!("the prompt on line {}", c.line))
            }
            Prompt::Text { text, line } => text_prompt_ids(self.tokenizer.tokenizer(), text)
                .map_err(|e| anyhow::anyhow!("the prompt on line {line}: {e}")),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Conversation, Message};
    use crate::generate::{decode_reply, generate_detailed};
    use crate::quant::Quantization;
    use candle_core::{DType, Device};

    /// A text prompt among chat prompts: each of its samples is the engine's completion of the
    /// text's own tokens (no chat template) with that sample's seed, and its row has no
    /// `tool_calls`; the chat prompt's row has them.
    #[test]
    fn a_text_prompt_is_completed_from_its_own_tokens() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-chat");
        let (config, weights) = crate::hub::local_weights(&dir).unwrap();
        let mut model =
            CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap();
        crate::peft_adapter::load_adapter(&mut model, &dir.join("adapter")).unwrap();
        let tokenizer = ChatTokenizer::load(&dir, None).unwrap();
        let settings =
            GenerationSettings { max_new_tokens: 7, temperature: 1.0, seed: 5, ..Default::default() };
        let chat =
            Conversation { messages: vec![Message::new("user", "Where is my order?")], tools: None, line: 1 };
        let text = "The parcel left the depot on";
        let prompts = [Prompt::Chat(chat), Prompt::Text { text: text.into(), line: 3 }];
        let run = Completions {
            model: &model,
            tokenizer: &tokenizer,
            tools: None,
            stop: &[],
            settings: &settings,
            n: 2,
            batch: 3,
        };
        let mut rows = Vec::new();
        run.run(&prompts, &mut |batch| {
            rows.extend_from_slice(batch);
            Ok(())
        })
        .unwrap();
        assert_eq!(rows.len(), 4);
        let ids = tokenizer.tokenizer().encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(text_prompt_ids(tokenizer.tokenizer(), text).unwrap(), ids);
        for (k, row) in rows[2..].iter().enumerate() {
            let own = GenerationSettings { seed: sample_seed(5, 3, k), ..settings.clone() };
            let alone = generate_detailed(&model, &ids, &[], &own).unwrap();
            assert_eq!((row.line, row.sample), (3, k));
            assert_eq!((row.prompt_tokens, row.completion_tokens), (ids.len(), 7));
            assert_eq!(row.text, decode_reply(tokenizer.tokenizer(), &alone.tokens).unwrap());
            let json = serde_json::to_value(row).unwrap();
            assert!(json.get("tool_calls").is_none(), "{json}");
        }
        assert_ne!(rows[2].text, rows[3].text, "two seeded samples of one prompt");
        let chat_row = serde_json::to_value(&rows[0]).unwrap();
        assert!(chat_row["tool_calls"].is_array(), "{chat_row}");
        assert!(rows[0].prompt_tokens > ids.len(), "the chat template's tokens are in the chat prompt");
    }
}
