//! A tokenized dataset: every conversation encoded, truncated to `max_seq_len`, and dropped (and
//! counted) when truncation leaves it nothing to train on.

use std::path::Path;

use anyhow::Context;

use super::{read_conversations, row_name, ChatTokenizer, Conversation, Example};
use crate::config::{DataFormat, TruncationSide};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatasetStats {
    /// Conversations read.
    pub rows: usize,
    /// Rows longer than `max_seq_len` (cut, kept or dropped).
    pub truncated: usize,
    /// Rows left with no trained token after truncation (not in `examples`).
    pub dropped: usize,
    /// Token length of every row before truncation, in file order.
    pub lengths: Vec<usize>,
    /// Tokens and trained tokens of the kept rows, after truncation.
    pub tokens: usize,
    pub trained_tokens: usize,
}

pub struct TokenizedDataset {
    pub examples: Vec<Example>,
    /// The file line of each kept example (Parquet: the row, counted from 1).
    pub lines: Vec<usize>,
    pub stats: DatasetStats,
}

impl TokenizedDataset {
    /// A `messages` JSON Lines file.
    pub fn from_jsonl(
        path: &Path,
        tokenizer: &ChatTokenizer,
        max_seq_len: usize,
        side: TruncationSide,
    ) -> anyhow::Result<Self> {
        Self::from_file(path, DataFormat::Messages, tokenizer, max_seq_len, side)
    }

    /// A data file of `format` (JSON Lines, or Parquet when it ends in `.parquet`).
    pub fn from_file(
        path: &Path,
        format: DataFormat,
        tokenizer: &ChatTokenizer,
        max_seq_len: usize,
        side: TruncationSide,
    ) -> anyhow::Result<Self> {
        let conversations = read_conversations(path, format)?;
        Self::from_conversations(path, &conversations, tokenizer, max_seq_len, side)
    }

    /// `file` only names the source in error messages.
    pub fn from_conversations(
        file: &Path,
        conversations: &[Conversation],
        tokenizer: &ChatTokenizer,
        max_seq_len: usize,
        side: TruncationSide,
    ) -> anyhow::Result<Self> {
        let mut examples = Vec::new();
        let mut lines = Vec::new();
        let mut stats = DatasetStats { rows: conversations.len(), ..Default::default() };
        for conv in conversations {
            let mut example = tokenizer
                .encode_with_tools(&conv.messages, conv.tools.as_deref())
                .with_context(|| row_name(file, conv.line))?;
            stats.lengths.push(example.len());
            stats.truncated += usize::from(example.truncate(max_seq_len, side));
            let trained = example.trained_tokens();
            if trained == 0 {
                stats.dropped += 1;
                continue;
            }
            stats.tokens += example.len();
            stats.trained_tokens += trained;
            examples.push(example);
            lines.push(conv.line);
        }
        if stats.dropped > 0 {
            tracing::warn!(
                file = %file.display(),
                dropped = stats.dropped,
                "rows with no assistant token left after truncation to {max_seq_len} tokens were dropped"
            );
        }
        Ok(Self { examples, lines, stats })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Example {
        Example { input_ids: vec![1, 2, 3, 4, 5], labels: vec![-100, -100, 3, 4, -100], ..Default::default() }
    }

    #[test]
    fn truncates_either_side() {
        let mut right = example();
        assert!(right.truncate(3, TruncationSide::Right));
        assert_eq!(
            right,
            Example { input_ids: vec![1, 2, 3], labels: vec![-100, -100, 3], ..Default::default() }
        );
        let mut left = example();
        assert!(left.truncate(3, TruncationSide::Left));
        assert_eq!(
            left,
            Example { input_ids: vec![3, 4, 5], labels: vec![3, 4, -100], ..Default::default() }
        );
        let mut short = example();
        assert!(!short.truncate(5, TruncationSide::Left));
        assert_eq!(short, example());
    }

    #[test]
    fn a_label_at_position_zero_is_not_trained() {
        let mut left = example();
        left.truncate(3, TruncationSide::Left);
        assert_eq!(left.trained_tokens(), 1);
        let mut only_first = example();
        only_first.truncate(2, TruncationSide::Left);
        assert_eq!(only_first.labels, [4, -100]);
        assert_eq!(only_first.trained_tokens(), 0);
    }
}
