//! Parquet (`.parquet`): each record becomes the JSON text a JSON Lines row would be (columns as
//! keys in the schema's order, a list of structs as an array of objects, null fields left out),
//! so every format reads both file kinds through one parser. Rows are named `file:row_group:row`,
//! both counted from 0 as pyarrow counts them (`pq.ParquetFile(file).read_row_group(g).slice(r, 1)`).
//!
//! The record API of the `parquet` crate (no Arrow arrays: a chat dataset is megabytes, and the
//! Arrow feature would triple what the crate compiles).

use std::path::Path;

use anyhow::{anyhow, Context};
use parquet::data_type::AsBytes;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use serde_json::Value;

use super::row::RowParser;
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
            let mut text = String::new();
            write_row(&record, &mut text);
            let row: Value = serde_json::from_str(&text).with_context(|| at(&r))?;
            let line = conversations.len() + 1;
            let conversation =
                rows.parse(&row, &text, line).map_err(|message| anyhow!("{}: {message}", at(&r)))?;
            conversations.push(conversation);
        }
    }
    Ok(conversations)
}

/// A record or struct as a JSON object, its keys in the schema's order. A null field is left
/// out, as if the key were absent: a struct column has every field in every row (`{"role",
/// "content", "tool_calls": null}` when another row has tool calls), which a JSON Lines row
/// would not have written.
fn write_row(row: &Row, out: &mut String) {
    out.push('{');
    let fields = row.get_column_iter().filter(|(_, field)| !matches!(field, Field::Null));
    for (i, (name, field)) in fields.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(name, out);
        out.push(':');
        write_field(field, out);
    }
    out.push('}');
}

fn write_str(s: &str, out: &mut String) {
    out.push_str(&Value::String(s.to_string()).to_string());
}

/// A field as JSON: text as strings (binary too where it is UTF-8), numbers as numbers, groups
/// as objects, lists as arrays, maps as objects keyed by the key's text.
fn write_field(field: &Field, out: &mut String) {
    let number = |out: &mut String, v: Value| out.push_str(&v.to_string());
    match field {
        Field::Null => out.push_str("null"),
        Field::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Field::Byte(n) => number(out, (*n).into()),
        Field::Short(n) => number(out, (*n).into()),
        Field::Int(n) | Field::Date(n) | Field::TimeMillis(n) => number(out, (*n).into()),
        Field::Long(n) | Field::TimeMicros(n) | Field::TimestampMillis(n) | Field::TimestampMicros(n) => {
            number(out, (*n).into())
        }
        Field::UByte(n) => number(out, (*n).into()),
        Field::UShort(n) => number(out, (*n).into()),
        Field::UInt(n) => number(out, (*n).into()),
        Field::ULong(n) => number(out, (*n).into()),
        // Non-finite floats are null, as serde_json writes them.
        Field::Float16(x) => number(out, f64::from(*x).into()),
        Field::Float(x) => number(out, f64::from(*x).into()),
        Field::Double(x) => number(out, (*x).into()),
        Field::Decimal(_) => number(out, field.to_string().parse::<f64>().map_or(Value::Null, Value::from)),
        Field::Str(s) => write_str(s, out),
        Field::Bytes(b) => match b.as_utf8() {
            Ok(s) => write_str(s, out),
            Err(_) => number(out, Value::Array(b.as_bytes().iter().map(|&x| x.into()).collect())),
        },
        Field::Group(row) => write_row(row, out),
        Field::ListInternal(list) => {
            out.push('[');
            for (i, element) in list.elements().iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_field(element, out);
            }
            out.push(']');
        }
        Field::MapInternal(map) => {
            out.push('{');
            for (i, (key, value)) in map.entries().iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                match key {
                    Field::Str(s) => write_str(s, out),
                    other => write_str(&other.to_string(), out),
                }
                out.push(':');
                write_field(value, out);
            }
            out.push('}');
        }
    }
}
