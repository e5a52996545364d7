//! Parquet (`.parquet`): each record becomes the JSON object a JSON Lines row would be (columns
//! as keys, a list of structs as an array of objects, null fields left out), so every format reads both
//! file kinds through one parser. Rows are named `file:row_group:row`, both counted from 0 as
//! pyarrow counts them (`pq.ParquetFile(file).read_row_group(g).slice(r, 1)`).
//!
//! The record API of the `parquet` crate (no Arrow arrays: a chat dataset is megabytes, and the
//! Arrow feature would triple what the crate compiles).

use std::path::Path;

use anyhow::{anyhow, Context};
use parquet::data_type::AsBytes;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use serde_json::{Map, Value};

use super::{conversation, RowParser};
use crate::data::Conversation;

pub(super) fn read(path: &Path, rows: &mut RowParser) -> anyhow::Result<Vec<Conversation>> {
    let file = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let reader = SerializedFileReader::new(file)
        .with_context(|| format!("{}: cannot read as Parquet", path.display()))?;
    // The record reader asserts some invariants of the file's structure with panics; a file that
    // breaks them is the user's input, so it ends as an error like any other.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_rows(path, &reader, rows))).unwrap_or_else(
        |panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown reason");
            Err(anyhow!("{}: the Parquet reader failed: {why}", path.display()))
        },
    )
}

fn read_rows(
    path: &Path,
    reader: &SerializedFileReader<std::fs::File>,
    rows: &mut RowParser,
) -> anyhow::Result<Vec<Conversation>> {
    let mut conversations = Vec::new();
    for g in 0..reader.metadata().num_row_groups() {
        let at = |r: &dyn std::fmt::Display| format!("{}:{g}:{r}", path.display());
        let group = reader.get_row_group(g).with_context(|| format!("{}: cannot read", at(&"")))?;
        let records = group.get_row_iter(None).with_context(|| format!("{}: cannot read", at(&"")))?;
        for (r, record) in records.enumerate() {
            let record = record.with_context(|| format!("{}: cannot read", at(&r)))?;
            let messages =
                rows.parse(&row_value(&record)).map_err(|message| anyhow!("{}: {message}", at(&r)))?;
            conversations.push(conversation(messages, conversations.len() + 1));
        }
    }
    Ok(conversations)
}

/// A record or struct as an object. A null field is left out, as if the key were absent: a
/// struct column has every field in every row (`{"role", "content", "tool_calls": null}` when
/// some other row has tool calls), which a JSON Lines row would not have written.
fn row_value(row: &Row) -> Value {
    let fields = row.get_column_iter().filter(|(_, field)| !matches!(field, Field::Null));
    let fields = fields.map(|(name, field)| (name.clone(), field_value(field)));
    Value::Object(fields.collect::<Map<_, _>>())
}

/// A field as JSON: text as strings (binary too where it is UTF-8), numbers as numbers, groups
/// as objects, lists as arrays, maps as objects keyed by the key's text.
fn field_value(field: &Field) -> Value {
    match field {
        Field::Null => Value::Null,
        Field::Bool(b) => Value::Bool(*b),
        Field::Byte(n) => (*n).into(),
        Field::Short(n) => (*n).into(),
        Field::Int(n) | Field::Date(n) | Field::TimeMillis(n) => (*n).into(),
        Field::Long(n) | Field::TimeMicros(n) | Field::TimestampMillis(n) | Field::TimestampMicros(n) => {
            (*n).into()
        }
        Field::UByte(n) => (*n).into(),
        Field::UShort(n) => (*n).into(),
        Field::UInt(n) => (*n).into(),
        Field::ULong(n) => (*n).into(),
        Field::Float16(x) => f64::from(*x).into(),
        Field::Float(x) => f64::from(*x).into(),
        Field::Double(x) => (*x).into(),
        Field::Decimal(_) => field.to_string().parse::<f64>().map_or(Value::Null, Value::from),
        Field::Str(s) => Value::String(s.clone()),
        Field::Bytes(b) => match b.as_utf8() {
            Ok(s) => Value::String(s.to_string()),
            Err(_) => Value::Array(b.as_bytes().iter().map(|&x| x.into()).collect()),
        },
        Field::Group(row) => row_value(row),
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(field_value).collect()),
        Field::MapInternal(map) => {
            let key = |k: &Field| match k {
                Field::Str(s) => s.clone(),
                other => other.to_string(),
            };
            Value::Object(map.entries().iter().map(|(k, v)| (key(k), field_value(v))).collect())
        }
    }
}
