//! Which tokens are trained: the assistant turns — replies and tool calls — and their
//! end-of-turn token, nothing else (not the tool results, which the template wraps in their own
//! turns).
//!
//! The template is the only thing that knows where a turn sits in the text, so the spans come
//! from rendering growing prefixes of the conversation: `render(messages[..i], true)` ends where
//! assistant turn `i` begins, and `render(messages[..=i], false)` ends after that turn. Trailing
//! whitespace after the turn (ChatML's "\n" after `<|im_end|>`) is not part of the reply.
//! The full text is tokenized once, with byte offsets, and a token is trained iff it lies inside
//! a span — so tokenization is exactly what inference on the same text would see.

use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;

use anyhow::{bail, ensure, Context};
use minijinja::Value;
use tokenizers::Tokenizer;

use super::tools::map_with;
use super::{ChatTemplate, Example, Message, IGNORE_INDEX};
use crate::config::SystemMessage;

/// Marks where a reply or a tool call sits when the conversation is rendered again with it.
const MARK: &str = "\u{e000}lora-ft-reply\u{e001}";

/// A rendered conversation and the byte ranges of its assistant replies in that text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RenderedConversation {
    pub text: String,
    pub spans: Vec<Range<usize>>,
}

/// A conversation and the row's tools, as the template renders them.
#[derive(Clone, Copy)]
struct Dialogue<'a> {
    template: &'a ChatTemplate,
    tools: Option<&'a [Value]>,
}

impl Dialogue<'_> {
    fn render(&self, messages: &[Message], add_generation_prompt: bool) -> anyhow::Result<String> {
        self.template.render_tools(messages, self.tools, add_generation_prompt)
    }
}

pub(crate) fn render_with_spans(
    template: &ChatTemplate,
    messages: &[Message],
    tools: Option<&[Value]>,
) -> anyhow::Result<RenderedConversation> {
    let d = Dialogue { template, tools };
    let text = d.render(messages, false)?;
    let mut spans = Vec::new();
    for (i, m) in messages.iter().enumerate().filter(|(_, m)| m.role == "assistant") {
        let before = d.render(&messages[..i], true)?;
        let through = d.render(&messages[..=i], false)?;
        let span = if through.starts_with(&before) && text.starts_with(&through) {
            before.len()..through.trim_end().len().max(before.len())
        } else if m.tool_calls.is_some() {
            locate_tool_calls(d, messages, i, &text).with_context(|| not_prefix_stable(i))?
        } else {
            locate_reply(d, messages, i, &text)?
        };
        spans.push(span);
    }
    Ok(RenderedConversation { text, spans })
}

fn not_prefix_stable(i: usize) -> String {
    format!("chat template is not prefix-stable at message {i}: cannot locate the assistant reply")
}

/// Where reply `i` sits in `text` when the template rewrites earlier turns as the conversation
/// grows (Qwen3 gives only the last reply an empty think block; Mistral Nemo moves the system
/// message into the last user turn). The conversation is rendered again with the reply replaced by
/// a marker: the text before the marker precedes the reply, the text after it follows the reply,
/// and the reply's end-of-turn is what the template writes after it as the last message. As where
/// the template is prefix-stable, the reply begins where the generation prompt ends: whitespace the
/// template writes between that prompt and the reply (Mistral v0.3's `" " + content|trim`) is the
/// reply's, so a token that joins it to the reply's first word is trained.
fn locate_reply(d: Dialogue, messages: &[Message], i: usize, text: &str) -> anyhow::Result<Range<usize>> {
    let mut marked = messages.to_vec();
    marked[i].content = MARK.into();
    let whole = d.render(&marked, false)?;
    let last = d.render(&marked[..=i], false)?;
    let (Some((head, tail)), Some((_, after_last))) = (whole.split_once(MARK), last.split_once(MARK)) else {
        bail!(not_prefix_stable(i));
    };
    let end_of_turn = after_last.trim_end();
    let fits = head.len() + tail.len() <= text.len() && text.starts_with(head) && text.ends_with(tail);
    let reply_end = text.len() - tail.len().min(text.len());
    if !fits || !text[reply_end..].starts_with(end_of_turn) || whole.matches(MARK).count() != 1 {
        bail!(not_prefix_stable(i));
    }
    let prompt = d.render(&marked[..i], true)?;
    let prompt_space = prompt.len() - prompt.trim_end().len();
    let start = (head.trim_end().len() + prompt_space).min(head.len());
    Ok(start..reply_end + end_of_turn.len())
}

