//! A row of any format turned into a conversation; `format = "auto"` settles on a format at the
//! first row.

use serde_json::Value;

use super::fields::{conversation, object};
use super::{alpaca, prompt_completion, sharegpt};
use crate::config::DataFormat;
use crate::data::Conversation;

/// Turns rows into conversations; `auto` settles on a format at the first row.
pub(super) struct RowParser {
    pub format: DataFormat,
}

impl RowParser {
    /// `row` parsed from `text`, its JSON with the keys in file (or schema) order, which is what
    /// the `messages` reader reads: templates print tool arguments in that order.
    pub fn parse(&mut self, row: &Value, text: &str, line: usize) -> Result<Conversation, String> {
        if self.format == DataFormat::Auto {
            self.format = detect(row)?;
        }
        match self.format {
            DataFormat::Messages => Conversation::parse(text, line),
            DataFormat::ShareGpt => conversation(sharegpt::parse(object(row, "a ShareGPT row")?)?, line),
            DataFormat::Alpaca => conversation(alpaca::parse(object(row, "an alpaca row")?)?, line),
            DataFormat::PromptCompletion => {
                prompt_completion::parse(object(row, "a prompt/completion row")?, line)
            }
            DataFormat::Auto => unreachable!("settled above"),
        }
    }
}

/// The format of `format = "auto"`, from the keys of the first row.
pub(super) fn detect(row: &Value) -> Result<DataFormat, String> {
    let has = |key: &str| row.get(key).is_some_and(|v| !v.is_null());
    let found: Vec<(DataFormat, &str)> = [
        (DataFormat::Messages, has("messages"), r#""messages""#),
        (DataFormat::ShareGpt, has("conversations"), r#""conversations""#),
        (DataFormat::Alpaca, has("instruction") && has("output"), r#""instruction" and "output""#),
        (DataFormat::PromptCompletion, has("prompt") && has("completion"), r#""prompt" and "completion""#),
    ]
    .into_iter()
    .filter_map(|(format, present, keys)| present.then_some((format, keys)))
    .collect();
    match found.as_slice() {
        [(format, _)] => Ok(*format),
        [] => Err(r#"format = "auto" found none of "messages" (messages), "conversations" (sharegpt), "instruction" and "output" (alpaca), "prompt" and "completion" (prompt_completion) in the first row"#.into()),
        many => {
            let keys: Vec<&str> = many.iter().map(|(_, k)| *k).collect();
            Err(format!(r#"format = "auto" cannot tell the format: the first row has {}; set data.format"#, keys.join(" and also ")))
        }
    }
}
