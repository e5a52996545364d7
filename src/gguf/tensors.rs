//! GGUF tensors → one f32 model.safetensors with Hugging Face names, written one tensor at a time
//! (the dequantized model never exists whole in memory).

use super::arch::Architecture;
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

/// llama.cpp's Llama 3 RoPE factors: read into config.json (`rope.rs`), not a weight.
pub(super) const ROPE_FREQS: &str = "rope_freqs.weight";

/// The Hugging Face name of a llama.cpp tensor of `arch`, e.g. `blk.3.attn_q.weight` →
/// `model.layers.3.self_attn.q_proj.weight`. `None` for a name this importer does not know.
pub(super) fn hf_tensor_name(arch: Architecture, gguf_name: &str) -> Option<String> {
    if let Some((_, hf)) = FIXED_NAMES.iter().find(|(gguf, _)| *gguf == gguf_name) {
        return Some(hf.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    Some(format!("model.layers.{layer}.{}", arch.layer_tensor(part)?))
}

/// The llama.cpp name of a Hugging Face tensor of `arch`, the inverse of `hf_tensor_name`
/// (`model.layers.3.self_attn.q_proj.weight` → `blk.3.attn_q.weight`).
pub(super) fn gguf_tensor_name(arch: Architecture, hf_name: &str) -> Option<String> {
    if let Some((gguf, _)) = FIXED_NAMES.iter().find(|(_, hf)| *hf == hf_name) {
        return Some(gguf.to_string());
    }
    let rest = hf_name.strip_prefix("model.layers.")?;
    let (layer, module) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let part = LAYER_PARTS.iter().find(|part| arch.layer_tensor(part).as_deref() == Some(module))?;
    Some(format!("blk.{layer}.{part}"))
}

/// The tensors outside the layers, (llama.cpp, Hugging Face).
const FIXED_NAMES: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Every per-layer llama.cpp tensor `Architecture::layer_tensor` knows, of any family.
const LAYER_PARTS: [&str; 16] = [
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_output.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "attn_norm.weight",
    "ffn_norm.weight",
    "post_attention_norm.weight",
    "post_ffw_norm.weight",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
];

/// How many head groups a tensor's rows were permuted in (Q: all heads, K: the KV heads), for
/// the families llama.cpp permutes.
fn permuted_heads(arch: Architecture, gguf_name: &str, heads: Heads) -> Option<usize> {
    if !arch.permutes_qk() {
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
    arch: Architecture,
    heads: Heads,
    out_dir: &Path,
) -> Result<Written> {
    let entries = plan(file, content, arch, heads)?;
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
    arch: Architecture,
    heads: Heads,
) -> Result<BTreeMap<String, Entry<'a>>> {
    let mut entries = BTreeMap::new();
    for (gguf_name, info) in &content.tensor_infos {
        if gguf_name == ROPE_FREQS {
            continue;
        }
        let Some(hf_name) = hf_tensor_name(arch, gguf_name) else {
            bail!(
                "{}: tensor `{gguf_name}` has no {} counterpart (MoE experts, vision towers and \
                 other architectures are not supported)",
                file.display(),
                arch.class_name()
            );
        };
        let shape = info.shape.dims().to_vec();
        let permute = permuted_heads(arch, gguf_name, heads);
        // transformers subtracts 1 from every Gemma tensor whose name has "norm.weight"
        let offset = if gguf_name.contains("norm.weight") { arch.stored_norm_offset() } else { 0.0 };
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

/// Undo llama.cpp's `permute` of Q/K rows, as transformers' `_reverse_permute_weights` does:
/// within each of `n_head` groups, HF row `(j, d)` (j < 2, d < half) is GGUF row `(d, j)`.
pub(super) fn unpermute_rows(values: &[f32], rows: usize, n_head: usize) -> Vec<f32> {
    reorder_rows(values, rows, |row| gguf_row_of(row, rows, n_head))
}

/// llama.cpp's `LlamaModel.permute` of Q/K rows (convert_hf_to_gguf.py): `reshape(n_head, 2,
/// half, cols).swapaxes(1, 2)`, GGUF row `(d, j)` is HF row `(j, d)`; the inverse of
/// `unpermute_rows`. `rows` must split into `n_head` groups of even size.
pub(super) fn permute_rows(values: &[f32], rows: usize, n_head: usize) -> Vec<f32> {
    let mut hf_row = vec![0; rows];
    for row in 0..rows {
        hf_row[gguf_row_of(row, rows, n_head)] = row;
    }
    reorder_rows(values, rows, |row| hf_row[row])
}

/// The GGUF row holding HF row `row` of a permuted Q/K weight.
fn gguf_row_of(row: usize, rows: usize, n_head: usize) -> usize {
    let half = rows / n_head / 2;
    let (head, within) = (row / (2 * half), row % (2 * half));
    let (j, d) = (within / half, within % half);
    head * 2 * half + d * 2 + j
}

/// Row `r` of the result is row `source(r)` of `values`.
fn reorder_rows(values: &[f32], rows: usize, source: impl Fn(usize) -> usize) -> Vec<f32> {
    let cols = values.len() / rows;
    let mut out = Vec::with_capacity(values.len());
    for row in 0..rows {
        let from = source(row);
        out.extend_from_slice(&values[from * cols..(from + 1) * cols]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hugging_face() {
        use Architecture::*;
        let name = |arch, gguf: &str| hf_tensor_name(arch, gguf);
        assert_eq!(name(Llama, "token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert_eq!(name(Llama, "output.weight").unwrap(), "lm_head.weight");
        assert_eq!(
            name(Llama, "blk.12.attn_output.weight").unwrap(),
            "model.layers.12.self_attn.o_proj.weight"
        );
        assert_eq!(
            name(Llama, "blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(name(Llama, "blk.x.attn_q.weight"), None);
        assert_eq!(name(Llama, "blk.0.attn_q.bias"), None);
        assert_eq!(name(Llama, "blk.0.attn_q_norm.weight"), None);
        assert_eq!(name(Llama, "rope_freqs.weight"), None);
        // Qwen2: q/k/v biases, no output bias
        assert_eq!(name(Qwen2, "blk.1.attn_k.bias").unwrap(), "model.layers.1.self_attn.k_proj.bias");
        assert_eq!(name(Qwen2, "blk.1.attn_output.bias"), None);
        assert_eq!(name(Qwen3, "blk.1.attn_k.bias"), None);
        assert_eq!(
            name(Qwen3, "blk.1.attn_k_norm.weight").unwrap(),
            "model.layers.1.self_attn.k_norm.weight"
        );
        // Gemma: ffn_norm is the norm before the MLP, two more norms after the sub-layers
        assert_eq!(
            name(Gemma2, "blk.2.ffn_norm.weight").unwrap(),
            "model.layers.2.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            name(Gemma2, "blk.2.post_attention_norm.weight").unwrap(),
            "model.layers.2.post_attention_layernorm.weight"
        );
        assert_eq!(
            name(Gemma2, "blk.2.post_ffw_norm.weight").unwrap(),
            "model.layers.2.post_feedforward_layernorm.weight"
        );
        assert_eq!(name(Gemma2, "blk.2.attn_q_norm.weight"), None);
        assert_eq!(
            name(Gemma3, "blk.2.attn_q_norm.weight").unwrap(),
            "model.layers.2.self_attn.q_norm.weight"
        );
        assert_eq!(name(Qwen2, "blk.2.post_ffw_norm.weight"), None);
    }

    /// Export names every tensor the import reads back under the same Hugging Face name.
    #[test]
    fn gguf_names_invert_hugging_face_names() {
        use Architecture::*;
        for arch in [Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3] {
            let layer_names = LAYER_PARTS.iter().map(|part| format!("blk.7.{part}"));
            for gguf in layer_names.chain(FIXED_NAMES.iter().map(|(gguf, _)| gguf.to_string())) {
                if let Some(hf) = hf_tensor_name(arch, &gguf) {
                    assert_eq!(gguf_tensor_name(arch, &hf).as_deref(), Some(gguf.as_str()), "{arch:?}");
                }
            }
        }
        assert_eq!(
            gguf_tensor_name(Llama, "model.layers.0.mlp.up_proj.weight").unwrap(),
            "blk.0.ffn_up.weight"
        );
        assert_eq!(gguf_tensor_name(Llama, "model.layers.0.self_attn.q_norm.weight"), None);
        assert_eq!(gguf_tensor_name(Llama, "model.rotary_emb.inv_freq"), None);
    }

    /// llama.cpp's permute (convert_hf_to_gguf.py): reshape(n_head, 2, half, cols)
    /// .swapaxes(1, 2); unpermute must be its exact inverse.
    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (n_head, half, cols) = (3, 4, 2);
        let rows = n_head * 2 * half;
        let hf: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let mut gguf = vec![0.0; hf.len()];
        for h in 0..n_head {
            for j in 0..2 {
                for d in 0..half {
                    let hf_row = h * 2 * half + j * half + d;
                    let gguf_row = h * 2 * half + d * 2 + j;
                    gguf[gguf_row * cols..(gguf_row + 1) * cols]
                        .copy_from_slice(&hf[hf_row * cols..(hf_row + 1) * cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, rows, n_head), hf);
        assert_eq!(permute_rows(&hf, rows, n_head), gguf);
        // HF row 1 (first half, d=1) comes from GGUF row 2; HF row 4 (second half, d=0) from row 1
        assert_eq!(unpermute_rows(&gguf, rows, n_head)[cols], gguf[2 * cols]);
        assert_eq!(unpermute_rows(&gguf, rows, n_head)[4 * cols], gguf[cols]);
    }

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
