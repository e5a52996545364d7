//! `lora-ft import FILE.gguf OUTDIR`: turn a llama.cpp GGUF file into a Hugging Face folder
//! (config.json, f32 model.safetensors, tokenizer.json, tokenizer_config.json,
//! generation_config.json) that agrees with transformers' own GGUF loader
//! (`from_pretrained(dir, gguf_file=...)`): same config, same dequantized weights with llama.cpp's
//! Q/K row permutation undone, same token ids.

mod tensors;
mod tokenizer;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::path::Path;

pub use tensors::hf_tensor_name;

/// What one import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    /// `LlamaForCausalLM` or `MistralForCausalLM`.
    pub architecture: String,
    pub tensors: usize,
    pub parameters: u64,
    pub vocab_size: usize,
    /// Size of model.safetensors in bytes.
    pub weights_bytes: u64,
}

/// The decoder families this importer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Architecture {
    Llama,
    Mistral,
}

impl Architecture {
    fn class_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Mistral => "MistralForCausalLM",
        }
    }

    fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
        }
    }
}

/// Import `gguf` into `out_dir` (created if missing; existing files of the same names are
/// replaced).
pub fn import_gguf(gguf: &Path, out_dir: &Path) -> Result<ImportSummary> {
    let mut file =
        std::fs::File::open(gguf).with_context(|| format!("opening GGUF file {}", gguf.display()))?;
    let content =
        Content::read(&mut file).with_context(|| format!("reading the GGUF header of {}", gguf.display()))?;
    let meta = Metadata { file: gguf, map: &content.metadata };
    if content.tensor_infos.is_empty() && content.metadata.contains_key("tokenizer.ggml.tokens") {
        return import_vocabulary(&meta, out_dir);
    }
    let (arch, key_prefix) = architecture(&meta)?;
    let has_output = content.tensor_infos.contains_key("output.weight");
    let shape = ModelShape::read(&meta, &key_prefix)?;
    let tokenizer = tokenizer::convert(&meta, shape.context_length)?;
    let config = model_config(&meta, arch, &shape, has_output, tokenizer.vocab_size)?;

    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("creating output folder {}", out_dir.display()))?;
    let heads = tensors::Heads { attention: shape.heads, key_value: shape.kv_heads };
    let written = tensors::write_safetensors(gguf, &mut file, &content, heads, out_dir)?;
    write_json(&out_dir.join("config.json"), &config)?;
    write_json(&out_dir.join("generation_config.json"), &generation_config(&config))?;
    write_json(&out_dir.join("tokenizer.json"), &tokenizer.tokenizer)?;
    write_json(&out_dir.join("tokenizer_config.json"), &tokenizer.tokenizer_config)?;
    Ok(ImportSummary {
        architecture: arch.class_name().to_string(),
        tensors: written.tensors,
        parameters: written.parameters,
        vocab_size: tokenizer.vocab_size,
        weights_bytes: written.bytes,
    })
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

/// `general.architecture`, and the prefix of the model's own keys. llama.cpp writes Mistral models
/// as "llama"; only a file that says "mistral" (architecture or name) becomes MistralForCausalLM.
fn architecture(meta: &Metadata) -> Result<(Architecture, String)> {
    let key = "general.architecture";
    let name = meta.opt_string("general.name")?.unwrap_or_default().to_lowercase();
    match meta.string(key)? {
        "mistral" => Ok((Architecture::Mistral, "mistral".into())),
        "llama" if name.contains("mistral") => Ok((Architecture::Mistral, "llama".into())),
        "llama" => Ok((Architecture::Llama, "llama".into())),
        other => bail!(
            "{}: GGUF key `{key}` is {other:?}; lora-ft imports \"llama\" and \"mistral\"",
            meta.file.display()
        ),
    }
}

/// The hyperparameters under `<arch>.*`.
struct ModelShape {
    hidden: u64,
    intermediate: u64,
    layers: u64,
    heads: usize,
    kv_heads: usize,
    head_dim: u64,
    context_length: u64,
    rms_norm_eps: f64,
    rope_theta: f64,
    vocab_size: Option<u64>,
    sliding_window: Option<u64>,
}

