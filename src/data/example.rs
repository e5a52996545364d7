//! One training row as the model reads it: token ids, labels, and the dialogues packed into it.

use super::IGNORE_INDEX;
use crate::config::TruncationSide;

/// One training row: token ids and labels of the same length (-100 = not trained).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Example {
    pub input_ids: Vec<u32>,
    pub labels: Vec<i64>,
    /// The lengths of the dialogues packed into this row, in order (they sum to its length;
    /// `data.packing`, see packing.rs); empty for a row of one dialogue.
    pub seq_lens: Vec<usize>,
}

impl Example {
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Positions that contribute to the loss. The model shifts (logits at t predict
    /// `labels[t + 1]`), so a label at position 0 never does and is not counted.
    pub fn trained_tokens(&self) -> usize {
        self.labels.iter().skip(1).filter(|&&l| l != IGNORE_INDEX).count()
    }

    /// Cuts the row to at most `max_len` tokens; `Right` keeps the start, `Left` keeps the end.
    /// Returns whether anything was cut.
    pub fn truncate(&mut self, max_len: usize, side: TruncationSide) -> bool {
        let len = self.len();
        if len <= max_len {
            return false;
        }
        match side {
            TruncationSide::Right => {
                self.input_ids.truncate(max_len);
                self.labels.truncate(max_len);
            }
            TruncationSide::Left => {
                self.input_ids.drain(..len - max_len);
                self.labels.drain(..len - max_len);
            }
        }
        true
    }
}
