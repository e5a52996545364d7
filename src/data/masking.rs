//! Which tokens are trained: the assistant replies and their end-of-turn token, nothing else.
//!
//! The template is the only thing that knows where a reply sits in the text, so the spans come
//! from rendering growing prefixes of the conversation: `render(messages[..i], true)` ends where
//! assistant turn `i` begins, and `render(messages[..=i], false)` ends after that turn. Trailing
//! whitespace after the turn (ChatML's "\n" after `<|im_end|>`) is not part of the reply.
//! The full text is tokenized once, with byte offsets, and a token is trained iff it lies inside
//! a span — so tokenization is exactly what inference on the same text would see.

use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;

use anyhow::{bail, Context};
use tokenizers::Tokenizer;

use super::{ChatTemplate, Example, Message, IGNORE_INDEX};
use crate::config::SystemMessage;

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
        let span = if through.starts_with(&before) && text.starts_with(&through) {
            before.len()..through.trim_end().len().max(before.len())
        } else {
            locate_reply(template, messages, i, &text)?
        };
        spans.push(span);
    }
    Ok(RenderedConversation { text, spans })
}

/// Where reply `i` sits in `text` when the template rewrites earlier turns as the conversation
/// grows (Qwen3 gives only the last reply an empty think block; Mistral Nemo moves the system
/// message into the last user turn). The conversation is rendered again with the reply replaced by
/// a marker: the text before the marker precedes the reply, the text after it follows the reply,
/// and the reply's end-of-turn is what the template writes after it as the last message. As where
/// the template is prefix-stable, the reply begins where the generation prompt ends: whitespace the
/// template writes between that prompt and the reply (Mistral v0.3's `" " + content|trim`) is the
/// reply's, so a token that joins it to the reply's first word is trained.
fn locate_reply(
    template: &ChatTemplate,
    messages: &[Message],
    i: usize,
    text: &str,
) -> anyhow::Result<Range<usize>> {
    const MARK: &str = "\u{e000}lora-ft-reply\u{e001}";
    let mut marked = messages.to_vec();
    marked[i].content = MARK.into();
    let whole = template.render(&marked, false)?;
    let last = template.render(&marked[..=i], false)?;
    let cannot =
        || format!("chat template is not prefix-stable at message {i}: cannot locate the assistant reply");
    let (Some((head, tail)), Some((_, after_last))) = (whole.split_once(MARK), last.split_once(MARK)) else {
        bail!(cannot());
    };
    let end_of_turn = after_last.trim_end();
    let fits = head.len() + tail.len() <= text.len() && text.starts_with(head) && text.ends_with(tail);
    let reply_end = text.len() - tail.len().min(text.len());
    if !fits || !text[reply_end..].starts_with(end_of_turn) || whole.matches(MARK).count() != 1 {
        bail!(cannot());
    }
    let prompt = template.render(&marked[..i], true)?;
    let prompt_space = prompt.len() - prompt.trim_end().len();
    let start = (head.trim_end().len() + prompt_space).min(head.len());
    Ok(start..reply_end + end_of_turn.len())
}

