//! The `tensorflow.Event` protobuf messages TensorBoard reads, encoded by hand: the handful of
//! fields an event file of scalars and texts needs (`tensorboard/compat/proto/event.proto`,
//! `summary.proto`, `tensor.proto`), each written as protobuf's wire format defines it.

/// Protobuf's wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LENGTH_DELIMITED: u32 = 2;
const FIXED32: u32 = 5;

/// `tensorflow.DataType.DT_STRING`.
const DT_STRING: u64 = 7;
/// `tensorflow.SessionLog.SessionStatus.START`.
const SESSION_START: u64 = 1;

/// What one event holds besides its time and step.
#[derive(Debug, Clone, PartialEq)]
pub enum What<'a> {
    /// The first event of a file: `"brain.Event:2"`.
    FileVersion(&'a str),
    /// Scalars: (tag, value) pairs of one step.
    Scalars(&'a [(&'a str, f32)]),
    /// A text summary (the text plugin's), rendered as Markdown.
    Text { tag: &'a str, text: &'a str },
    /// A restart at this step: TensorBoard drops the events of earlier files at this step and
    /// later (those a resumed run logs again).
    SessionStart,
}

/// A serialized `tensorflow.Event`, its fields in field-number order (protobuf's own encoders'
/// order, so the bytes are those TensorBoard's Python classes write).
pub fn encode(wall_time: f64, step: i64, what: &What) -> Vec<u8> {
    let mut event = Vec::new();
    key(&mut event, 1, FIXED64);
    event.extend_from_slice(&wall_time.to_le_bytes());
    // proto3 leaves a field at its default out, as TensorFlow's writers do
    if step != 0 {
        key(&mut event, 2, VARINT);
        varint(&mut event, step as u64);
    }
    match what {
        What::FileVersion(version) => bytes_field(&mut event, 3, version.as_bytes()),
        What::Scalars(scalars) => {
            let mut summary = Vec::new();
            for (tag, value) in scalars.iter() {
                let mut v = Vec::new();
                bytes_field(&mut v, 1, tag.as_bytes());
                key(&mut v, 2, FIXED32);
                v.extend_from_slice(&value.to_le_bytes());
                bytes_field(&mut summary, 1, &v);
            }
            bytes_field(&mut event, 5, &summary);
        }
        What::Text { tag, text } => {
            let mut plugin_data = Vec::new();
            bytes_field(&mut plugin_data, 1, b"text");
            let mut metadata = Vec::new();
            bytes_field(&mut metadata, 1, &plugin_data);
            // a scalar string tensor: dtype, an empty shape, one string_val
            let mut tensor = Vec::new();
            key(&mut tensor, 1, VARINT);
            varint(&mut tensor, DT_STRING);
            bytes_field(&mut tensor, 2, &[]);
            bytes_field(&mut tensor, 8, text.as_bytes());
            let mut v = Vec::new();
            bytes_field(&mut v, 1, tag.as_bytes());
            bytes_field(&mut v, 8, &tensor);
            bytes_field(&mut v, 9, &metadata);
            let mut summary = Vec::new();
            bytes_field(&mut summary, 1, &v);
            bytes_field(&mut event, 5, &summary);
        }
        What::SessionStart => {
            let mut log = Vec::new();
            key(&mut log, 1, VARINT);
            varint(&mut log, SESSION_START);
            bytes_field(&mut event, 7, &log);
        }
    }
    event
}

fn key(out: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint(out, u64::from(field << 3 | wire_type));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, LENGTH_DELIMITED);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}
