//! A GGUF v3 file written as a stream (the inverse of candle's `gguf_file::Content::read`): the
//! header, the metadata key/value pairs, every tensor's info with its offset, then the tensors'
//! data, each starting on a 32-byte boundary (`general.alignment`'s default), as gguf-py's
//! `GGUFWriter` lays them out. Unlike candle's `gguf_file::write` (version 2, every tensor in
//! memory at once) the data is handed over one tensor at a time.

use anyhow::{bail, Result};
use candle_core::quantized::gguf_file::{Value, ValueType};
use candle_core::quantized::GgmlDType;
use std::io::Write;

/// `general.alignment` when the file does not set it.
const ALIGNMENT: u64 = 32;

/// One tensor's entry in the header: its GGUF name, its shape in row-major (PyTorch) order (the
/// file stores it reversed, `ne[0]` first) and its type.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: GgmlDType,
}

impl TensorInfo {
    /// Bytes of the tensor's data (whole blocks of its type).
    pub fn byte_len(&self) -> usize {
        let elements: usize = self.shape.iter().product();
        elements / self.dtype.block_size() * self.dtype.type_size()
    }
}

/// Writes the tensor data of the infos given to `header`, in their order, checking each size.
pub struct GgufWriter<W: Write> {
    out: W,
    pending: std::vec::IntoIter<TensorInfo>,
}

impl<W: Write> GgufWriter<W> {
    /// Writes everything before the tensor data; `write_tensor` then takes each tensor of
    /// `tensors` in order.
    pub fn header(mut out: W, metadata: &[(String, Value)], tensors: Vec<TensorInfo>) -> Result<Self> {
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (key, value) in metadata {
            put_string(&mut head, key);
            head.extend_from_slice(&type_id(value.value_type()).to_le_bytes());
            put_value(&mut head, key, value)?;
        }
        let mut offset = 0u64;
        for info in &tensors {
            put_string(&mut head, &info.name);
            head.extend_from_slice(&(info.shape.len() as u32).to_le_bytes());
            for &dim in info.shape.iter().rev() {
                head.extend_from_slice(&(dim as u64).to_le_bytes());
            }
            head.extend_from_slice(&ggml_type(info.dtype).to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + info.byte_len() as u64).next_multiple_of(ALIGNMENT);
        }
        head.resize((head.len() as u64).next_multiple_of(ALIGNMENT) as usize, 0);
        out.write_all(&head)?;
        Ok(Self { out, pending: tensors.into_iter() })
    }

    /// The next tensor's data, padded to the alignment.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let Some(info) = self.pending.next() else {
            bail!("tensor {name}: the header lists no more tensors")
        };
        if info.name != name || info.byte_len() != data.len() {
            bail!(
                "tensor {name} of {} bytes written where the header has {} of {} bytes",
                data.len(),
                info.name,
                info.byte_len()
            );
        }
        self.out.write_all(data)?;
        let padding = (data.len() as u64).next_multiple_of(ALIGNMENT) - data.len() as u64;
        self.out.write_all(&vec![0u8; padding as usize])?;
        Ok(())
    }

    /// The writer, once every tensor of the header is written.
    pub fn finish(self) -> Result<W> {
        if let Some(missing) = self.pending.as_slice().first() {
            bail!("tensor {} is in the header but its data was not written", missing.name);
        }
        Ok(self.out)
    }
}

/// ggml's tensor type ids (ggml.h `ggml_type`; candle keeps its own table private).
fn ggml_type(dtype: GgmlDType) -> u32 {
    match dtype {
        GgmlDType::F32 => 0,
        GgmlDType::F16 => 1,
        GgmlDType::Q4_0 => 2,
        GgmlDType::Q4_1 => 3,
        GgmlDType::Q5_0 => 6,
        GgmlDType::Q5_1 => 7,
        GgmlDType::Q8_0 => 8,
        GgmlDType::Q8_1 => 9,
        GgmlDType::Q2K => 10,
        GgmlDType::Q3K => 11,
        GgmlDType::Q4K => 12,
        GgmlDType::Q5K => 13,
        GgmlDType::Q6K => 14,
        GgmlDType::Q8K => 15,
        GgmlDType::BF16 => 30,
    }
}

