//! JSON Lines: one JSON object per line (`.jsonl`, and `.json` files written as lines); blank
//! lines are skipped, every other line is a row or an error naming `file:line`.

use std::io::BufRead;
use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use super::row::RowParser;
use crate::data::{Conversation, LineError};

pub(super) fn read(path: &Path, rows: &mut RowParser) -> anyhow::Result<Vec<Conversation>> {
    let file = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut conversations = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let first = conversations.is_empty();
        let conversation = parse(&line, i + 1, first, rows).map_err(|message| LineError {
            file: path.to_path_buf(),
            line: i + 1,
            message,
        })?;
        conversations.push(conversation);
    }
    Ok(conversations)
}

const ARRAY_HINT: &str =
    "lora-ft reads JSON Lines, one object per line; `jq -c '.[]' FILE` turns a JSON array into them";

fn parse(line: &str, number: usize, first: bool, rows: &mut RowParser) -> Result<Conversation, String> {
    // A whole-file JSON array (Stanford Alpaca's alpaca_data.json) opens with "[" on line 1.
    let array = first && line.trim_start().starts_with('[');
    let row: Value = serde_json::from_str(line).map_err(|e| match array {
        true => format!("invalid JSON: {e} ({ARRAY_HINT})"),
        false => format!("invalid JSON: {e}"),
    })?;
    if array && row.is_array() {
        return Err(format!("a JSON array, not an object ({ARRAY_HINT})"));
    }
    rows.parse(&row, line, number)
}
