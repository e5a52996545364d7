//! Dialogue data: rows of a JSON Lines or Parquet file in one of the dataset formats (`messages`,
//! `sharegpt`, `alpaca`, `prompt_completion`) → the model's own chat template → token ids with
//! labels that train only on assistant replies → truncated, padded, shuffled batches.
//!
//! ```text
//! read_conversations ──► ChatTemplate::render ──► ChatTokenizer::encode (ids + labels)
//!   ──► TokenizedDataset (truncate, drop rows with nothing to train, stats)
//!   ──► pack (data.packing: dialogues into rows of max_seq_len, best-fit decreasing)
//!   ──► BatchLoader (seeded shuffle per epoch, right padding, prefetch thread) ──► Batch
//! ```
//!
//! Labels follow the Hugging Face convention: `labels` is aligned with `input_ids`, -100 marks an
//! ignored position, and the model shifts (logits at t predict `labels[t + 1]`).

mod batch;
mod check;
mod dataset;
mod example;
mod formats;
mod jinja_compat;
mod masking;
mod messages;
mod packing;
mod template;
mod tool_calls_text;
mod tools;

pub use batch::{Batch, BatchLoader, EpochBatches, PadTo};
pub use check::{data_check, data_tokenize};
pub use dataset::{DatasetStats, TokenizedDataset};
pub use example::Example;
pub use formats::{is_parquet, read_conversations, row_name};
pub use masking::ChatTokenizer;
pub use messages::{read_messages_jsonl, read_prompts_jsonl, Conversation, LineError, Message};
pub use packing::{pack, PackingStats};
pub use template::ChatTemplate;
pub use tool_calls_text::{message_tool_calls, parse_tool_calls, ToolCall, TOOL_CALL_TOKENS};
pub use tools::read_tools_file;

/// The label of a position the loss ignores; owned by the loss, re-exported for the data side.
pub use crate::model::ops::loss::IGNORE_INDEX;