/// A tokenizer folder: `tokenizer.json`, and `tokenizer_config.json` with the chat template.
pub struct ChatTokenizer {
    template: ChatTemplate,
    tokenizer: Tokenizer,
    pad_id: u32,
    system_message: SystemMessage,
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
        Ok(Self { template, tokenizer, pad_id, system_message: SystemMessage::Keep })
    }

    /// What to do with a leading system message (`data.system_message`).
    pub fn with_system_message(mut self, policy: SystemMessage) -> Self {
        self.system_message = policy;
        self
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn template_mut(&mut self) -> &mut ChatTemplate {
        &mut self.template
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Whether the template renders `messages` without their leading system message: then that
    /// message is what it refused, and folding it would help.
    fn refuses_system(&self, messages: &[Message]) -> bool {
        matches!(messages.split_first(), Some((m, rest)) if m.role == "system" && render_with_spans(&self.template, rest).is_ok())
    }

    /// Token ids and labels of a whole conversation, before any truncation.
    pub fn encode(&self, messages: &[Message]) -> anyhow::Result<Example> {
        Ok(self.encode_with_offsets(messages)?.example)
    }

    pub(crate) fn encode_with_offsets(&self, messages: &[Message]) -> anyhow::Result<EncodedConversation> {
        let messages = match self.system_message {
            SystemMessage::Keep => Cow::Borrowed(messages),
            SystemMessage::Fold => Cow::Owned(fold_system(messages)?),
        };
        let RenderedConversation { text, spans } =
            render_with_spans(&self.template, &messages).map_err(|e| match self.refuses_system(&messages) {
                true => anyhow::anyhow!(
                    "{e:#} (data.system_message = \"fold\" would fold the system text into the first user turn)"
                ),
                false => e,
            })?;
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
        Ok(EncodedConversation {
            text,
            offsets,
            example: Example { input_ids, labels, ..Default::default() },
        })
    }
}

/// A leading system message folded into the first user turn as "{system}\n\n{user}".
pub(crate) fn fold_system(messages: &[Message]) -> anyhow::Result<Vec<Message>> {
    let Some((first, rest)) = messages.split_first().filter(|(m, _)| m.role == "system") else {
        return Ok(messages.to_vec());
    };
    let mut rest = rest.to_vec();
    let Some(user) = rest.iter_mut().find(|m| m.role == "user") else {
        bail!("data.system_message = \"fold\": no user turn to fold the system message into");
    };
    user.content = format!("{}\n\n{}", first.content, user.content);
    Ok(rest)
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
    fn locates_replies_when_the_template_rewrites_the_last_one() {
        // Like Qwen3: only the last reply gets an (empty) think block, so the render of
        // messages[..=1] is not a prefix of the whole conversation.
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' }}\
             {% if m.role == 'assistant' and loop.last %}{{ '<think></think>' }}{% endif %}\
             {{ m.content + '<|im_end|>\n' }}{% endfor %}\
             {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
                .into(),
            BTreeMap::new(),
        )
        .unwrap();
        let messages = [
            Message::new("user", "a"),
            Message::new("assistant", "b"),
            Message::new("user", "c"),
            Message::new("assistant", "d"),
        ];
        let r = render_with_spans(&t, &messages).unwrap();
        let spans: Vec<&str> = r.spans.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(spans, ["b<|im_end|>", "<think></think>d<|im_end|>"]);
    }

    #[test]
    fn a_space_the_template_writes_before_a_moved_reply_is_the_replys() {
        // Like Mistral 7B v0.3: the system message goes into the last user turn only, and a reply
        // is written as " " + its trimmed text, after a generation prompt that ends in "]".
        let t = ChatTemplate::new(
            "{% set sys = messages[0].content if messages[0].role == 'system' else none %}\
             {% for m in messages if m.role != 'system' %}\
             {% if m.role == 'user' %}{{ '[INST] ' }}\
             {% if loop.last and sys %}{{ sys + '\n\n' }}{% endif %}{{ m.content + '[/INST]' }}\
             {% else %}{{ ' ' + m.content|trim + '</s>' }}{% endif %}{% endfor %}"
                .into(),
            BTreeMap::new(),
        )
        .unwrap();
        let messages = [
            Message::new("system", "s"),
            Message::new("user", "a"),
            Message::new("assistant", " b "),
            Message::new("user", "c"),
        ];
        let r = render_with_spans(&t, &messages).unwrap();
        assert_eq!(r.text, "[INST] a[/INST] b</s>[INST] s\n\nc[/INST]");
        let spans: Vec<&str> = r.spans.iter().map(|s| &r.text[s.clone()]).collect();
        assert_eq!(spans, [" b</s>"]);
    }

    #[test]
    fn folds_the_system_message_into_the_first_user_turn() {
        let messages =
            [Message::new("system", "s"), Message::new("user", "u"), Message::new("assistant", "a")];
        assert_eq!(
            fold_system(&messages).unwrap(),
            [Message::new("user", "s\n\nu"), Message::new("assistant", "a")]
        );
        assert_eq!(fold_system(&messages[1..]).unwrap(), &messages[1..]);
        let err = fold_system(&[Message::new("system", "s"), Message::new("assistant", "a")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "data.system_message = \"fold\": no user turn to fold the system message into"
        );
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
