//! The weights: GGUF tensors → one f32 model.safetensors with Hugging Face names, written one
//! tensor at a time (the dequantized model never exists whole in memory).

use crate::arch::family::Family;
use crate::gguf::format::qk_permutation::unpermute_rows;
use crate::gguf::format::rope_freqs::ROPE_FREQS;
use crate::gguf::format::tensor_names::hf_tensor_name;
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::Device;
use std::collections::BTreeMap;
use std::io::{BufWriter, Read, Seek, Write};
use std::path::Path;

/// Attention head counts, needed to undo llama.cpp's Q/K permutation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Heads {
    pub attention: usize,
    pub key_value: usize,
}

pub(super) struct Written {
    pub tensors: usize,
    pub parameters: u64,
    pub bytes: u64,
}

/// How many head groups a tensor's rows were permuted in (Q: all heads, K: the KV heads), for
/// the families llama.cpp permutes.
fn permuted_heads(family: &Family, gguf_name: &str, heads: Heads) -> Option<usize> {
    if !family.gguf.permutes_qk {
        None
    } else if gguf_name.ends_with(".attn_q.weight") {
        Some(heads.attention)
    } else if gguf_name.ends_with(".attn_k.weight") {
        Some(heads.key_value)
    } else {
        None
    }
}

struct Entry<'a> {
    gguf_name: &'a str,
    shape: Vec<usize>,
    permute: Option<usize>,
    /// Subtracted from every value (Gemma's norms are stored as w + 1).
    offset: f32,
}

impl Entry<'_> {
    fn byte_len(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * 4
    }
}

pub(super) fn write_safetensors<R: Read + Seek>(
    file: &Path,
    reader: &mut R,
    content: &Content,
    family: &Family,
    heads: Heads,
    out_dir: &Path,
) -> Result<Written> {
    let entries = plan(file, content, family, heads)?;
    let target = out_dir.join("model.safetensors");
    let partial = out_dir.join("model.safetensors.partial");
    // a full disk or a bad tensor leaves no half-written file behind
    let parameters = write_entries(file, reader, content, &entries, &partial).inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    std::fs::rename(&partial, &target)
        .with_context(|| format!("renaming {} to {}", partial.display(), target.display()))?;
    let bytes = std::fs::metadata(&target)?.len();
    Ok(Written { tensors: entries.len(), parameters, bytes })
}

/// Writes the safetensors file of `entries` to `partial`; returns the number of parameters.
fn write_entries<R: Read + Seek>(
    file: &Path,
    reader: &mut R,
    content: &Content,
    entries: &BTreeMap<String, Entry<'_>>,
    partial: &Path,
) -> Result<u64> {
    let io = |e: std::io::Error| anyhow::Error::from(e).context(format!("writing {}", partial.display()));
    let mut out = BufWriter::new(std::fs::File::create(partial).map_err(io)?);
    let header = header(entries)?;
    out.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    out.write_all(&header).map_err(io)?;
    let mut parameters = 0u64;
    for entry in entries.values() {
        let mut values = read_f32(file, reader, content, entry.gguf_name)?;
        if entry.offset != 0.0 {
            // as transformers' Gemma2TensorProcessor: `weights - 1` in f32
            values.iter_mut().for_each(|v| *v -= entry.offset);
        }
        let values = match entry.permute {
            Some(n_head) => unpermute_rows(&values, entry.shape[0], n_head),
            None => values,
        };
        parameters += values.len() as u64;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        out.write_all(&bytes).map_err(io)?;
    }
    out.flush().map_err(io)?;
    Ok(parameters)
}

/// One tensor of the file, dequantized to f32 in its stored (row-major) order.
pub(super) fn read_f32<R: Read + Seek>(
    file: &Path,
    reader: &mut R,
    content: &Content,
    gguf_name: &str,
) -> Result<Vec<f32>> {
    let info = &content.tensor_infos[gguf_name];
    let qtensor = info
        .read(reader, content.tensor_data_offset, &Device::Cpu)
        .with_context(|| format!("{}: reading tensor {gguf_name}", file.display()))?;
    qtensor
        .dequantize(&Device::Cpu)
        .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
        .with_context(|| format!("{}: dequantizing tensor {gguf_name}", file.display()))
}

/// Every tensor of the file with its HF name (sorted, as safetensors files usually are); an
/// unknown tensor is an error, since skipping it would silently change the model.
fn plan<'a>(
    file: &Path,
    content: &'a Content,
    family: &Family,
    heads: Heads,
) -> Result<BTreeMap<String, Entry<'a>>> {
    let mut entries = BTreeMap::new();
    for (gguf_name, info) in &content.tensor_infos {
        if gguf_name == ROPE_FREQS {
            continue;
        }
        let Some(hf_name) = hf_tensor_name(family.gguf.tensors, gguf_name) else {
            bail!(
                "{}: tensor `{gguf_name}` has no {} counterpart (MoE experts, vision towers and \
                 other architectures are not supported)",
                file.display(),
                family.class
            );
        };
        let shape = info.shape.dims().to_vec();
        let permute = permuted_heads(family, gguf_name, heads);
        // transformers subtracts 1 from every Gemma tensor whose name has "norm.weight"
        let offset = if gguf_name.contains("norm.weight") { family.gguf.stored_norm_offset } else { 0.0 };
        if let Some(n_head) = permute {
            if shape.len() != 2 || n_head == 0 || shape[0] % (2 * n_head) != 0 {
                bail!(
                    "{}: tensor `{gguf_name}` of shape {shape:?} cannot be split into {n_head} \
                     heads of even size (check attention.head_count / head_count_kv)",
                    file.display()
                );
            }
        }
        entries.insert(hf_name, Entry { gguf_name: gguf_name.as_str(), shape, permute, offset });
    }
    Ok(entries)
}

/// The safetensors header: JSON with dtype, shape and byte range per tensor, padded with spaces
/// to a multiple of 8 bytes.
fn header(entries: &BTreeMap<String, Entry>) -> Result<Vec<u8>> {
    let mut map = serde_json::Map::new();
    map.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
    let mut offset = 0u64;
    for (name, entry) in entries {
        let end = offset + entry.byte_len();
        map.insert(
            name.clone(),
            serde_json::json!({ "dtype": "F32", "shape": entry.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut bytes = serde_json::to_vec(&map)?;
    bytes.resize(bytes.len().div_ceil(8) * 8, b' ');
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_padded_and_contiguous() {
        let mut entries = BTreeMap::new();
        entries
            .insert("a".to_string(), Entry { gguf_name: "x", shape: vec![2, 3], permute: None, offset: 0.0 });
        entries.insert("b".to_string(), Entry { gguf_name: "y", shape: vec![5], permute: None, offset: 0.0 });
        let bytes = header(&entries).unwrap();
        assert_eq!(bytes.len() % 8, 0);
        let parsed: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(parsed["a"]["data_offsets"], serde_json::json!([0, 24]));
        assert_eq!(parsed["b"]["data_offsets"], serde_json::json!([24, 44]));
    }
}
