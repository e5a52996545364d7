//! Dataset formats (`[data] format`) and file kinds, each row turned into the `Conversation` that
//! the chat template renders. One file per format, one per file kind:
//!
//! | format | a row | becomes |
//! |---|---|---|
//! | `messages` | `{"messages": [{"role", "content"}, ...]}` | itself (`super::messages`) |
//! | `sharegpt` | `{"conversations": [{"from", "value"}, ...], "system"?}` | `sharegpt.rs` |
//! | `alpaca` | `{"instruction", "input"?, "output", "system"?}` | `alpaca.rs` |
//! | `prompt_completion` | `{"prompt", "completion"}`, strings or message lists (TRL) | `prompt_completion.rs` |
//! | `auto` | any of the above, told apart by the first row's keys | |
//!
//! A file ending in `.parquet` is read as Parquet (`parquet.rs`: one row per record, the same keys
//! as columns, lists of structs for message lists); any other as JSON Lines (`jsonl.rs`: one
//! object per line, blank lines skipped). A malformed row is an error naming `file:line`
//! (Parquet: `file:row_group:row`, both from 0 as pyarrow counts them) and what is wrong with it.

mod alpaca;
mod fields;
mod jsonl;
mod parquet;
mod prompt_completion;
mod row;
mod sharegpt;

use std::path::Path;

use super::Conversation;
use crate::config::DataFormat;
use row::RowParser;

/// Reads every conversation of `path` in `format`; the file kind comes from the extension.
pub fn read_conversations(path: &Path, format: DataFormat) -> anyhow::Result<Vec<Conversation>> {
    let mut rows = RowParser { format };
    let conversations =
        if is_parquet(path) { parquet::read(path, &mut rows)? } else { jsonl::read(path, &mut rows)? };
    anyhow::ensure!(!conversations.is_empty(), "{}: no conversations", path.display());
    Ok(conversations)
}

/// Whether `path` is read as Parquet (`.parquet`, any case); everything else is JSON Lines.
pub fn is_parquet(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet"))
}

/// How a row is named once read: `file:line` for JSON Lines; for Parquet, where `line` counts
/// the file's rows from 1, `file:row N` with N from 0 (as the read errors and pyarrow count).
pub fn row_name(path: &Path, line: usize) -> String {
    if is_parquet(path) {
        format!("{}:row {}", path.display(), line.saturating_sub(1))
    } else {
        format!("{}:{line}", path.display())
    }
}

#[cfg(test)]
mod tests;