impl ModelShape {
    fn read(meta: &Metadata, prefix: &str) -> Result<Self> {
        let key = |name: &str| format!("{prefix}.{name}");
        let hidden = meta.uint(&key("embedding_length"))?;
        let heads = meta.uint(&key("attention.head_count"))?;
        if heads == 0 || hidden % heads != 0 {
            bail!(
                "{}: GGUF key `{}` = {heads} does not divide embedding_length {hidden}",
                meta.file.display(),
                key("attention.head_count")
            );
        }
        let kv_heads = meta.opt_uint(&key("attention.head_count_kv"))?.unwrap_or(heads);
        if let Some(scaling) = meta.opt_string(&key("rope.scaling.type"))? {
            if scaling != "none" {
                bail!(
                    "{}: GGUF key `{}` = {scaling:?}: RoPE scaling is not supported by the importer",
                    meta.file.display(),
                    key("rope.scaling.type")
                );
            }
        }
        Ok(Self {
            hidden,
            intermediate: meta.uint(&key("feed_forward_length"))?,
            layers: meta.uint(&key("block_count"))?,
            heads: heads as usize,
            kv_heads: kv_heads as usize,
            head_dim: meta.opt_uint(&key("rope.dimension_count"))?.unwrap_or(hidden / heads),
            context_length: meta.uint(&key("context_length"))?,
            rms_norm_eps: meta.float(&key("attention.layer_norm_rms_epsilon"))?,
            // transformers' LlamaConfig default, used when the file states none
            rope_theta: meta.opt_float(&key("rope.freq_base"))?.unwrap_or(10000.0),
            vocab_size: meta.opt_uint(&key("vocab_size"))?,
            sliding_window: meta.opt_uint(&key("attention.sliding_window"))?,
        })
    }
}

fn model_config(
    meta: &Metadata,
    arch: Architecture,
    shape: &ModelShape,
    has_output: bool,
    tokens: usize,
) -> Result<Json> {
    let mut config = json!({
        "architectures": [arch.class_name()],
        "model_type": arch.model_type(),
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.context_length,
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_scaling": null,
        "vocab_size": shape.vocab_size.unwrap_or(tokens as u64),
        // llama.cpp writes `output.weight` only when it is not the embedding matrix
        "tie_word_embeddings": !has_output,
        "hidden_act": "silu",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "torch_dtype": "float32",
    });
    if arch == Architecture::Mistral {
        config["sliding_window"] = json!(shape.sliding_window);
    } else {
        config["mlp_bias"] = json!(false);
    }
    for (name, key) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ] {
        config[name] = json!(meta.opt_uint(key)?);
    }
    Ok(config)
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

/// Typed access to GGUF metadata; every error names the file and the key.
pub(crate) struct Metadata<'a> {
    file: &'a Path,
    map: &'a HashMap<String, Value>,
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

    fn uint(&self, key: &str) -> Result<u64> {
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

    fn opt_uint(&self, key: &str) -> Result<Option<u64>> {
        self.map.get(key).map(|_| self.uint(key)).transpose()
    }

    fn float(&self, key: &str) -> Result<f64> {
        let value = self.require(key)?;
        match *value {
            Value::F32(v) => Ok(v.into()),
            Value::F64(v) => Ok(v),
            _ => Err(self.wrong_type(key, value, "a float")),
        }
    }

    fn opt_float(&self, key: &str) -> Result<Option<f64>> {
        self.map.get(key).map(|_| self.float(key)).transpose()
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(value) => Err(self.wrong_type(key, value, "a bool")),
        }
    }

    fn string(&self, key: &str) -> Result<&str> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            value => Err(self.wrong_type(key, value, "a string")),
        }
    }

    fn opt_string(&self, key: &str) -> Result<Option<&str>> {
        self.map.get(key).map(|_| self.string(key)).transpose()
    }

    fn array(&self, key: &str) -> Result<Option<&Vec<Value>>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(value) => Err(self.wrong_type(key, value, "an array")),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
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

    fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
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
