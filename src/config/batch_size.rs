//! `train.batch_size`: a number of rows, or "auto".

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// `train.batch_size`: a number of rows (at least 1, checked as it is read), or "auto".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchSize {
    Fixed(usize),
    /// The largest batch of `data.max_seq_len` tokens that fits the GPU budget, probed before
    /// training (`train::auto_batch`).
    Auto,
}

impl Serialize for BatchSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            BatchSize::Fixed(n) => s.serialize_u64(*n as u64),
            BatchSize::Auto => s.serialize_str("auto"),
        }
    }
}

impl JsonSchema for BatchSize {
    fn schema_name() -> Cow<'static, str> {
        "BatchSize".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                { "type": "integer", "minimum": 1 },
                { "const": "auto", "description": "The largest batch that fits, probed on the GPU." }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for BatchSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(BatchSizeVisitor)
    }
}

struct BatchSizeVisitor;

impl serde::de::Visitor<'_> for BatchSizeVisitor {
    type Value = BatchSize;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a positive integer or \"auto\"")
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<BatchSize, E> {
        match usize::try_from(n) {
            Ok(n) if n > 0 => Ok(BatchSize::Fixed(n)),
            _ => Err(E::custom("must be at least 1 (or \"auto\")")),
        }
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<BatchSize, E> {
        self.visit_i64(i64::try_from(n).unwrap_or(i64::MAX))
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<BatchSize, E> {
        match s {
            "auto" => Ok(BatchSize::Auto),
            _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
        }
    }
}
