//! Tool-call accuracy for `lora-ft eval`: in every dialogue that has `tools`, the model answers
//! each reference assistant turn greedily from the dialogue before it (the chat template with the
//! row's tools and the generation prompt), and the calls parsed from its reply
//! (`data::parse_tool_calls`) are compared with the reference turn's: a turn with calls is exact
//! when the same functions are called in the same order with arguments equal as JSON values; a
//! turn without calls where the model called a tool anyway is an unexpected call.

use serde::Serialize;

use crate::data::{message_tool_calls, parse_tool_calls, ChatTokenizer, Conversation};
use crate::generate::{reply_with_tools, GenerationSettings};
use crate::model::CausalLm;

/// One dialogue's counts (fields of its `--out` line).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ToolCallScore {
    /// Reference assistant turns with tool calls, and those the model called exactly.
    pub tool_call_turns: usize,
    pub tool_calls_exact: usize,
    /// Reference assistant turns without calls, and those where the model called a tool.
    pub reply_turns: usize,
    pub unexpected_calls: usize,
}

impl ToolCallScore {
    fn add(&mut self, other: &ToolCallScore) {
        self.tool_call_turns += other.tool_call_turns;
        self.tool_calls_exact += other.tool_calls_exact;
        self.reply_turns += other.reply_turns;
        self.unexpected_calls += other.unexpected_calls;
    }

    /// The file's counts from its dialogues' (`None` where no dialogue has tools).
    pub fn total<'a>(scores: impl IntoIterator<Item = &'a ToolCallScore>) -> Option<ToolCallScore> {
        scores.into_iter().fold(None, |total, s| {
            let mut total = total.unwrap_or_default();
            total.add(s);
            Some(total)
        })
    }

    /// `tool calls: 57/64 turns exact (89.1%), 2 unexpected calls in 120 reply turns`
    pub fn summary(&self) -> String {
        let share = match self.tool_call_turns {
            0 => "no turn with calls".to_string(),
            n => format!("{:.1}%", 100.0 * self.tool_calls_exact as f64 / n as f64),
        };
        format!(
            "tool calls: {}/{} turns exact ({share}), {} unexpected calls in {} reply turns",
            self.tool_calls_exact, self.tool_call_turns, self.unexpected_calls, self.reply_turns
        )
    }
}

/// Scores one dialogue (`None` where it has no `tools`); `stop` and `max_new_tokens` as
/// generation takes them.
pub fn score_dialogue(
    model: &CausalLm,
    tokenizer: &ChatTokenizer,
    conversation: &Conversation,
    stop: &[u32],
    max_new_tokens: usize,
) -> anyhow::Result<Option<ToolCallScore>> {
    let Some(tools) = conversation.tools.as_deref() else { return Ok(None) };
    let settings = GenerationSettings { max_new_tokens, ..Default::default() };
    let messages = tokenizer.prepare(&conversation.messages)?;
    let mut score = ToolCallScore::default();
    for (i, turn) in messages.iter().enumerate().filter(|(_, m)| m.role == "assistant") {
        let answer = reply_with_tools(model, tokenizer, &messages[..i], Some(tools), stop, &settings)?;
        let called = parse_tool_calls(&answer);
        if turn.tool_calls.is_some() {
            score.tool_call_turns += 1;
            score.tool_calls_exact += usize::from(called == message_tool_calls(turn));
        } else {
            score.reply_turns += 1;
            score.unexpected_calls += usize::from(!called.is_empty());
        }
    }
    Ok(Some(score))
}