/// GGUF's value type ids (gguf.h `gguf_type`).
fn type_id(value_type: ValueType) -> u32 {
    match value_type {
        ValueType::U8 => 0,
        ValueType::I8 => 1,
        ValueType::U16 => 2,
        ValueType::I16 => 3,
        ValueType::U32 => 4,
        ValueType::I32 => 5,
        ValueType::F32 => 6,
        ValueType::Bool => 7,
        ValueType::String => 8,
        ValueType::Array => 9,
        ValueType::U64 => 10,
        ValueType::I64 => 11,
        ValueType::F64 => 12,
    }
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_value(out: &mut Vec<u8>, key: &str, value: &Value) -> Result<()> {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(v) => put_string(out, v),
        Value::Array(items) => {
            let item_type = items.first().map_or(ValueType::U32, Value::value_type);
            if let Some(other) = items.iter().find(|item| item.value_type() != item_type) {
                bail!("GGUF key `{key}`: an array of {item_type:?} holds a {:?}", other.value_type());
            }
            out.extend_from_slice(&type_id(item_type).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, key, item)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::Content;
    use candle_core::Device;

    /// What we write, candle's reader reads back: keys, values, shapes, types and data.
    #[test]
    fn candle_reads_back_what_the_writer_wrote() {
        let metadata = vec![
            ("general.architecture".to_string(), Value::String("llama".into())),
            ("llama.block_count".to_string(), Value::U32(2)),
            ("llama.rope.freq_base".to_string(), Value::F32(10000.0)),
            ("tokenizer.ggml.tokens".to_string(), Value::Array(vec![Value::String("a".into()); 3])),
            ("tokenizer.ggml.token_type".to_string(), Value::Array(vec![Value::I32(1), Value::I32(3)])),
        ];
        let a: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let b: Vec<f32> = vec![0.5; 5];
        let infos = vec![
            TensorInfo { name: "a".into(), shape: vec![2, 3], dtype: GgmlDType::F32 },
            TensorInfo { name: "b".into(), shape: vec![5], dtype: GgmlDType::F32 },
        ];
        let mut writer = GgufWriter::header(Vec::new(), &metadata, infos.clone()).unwrap();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert!(writer.write_tensor("b", &bytes(&b)).is_err(), "out of order");
        let mut writer = GgufWriter::header(Vec::new(), &metadata, infos).unwrap();
        writer.write_tensor("a", &bytes(&a)).unwrap();
        let incomplete = GgufWriter { out: Vec::<u8>::new(), pending: writer.pending.clone() };
        assert!(incomplete.finish().is_err());
        writer.write_tensor("b", &bytes(&b)).unwrap();
        let file = writer.finish().unwrap();
        assert_eq!(&file[4..8], &3u32.to_le_bytes(), "version 3");

        let mut cursor = std::io::Cursor::new(&file);
        let content = Content::read(&mut cursor).unwrap();
        assert_eq!(content.tensor_data_offset % 32, 0);
        assert_eq!(content.metadata["llama.block_count"].to_u32().unwrap(), 2);
        assert_eq!(content.metadata["general.architecture"].to_string().unwrap(), "llama");
        assert_eq!(content.metadata["tokenizer.ggml.token_type"].to_vec().unwrap().len(), 2);
        let mut read = |name: &str| {
            let t = content.tensor_infos[name].read(&mut cursor, content.tensor_data_offset, &Device::Cpu);
            t.unwrap().dequantize(&Device::Cpu).unwrap()
        };
        assert_eq!(read("a").dims(), &[2, 3]);
        assert_eq!(read("a").flatten_all().unwrap().to_vec1::<f32>().unwrap(), a);
        assert_eq!(read("b").to_vec1::<f32>().unwrap(), b);
    }
}
