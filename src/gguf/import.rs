//! `lora-ft import FILE.gguf OUTDIR`: turn a llama.cpp GGUF file of a Llama (2, 3.x), Mistral,
//! Qwen2, Qwen3, Gemma 2 or Gemma 3 model into a Hugging Face folder (config.json, f32
//! model.safetensors, tokenizer.json, tokenizer_config.json, generation_config.json) that agrees
//! with transformers' own GGUF loader (`from_pretrained(dir, gguf_file=...)`): same config, same
//! dequantized weights with llama.cpp's Q/K row permutation and Gemma's norm offset undone, same
//! token ids; where that loader drops what llama.cpp reads (RoPE scaling, Qwen3's head_dim,
//! Gemma's softcaps), config.json says what llama.cpp runs.

mod hparams;
pub(super) mod rope;
mod spm;
mod tokenizer;
mod tokenizer_files;
mod weights;

use super::format::metadata::Metadata;
use super::format::rope_freqs::ROPE_FREQS;
use crate::arch::families::{by_gguf_name, listed, FAMILIES};
use crate::arch::family::Family;
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use hparams::ModelShape;
use serde_json::{json, Value as Json};
use std::path::Path;

/// What one import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    /// The Hugging Face class, e.g. `LlamaForCausalLM` or `Gemma2ForCausalLM`.
    pub architecture: String,
    pub tensors: usize,
    pub parameters: u64,
    pub vocab_size: usize,
    /// Size of model.safetensors in bytes.
    pub weights_bytes: u64,
}

/// Import `gguf` into `out_dir` (created if missing; existing files of the same names are
/// replaced).
pub fn import_gguf(gguf: &Path, out_dir: &Path) -> Result<ImportSummary> {
    let (mut file, content) = open(gguf)?;
    let meta = Metadata { file: gguf, map: &content.metadata };
    if content.tensor_infos.is_empty() && content.metadata.contains_key("tokenizer.ggml.tokens") {
        return import_vocabulary(&meta, out_dir);
    }
    let Header { family, shape, tokenizer, config } = header(gguf, &mut file, &content)?;

    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("creating output folder {}", out_dir.display()))?;
    let heads = weights::Heads { attention: shape.heads, key_value: shape.kv_heads };
    let written = weights::write_safetensors(gguf, &mut file, &content, family, heads, out_dir)?;
    write_json(&out_dir.join("config.json"), &config)?;
    write_json(&out_dir.join("generation_config.json"), &generation_config(&config))?;
    write_json(&out_dir.join("tokenizer.json"), &tokenizer.tokenizer)?;
    write_json(&out_dir.join("tokenizer_config.json"), &tokenizer.tokenizer_config)?;
    Ok(ImportSummary {
        architecture: family.class.to_string(),
        tensors: written.tensors,
        parameters: written.parameters,
        vocab_size: tokenizer.vocab_size,
        weights_bytes: written.bytes,
    })
}

/// The config.json and tokenizer_config.json that `import_gguf` writes, from the file's metadata
/// alone (of the tensors only llama.cpp's small `rope_freqs` is read): for planning a run on a
/// GGUF model before importing its weights.
pub fn read_configs(gguf: &Path) -> Result<(Json, Json)> {
    let (mut file, content) = open(gguf)?;
    let header = header(gguf, &mut file, &content)?;
    Ok((header.config, header.tokenizer.tokenizer_config))
}

fn open(gguf: &Path) -> Result<(std::fs::File, Content)> {
    let mut file =
        std::fs::File::open(gguf).with_context(|| format!("opening GGUF file {}", gguf.display()))?;
    let content =
        Content::read(&mut file).with_context(|| format!("reading the GGUF header of {}", gguf.display()))?;
    Ok((file, content))
}

/// What a model file's metadata says: its architecture and sizes, tokenizer and config.json.
struct Header {
    family: &'static Family,
    shape: ModelShape,
    tokenizer: tokenizer_files::TokenizerFiles,
    config: Json,
}

fn header(gguf: &Path, file: &mut std::fs::File, content: &Content) -> Result<Header> {
    let meta = Metadata { file: gguf, map: &content.metadata };
    let (family, prefix) = read_family(&meta)?;
    let shape = ModelShape::read(&meta, family, &prefix)?;
    let tokenizer = tokenizer::convert(&meta, shape.context_length)?;
    let rope_freqs = match content.tensor_infos.contains_key(ROPE_FREQS) {
        true => Some(weights::read_f32(gguf, file, content, ROPE_FREQS)?),
        false => None,
    };
    let inputs = hparams::Inputs {
        family,
        prefix: &prefix,
        shape: &shape,
        has_output: content.tensor_infos.contains_key("output.weight"),
        tokens: tokenizer.vocab_size,
        rope_freqs,
    };
    let config = hparams::model_config(&meta, &inputs)?;
    Ok(Header { family, shape, tokenizer, config })
}

/// The family a file holds (`general.architecture`, and `general.name` where a declaration claims
/// files of another architecture by it, as Mistral's "llama" files), and the prefix of the
/// model's own keys: the architecture as the file states it.
fn read_family(meta: &Metadata) -> Result<(&'static Family, String)> {
    let key = "general.architecture";
    let name = meta.opt_string("general.name")?.unwrap_or_default().to_lowercase();
    let arch = meta.string(key)?;
    let Some(family) = by_gguf_name(arch, &name) else {
        let names: Vec<String> = FAMILIES.iter().map(|f| format!("{:?}", f.gguf.name)).collect();
        bail!("{}: GGUF key `{key}` is {arch:?}; lora-ft imports {}", meta.file.display(), listed(&names));
    };
    Ok((family, arch.to_string()))
}

/// A vocabulary-only file (llama.cpp's `models/ggml-vocab-*.gguf`, written by
/// `convert_hf_to_gguf.py --vocab-only`) of any architecture: only the tokenizer files.
fn import_vocabulary(meta: &Metadata, out_dir: &Path) -> Result<ImportSummary> {
    let arch = meta.string("general.architecture")?;
    let context_length = meta.uint(&format!("{arch}.context_length"))?;
    let tokenizer = tokenizer::convert(meta, context_length)?;
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("creating output folder {}", out_dir.display()))?;
    write_json(&out_dir.join("tokenizer.json"), &tokenizer.tokenizer)?;
    write_json(&out_dir.join("tokenizer_config.json"), &tokenizer.tokenizer_config)?;
    Ok(ImportSummary {
        architecture: format!("none (vocabulary only, {arch})"),
        tensors: 0,
        parameters: 0,
        vocab_size: tokenizer.vocab_size,
        weights_bytes: 0,
    })
}

fn generation_config(config: &Json) -> Json {
    let mut generation = json!({ "_from_model_config": true });
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        if !config[key].is_null() {
            generation[key] = config[key].clone();
        }
    }
    generation
}

fn write_json(path: &Path, value: &Json) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}
