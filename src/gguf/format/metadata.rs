//! Typed reading of a GGUF file's metadata (the key/value pairs candle's `gguf_file::Content`
//! reads): every error names the file and the key. It is also what a family's GGUF import rules
//! read, through `arch::gguf_header::GgufKeys`.

use crate::arch::gguf_header::GgufKeys;
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Value;
use std::collections::HashMap;
use std::path::Path;

/// A file's metadata, and the file it came from (named in every error).
pub(crate) struct Metadata<'a> {
    pub(crate) file: &'a Path,
    pub(crate) map: &'a HashMap<String, Value>,
}

impl Metadata<'_> {
    fn require(&self, key: &str) -> Result<&Value> {
        self.map.get(key).with_context(|| format!("{}: GGUF key `{key}` is missing", self.file.display()))
    }

    fn wrong_type(&self, key: &str, value: &Value, expected: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "{}: GGUF key `{key}` holds {:?}, expected {expected}",
            self.file.display(),
            value.value_type()
        )
    }

    pub(crate) fn uint(&self, key: &str) -> Result<u64> {
        let value = self.require(key)?;
        match *value {
            Value::U8(v) => Ok(v.into()),
            Value::U16(v) => Ok(v.into()),
            Value::U32(v) => Ok(v.into()),
            Value::U64(v) => Ok(v),
            Value::I8(v) if v >= 0 => Ok(v as u64),
            Value::I16(v) if v >= 0 => Ok(v as u64),
            Value::I32(v) if v >= 0 => Ok(v as u64),
            Value::I64(v) if v >= 0 => Ok(v as u64),
            _ => Err(self.wrong_type(key, value, "a non-negative integer")),
        }
    }

    pub(crate) fn opt_uint(&self, key: &str) -> Result<Option<u64>> {
        self.map.get(key).map(|_| self.uint(key)).transpose()
    }

    pub(crate) fn float(&self, key: &str) -> Result<f64> {
        let value = self.require(key)?;
        match *value {
            Value::F32(v) => Ok(v.into()),
            Value::F64(v) => Ok(v),
            _ => Err(self.wrong_type(key, value, "a float")),
        }
    }

    pub(crate) fn opt_float(&self, key: &str) -> Result<Option<f64>> {
        self.map.get(key).map(|_| self.float(key)).transpose()
    }

    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(value) => Err(self.wrong_type(key, value, "a bool")),
        }
    }

    pub(crate) fn string(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            value => Err(self.wrong_type(key, value, "a string")),
        }
    }

    pub(crate) fn opt_string(&self, key: &str) -> Result<Option<&str>> {
        self.map.get(key).map(|_| self.string(key)).transpose()
    }

    pub(crate) fn array(&self, key: &str) -> Result<Option<&Vec<Value>>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(value) => Err(self.wrong_type(key, value, "an array")),
        }
    }

    pub(crate) fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        let strings = items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.as_str()),
                other => Err(self.wrong_type(key, other, "an array of strings")),
            })
            .collect::<Result<_>>()?;
        Ok(Some(strings))
    }

    pub(crate) fn floats(&self, key: &str) -> Result<Option<Vec<f32>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        let floats = items
            .iter()
            .map(|item| match *item {
                Value::F32(v) => Ok(v),
                Value::F64(v) => Ok(v as f32),
                _ => Err(self.wrong_type(key, item, "an array of floats")),
            })
            .collect::<Result<_>>()?;
        Ok(Some(floats))
    }

    pub(crate) fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        let ints = items
            .iter()
            .map(|item| match *item {
                Value::I32(v) => Ok(v.into()),
                Value::U32(v) => Ok(v.into()),
                Value::I64(v) => Ok(v),
                Value::I8(v) => Ok(v.into()),
                Value::U8(v) => Ok(v.into()),
                _ => Err(self.wrong_type(key, item, "an array of integers")),
            })
            .collect::<Result<_>>()?;
        Ok(Some(ints))
    }
}

impl GgufKeys for Metadata<'_> {
    fn opt_uint(&self, key: &str) -> Result<Option<u64>> {
        Metadata::opt_uint(self, key)
    }

    fn opt_float(&self, key: &str) -> Result<Option<f64>> {
        Metadata::opt_float(self, key)
    }

    fn layer_flags(&self, key: &str, layers: usize) -> Result<Option<Vec<bool>>> {
        let Some(items) = self.array(key)? else { return Ok(None) };
        if items.len() != layers {
            bail!(
                "{}: GGUF key `{key}` has {} entries for {layers} layers",
                self.file.display(),
                items.len()
            );
        }
        items
            .iter()
            .map(|item| match item {
                Value::Bool(b) => Ok(*b),
                Value::U32(v) => Ok(*v != 0),
                Value::I32(v) => Ok(*v != 0),
                other => bail!("{}: GGUF key `{key}` holds {:?}", self.file.display(), other.value_type()),
            })
            .collect::<Result<_>>()
            .map(Some)
    }
}
