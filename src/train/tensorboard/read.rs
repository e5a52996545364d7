//! Reading event files back, as far as this writer writes them: every record's two CRCs checked,
//! and each event's time, step and contents decoded. What the tests check the files with (the
//! Python check, `scripts/tensorboard_check.py`, reads them with TensorBoard itself).

use std::path::Path;

use anyhow::Context;

use super::record::masked_crc32c;

/// One decoded `tensorflow.Event`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub file_version: Option<String>,
    /// Simple-value summaries: (tag, value).
    pub scalars: Vec<(String, f32)>,
    /// Tensor summaries of strings: (tag, plugin name, the strings).
    pub texts: Vec<(String, String, Vec<String>)>,
    /// A SessionLog with status START.
    pub session_start: bool,
}

/// Every event of the file at `path`, in order.
pub fn read_events(path: &Path) -> anyhow::Result<Vec<Event>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    records(&bytes)
        .and_then(|records| records.into_iter().map(decode_event).collect())
        .with_context(|| format!("reading {}", path.display()))
}

/// The data of each record, both CRCs checked.
pub fn records(mut bytes: &[u8]) -> anyhow::Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let at = out.len();
        anyhow::ensure!(bytes.len() >= 12, "record {at}: a torn header");
        let (len_bytes, rest) = bytes.split_at(8);
        let crc = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        anyhow::ensure!(crc(rest) == masked_crc32c(len_bytes), "record {at}: the length's CRC is wrong");
        let len = u64::from_le_bytes(len_bytes.try_into()?) as usize;
        let rest = &rest[4..];
        anyhow::ensure!(rest.len() >= len + 4, "record {at}: {len} bytes announced, {} left", rest.len());
        let (data, rest) = rest.split_at(len);
        anyhow::ensure!(crc(rest) == masked_crc32c(data), "record {at}: the data's CRC is wrong");
        out.push(data);
        bytes = &rest[4..];
    }
    Ok(out)
}

/// A protobuf field's value: a varint, 8 or 4 fixed bytes, or a length-delimited run.
enum Value<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Fixed32([u8; 4]),
    Bytes(&'a [u8]),
}

/// The (field number, value) pairs of a message.
fn fields(mut bytes: &[u8]) -> anyhow::Result<Vec<(u64, Value<'_>)>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let value = match key & 7 {
            0 => Value::Varint(varint(&mut bytes)?),
            1 => Value::Fixed64(take(&mut bytes, 8)?.try_into()?),
            5 => Value::Fixed32(take(&mut bytes, 4)?.try_into()?),
            2 => {
                let len = varint(&mut bytes)? as usize;
                Value::Bytes(take(&mut bytes, len)?)
            }
            t => anyhow::bail!("wire type {t} of field {}", key >> 3),
        };
        out.push((key >> 3, value));
    }
    Ok(out)
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> anyhow::Result<&'a [u8]> {
    anyhow::ensure!(bytes.len() >= n, "a field of {n} bytes, {} left", bytes.len());
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn varint(bytes: &mut &[u8]) -> anyhow::Result<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = take(bytes, 1)?[0];
        value |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(value);
        }
    }
    anyhow::bail!("a varint of more than 10 bytes")
}

fn text(bytes: &[u8]) -> anyhow::Result<String> {
    Ok(std::str::from_utf8(bytes)?.to_string())
}

pub fn decode_event(bytes: &[u8]) -> anyhow::Result<Event> {
    let mut event = Event::default();
    for (field, value) in fields(bytes)? {
        match (field, value) {
            (1, Value::Fixed64(b)) => event.wall_time = f64::from_le_bytes(b),
            (2, Value::Varint(v)) => event.step = v as i64,
            (3, Value::Bytes(b)) => event.file_version = Some(text(b)?),
            (5, Value::Bytes(b)) => decode_summary(b, &mut event)?,
            (7, Value::Bytes(b)) => {
                event.session_start = fields(b)?.iter().any(|f| matches!(f, (1, Value::Varint(1))))
            }
            (f, _) => anyhow::bail!("an Event field {f} this reader does not know"),
        }
    }
    Ok(event)
}

fn decode_summary(bytes: &[u8], event: &mut Event) -> anyhow::Result<()> {
    for (field, value) in fields(bytes)? {
        let (1, Value::Bytes(value)) = (field, value) else { anyhow::bail!("Summary field {field}") };
        let (mut tag, mut simple, mut plugin, mut strings) = (String::new(), None, String::new(), None);
        for (field, v) in fields(value)? {
            match (field, v) {
                (1, Value::Bytes(b)) => tag = text(b)?,
                (2, Value::Fixed32(b)) => simple = Some(f32::from_le_bytes(b)),
                (9, Value::Bytes(b)) => plugin = plugin_name(b)?,
                (8, Value::Bytes(b)) => strings = Some(tensor_strings(b)?),
                (f, _) => anyhow::bail!("a Summary.Value field {f} this reader does not know"),
            }
        }
        match (simple, strings) {
            (Some(v), None) => event.scalars.push((tag, v)),
            (None, Some(s)) => event.texts.push((tag, plugin, s)),
            _ => anyhow::bail!("value {tag:?}: neither a simple value nor a tensor"),
        }
    }
    Ok(())
}

/// SummaryMetadata → PluginData → plugin_name.
fn plugin_name(metadata: &[u8]) -> anyhow::Result<String> {
    for (field, value) in fields(metadata)? {
        if let (1, Value::Bytes(data)) = (field, value) {
            for (field, value) in fields(data)? {
                if let (1, Value::Bytes(name)) = (field, value) {
                    return text(name);
                }
            }
        }
    }
    Ok(String::new())
}

/// A TensorProto of DT_STRING: its string_val.
fn tensor_strings(tensor: &[u8]) -> anyhow::Result<Vec<String>> {
    let mut strings = Vec::new();
    for (field, value) in fields(tensor)? {
        match (field, value) {
            (1, Value::Varint(dtype)) => {
                anyhow::ensure!(dtype == 7, "a tensor of dtype {dtype}, not DT_STRING")
            }
            (2, Value::Bytes(_)) => {}
            (8, Value::Bytes(b)) => strings.push(text(b)?),
            (f, _) => anyhow::bail!("a TensorProto field {f} this reader does not know"),
        }
    }
    Ok(strings)
}