/// Where tool-call turn `i` sits in `text` when the prefix renders do not line up with it: Mistral
/// Nemo puts the tool list before the last user turn (and the system message only into a last
/// user turn), Qwen3 gives an empty think block to the last turn after the last user query, which
/// a prefix ending at `i` makes the tool-call turn. A marker before the first call's name is
/// found in the whole text; the turn's text after it is what the template writes after it when
/// the turn is the last message, and its text before it is what comes between the marker and
/// where a reply starts (a plain reply as the last message, rendered the same way).
fn locate_tool_calls(
    d: Dialogue,
    messages: &[Message],
    i: usize,
    text: &str,
) -> anyhow::Result<Range<usize>> {
    let mut marked = messages.to_vec();
    let calls = marked[i].tool_calls.as_mut().context("a tool-call turn")?;
    let function = calls[0].get_attr("function")?;
    let name = function.get_attr("name")?;
    let function =
        map_with(&function, "name", Value::from(format!("{MARK}{name}"))).map_err(anyhow::Error::msg)?;
    calls[0] = map_with(&calls[0], "function", function).map_err(anyhow::Error::msg)?;
    let whole = d.render(&marked, false)?;
    ensure!(
        whole.matches(MARK).count() == 1 && whole.replacen(MARK, "", 1) == text,
        "the first call's name is not printed once as given"
    );
    let at = whole.find(MARK).unwrap_or_default();
    let last = d.render(&marked[..=i], false)?;
    let in_last = last.find(MARK).context("the first call's name is not printed")?;
    let mut plain = messages[..i].to_vec();
    plain.push(Message::new("assistant", MARK));
    let probe = d.render(&plain, false)?;
    let mut reply_start = probe.find(MARK).context("a reply is not printed")?;
    // a reply's leading space may not precede a call (Mistral v0.3: `[/INST] reply` but
    // `[/INST][TOOL_CALLS]`): the turn starts where the two part
    while !last.starts_with(&probe[..reply_start]) && probe[..reply_start].ends_with(' ') {
        reply_start -= 1;
    }
    ensure!(
        reply_start <= in_last && last.starts_with(&probe[..reply_start]),
        "a tool-call turn does not start where a reply does"
    );
    let head = &last[reply_start..in_last];
    let tail = last[in_last + MARK.len()..].trim_end();
    ensure!(text[..at].ends_with(head), "the turn's start does not match");
    ensure!(text[at..].starts_with(tail), "the turn's end does not match");
    Ok(at - head.len()..at + tail.len())
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
        Self::load(dir, None)
    }

    /// As `from_dir`, with `chat_template` (a Jinja file) in place of the model's template.
    pub fn load(dir: &Path, chat_template: Option<&Path>) -> anyhow::Result<Self> {
        let config = dir.join("tokenizer_config.json");
        let template = ChatTemplate::from_tokenizer_config_with(&config, chat_template)?;
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
    fn refuses_system(&self, messages: &[Message], tools: Option<&[Value]>) -> bool {
        matches!(messages.split_first(), Some((m, rest)) if m.role == "system" && render_with_spans(&self.template, rest, tools).is_ok())
    }

    /// The messages as the template is given them: the system message folded into the first
    /// user turn where `data.system_message = "fold"`.
    pub fn prepare<'a>(&self, messages: &'a [Message]) -> anyhow::Result<Cow<'a, [Message]>> {
        Ok(match self.system_message {
            SystemMessage::Keep => Cow::Borrowed(messages),
            SystemMessage::Fold => Cow::Owned(fold_system(messages)?),
        })
    }

    /// Token ids and labels of a whole conversation, before any truncation.
    pub fn encode(&self, messages: &[Message]) -> anyhow::Result<Example> {
        Ok(self.encode_with_offsets(messages, None)?.example)
    }

    /// Token ids and labels of a conversation with the row's `tools` (see `Conversation::tools`).
    pub fn encode_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&[Value]>,
    ) -> anyhow::Result<Example> {
        Ok(self.encode_with_offsets(messages, tools)?.example)
    }

    pub(crate) fn encode_with_offsets(
        &self,
        messages: &[Message],
        tools: Option<&[Value]>,
    ) -> anyhow::Result<EncodedConversation> {
        let messages = self.prepare(messages)?;
        let RenderedConversation { text, spans } =
            render_with_spans(&self.template, &messages, tools).map_err(|e| match self.refuses_system(&messages, tools) {
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
        let r = render_with_spans(&t, &messages, None).unwrap();
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
        let r = render_with_spans(&t, &messages, None).unwrap();
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
        let r = render_with_spans(&t, &messages, None).unwrap();
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
        let err = render_with_spans(&t, &messages, None).unwrap_err().to_string();
        assert!(err.contains("not prefix-stable at message 1"), "{err}");
    }
}
