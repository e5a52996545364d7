//! Which tokens are trained: the assistant replies and their end-of-turn token, nothing else.
//!
//! The template is the only thing that knows where a reply sits in the text, so the spans come
//! from rendering growing prefixes of the conversation: `render(messages[..i], true)` ends where
//! assistant turn `i` begins, and `render(messages[..=i], false)` ends after that turn. Trailing
//! whitespace after the turn (ChatML's "\n" after `<|im_end|>`) is not part of the reply.
//! The full text is tokenized once, with byte offsets, and a token is trained iff it lies inside
//! a span — so tokenization is exactly what inference on the same text would see.

use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Context};
use tokenizers::Tokenizer;

use super::{ChatTemplate, Example, Message, IGNORE_INDEX};

/// A rendered conversation and the byte ranges of its assistant replies in that text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RenderedConversation {
    pub text: String,
    pub spans: Vec<Range<usize>>,
}

pub(crate) fn render_with_spans(
    template: &ChatTemplate,
    messages: &[Message],
) -> anyhow::Result<RenderedConversation> {
    let text = template.render(messages, false)?;
    let mut spans = Vec::new();
    for (i, _) in messages.iter().enumerate().filter(|(_, m)| m.role == "assistant") {
        let before = template.render(&messages[..i], true)?;
        let through = template.render(&messages[..=i], false)?;
        // A template whose earlier text changes as the conversation grows (e.g. one that drops
        // past reasoning) has no single place for this reply; masking it would be a guess.
        if !through.starts_with(&before) || !text.starts_with(&through) {
            bail!("chat template is not prefix-stable at message {i}: cannot locate the assistant reply");
        }
        let end = through.trim_end().len().max(before.len());
        spans.push(before.len()..end);
    }
    Ok(RenderedConversation { text, spans })
}

/// A tokenizer folder: `tokenizer.json`, and `tokenizer_config.json` with the chat template.
pub struct ChatTokenizer {
    template: ChatTemplate,
    tokenizer: Tokenizer,
    pad_id: u32,
}

/// One conversation as text, tokens, their byte offsets into the text, and labels.
pub(crate) struct EncodedConversation {
    pub text: String,
    pub offsets: Vec<(usize, usize)>,
    pub example: Example,
}

impl ChatTokenizer {
    pub fn from_dir(dir: &Path) -> anyhow::Result<Self> {
        let template = ChatTemplate::from_tokenizer_config(&dir.join("tokenizer_config.json"))?;
        let file = dir.join("tokenizer.json");
        let tokenizer =
            Tokenizer::from_file(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        Self::new(template, tokenizer)
    }

    /// The pad token is the config's `pad_token`, else `eos_token` (padding is never trained).
    pub fn new(template: ChatTemplate, tokenizer: Tokenizer) -> anyhow::Result<Self> {
        let pad = template
            .special_token("pad_token")
            .or_else(|| template.special_token("eos_token"))
            .context("tokenizer_config.json names neither pad_token nor eos_token")?;
        let pad_id = tokenizer
            .token_to_id(pad)
            .with_context(|| format!("pad token {pad:?} is not in the vocabulary"))?;
        Ok(Self { template, tokenizer, pad_id })
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Token ids and labels of a whole conversation, before any truncation.
    pub fn encode(&self, messages: &[Message]) -> anyhow::Result<Example> {
        Ok(self.encode_with_offsets(messages)?.example)
    }

    pub(crate) fn encode_with_offsets(&self, messages: &[Message]) -> anyhow::Result<EncodedConversation> {
        let RenderedConversation { text, spans } = render_with_spans(&self.template, messages)?;
        // The template already wrote every special token; the tokenizer must add none.
        let encoding =
            self.tokenizer.encode(text.as_str(), false).map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
        let offsets = encoding.get_offsets().to_vec();
        let input_ids = encoding.get_ids().to_vec();
        let labels = input_ids
            .iter()
            .zip(&offsets)
            .map(|(&id, &(a, b))| {
                let trained = spans.iter().any(|s| s.start <= a && b <= s.end && a < b);
                if trained {
                    i64::from(id)
                } else {
                    IGNORE_INDEX
                }
            })
            .collect();
        Ok(EncodedConversation { text, offsets, example: Example { input_ids, labels } })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const CHATML: &str =
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}\
        {% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn spans_cover_reply_and_end_of_turn_but_not_the_newline() {
        let t = ChatTemplate::new(CHATML.into(), BTreeMap::new()).unwrap();
        let messages = [
            Message::new("user", "a"),
            Message::new("assistant", "b "),
            Message::new("user", "c"),
            Message::new("assistant", "d"),
        ];
        let r = render_with_spans(&t, &messages).unwrap();
        let spans: Vec<&str> = r.spans.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(spans, ["b <|im_end|>", "d<|im_end|>"]);
    }

    #[test]
    fn rejects_templates_that_rewrite_history() {
        // Shows only the last message: earlier replies vanish from the final text.
        let t = ChatTemplate::new("{{ messages[-1].content }}".into(), BTreeMap::new()).unwrap();
        let messages = [Message::new("user", "a"), Message::new("assistant", "b"), Message::new("user", "c")];
        let err = render_with_spans(&t, &messages).unwrap_err().to_string();
        assert!(err.contains("not prefix-stable at message 1"), "{err}");
    }
}
