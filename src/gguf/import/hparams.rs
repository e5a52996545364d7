//! `<arch>.*` hyperparameters → config.json, keyed as transformers 5.17 writes each family's
//! config (`integrations/ggml.py` GGUF_CONFIG_MAPPING for what its loader maps; llama.cpp's
//! `llama-model.cpp` for what that loader drops: RoPE scaling, Qwen3's head_dim, Gemma's
//! softcaps, local RoPE base and attention scale).

use super::rope;
use crate::gguf::format::architecture::Architecture;
use crate::gguf::format::metadata::Metadata;
use anyhow::{bail, Result};
use candle_core::quantized::gguf_file::Value;
use serde_json::{json, Map, Value as Json};

/// The hyperparameters under `<arch>.*`.
pub(super) struct ModelShape {
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: u64,
    pub context_length: u64,
    pub rms_norm_eps: f64,
    pub rope_theta: Option<f64>,
    pub vocab_size: Option<u64>,
    pub sliding_window: Option<u64>,
}

impl ModelShape {
    pub fn read(meta: &Metadata, arch: Architecture, prefix: &str) -> Result<Self> {
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
        let key_length = meta.opt_uint(&key("attention.key_length"))?;
        let head_dim = match arch {
            // transformers maps rope.dimension_count to head_dim for llama/mistral
            Architecture::Llama | Architecture::Mistral => meta.opt_uint(&key("rope.dimension_count"))?,
            // Qwen2Config has no head_dim: it is hidden / heads
            Architecture::Qwen2 => {
                if let Some(k) = key_length.filter(|&k| k != hidden / heads) {
                    bail!(
                        "{}: GGUF key `{}` = {k} differs from embedding_length / head_count = {}, \
                         which Qwen2 cannot express",
                        meta.file.display(),
                        key("attention.key_length"),
                        hidden / heads
                    );
                }
                None
            }
            // llama.cpp's n_embd_head_k
            Architecture::Qwen3 | Architecture::Gemma2 | Architecture::Gemma3 => key_length,
        };
        Ok(Self {
            hidden,
            intermediate: meta.uint(&key("feed_forward_length"))?,
            layers: meta.uint(&key("block_count"))?,
            heads: heads as usize,
            kv_heads: kv_heads as usize,
            head_dim: head_dim.unwrap_or(hidden / heads),
            context_length: meta.uint(&key("context_length"))?,
            rms_norm_eps: meta.float(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: meta.opt_float(&key("rope.freq_base"))?,
            vocab_size: meta.opt_uint(&key("vocab_size"))?,
            sliding_window: meta.opt_uint(&key("attention.sliding_window"))?,
        })
    }
}

/// What config.json is built from besides the metadata.
pub(super) struct Inputs<'a> {
    pub arch: Architecture,
    pub prefix: &'a str,
    pub shape: &'a ModelShape,
    pub has_output: bool,
    pub tokens: usize,
    /// The `rope_freqs.weight` tensor (Llama 3.x), if the file has one.
    pub rope_freqs: Option<Vec<f32>>,
}

pub(super) fn model_config(meta: &Metadata, inputs: &Inputs) -> Result<Json> {
    let Inputs { arch, shape, .. } = *inputs;
    let mut config = json!({
        "architectures": [arch.class_name()],
        "model_type": arch.model_type(),
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": shape.context_length,
        "rms_norm_eps": shape.rms_norm_eps,
        "vocab_size": shape.vocab_size.unwrap_or(inputs.tokens as u64),
        // llama.cpp writes `output.weight` only when it is not the embedding matrix
        "tie_word_embeddings": !inputs.has_output,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "torch_dtype": "float32",
    });
    if arch != Architecture::Qwen2 {
        config["head_dim"] = json!(shape.head_dim);
        config["attention_bias"] = json!(false);
    }
    if arch.is_gemma() {
        config["hidden_activation"] = json!("gelu_pytorch_tanh");
    } else {
        config["hidden_act"] = json!("silu");
    }
    let layers = shape.layers as usize;
    match arch {
        Architecture::Llama => config["mlp_bias"] = json!(false),
        Architecture::Mistral => config["sliding_window"] = json!(shape.sliding_window),
        Architecture::Qwen2 | Architecture::Qwen3 => {
            // what Qwen2Config/Qwen3Config write without use_sliding_window
            config["use_sliding_window"] = json!(false);
            config["sliding_window"] = Json::Null;
            config["max_window_layers"] = json!(28);
            config["layer_types"] = layer_types(layers, |_| false);
        }
        Architecture::Gemma2 | Architecture::Gemma3 => gemma(meta, inputs, &mut config)?,
    }
    rope_parameters(meta, inputs, &mut config)?;
    for (name, key) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ] {
        config[name] = json!(meta.opt_uint(key)?);
    }
    Ok(config)
}

/// Gemma 2 / 3: llama.cpp's `llm_load_hparams` rules. Gemma 2 alternates local and global layers
/// (even layers local), Gemma 3 has five local layers to one global; the attention scale is
/// 1/sqrt(head_dim) except for the 27B models (46 / 62 layers), which use hidden / heads.
fn gemma(meta: &Metadata, inputs: &Inputs, config: &mut Json) -> Result<()> {
    let layers = inputs.shape.layers as usize;
    let (arch, shape) = (inputs.arch, inputs.shape);
    let key = |name: &str| format!("{}.{name}", inputs.prefix);
    let is_27b = match arch {
        Architecture::Gemma2 => shape.layers == 46,
        _ => shape.layers == 62,
    };
    let scalar = if is_27b { shape.hidden / shape.heads as u64 } else { shape.head_dim };
    config["query_pre_attn_scalar"] = json!(scalar);
    let final_cap = meta.opt_float(&key("final_logit_softcapping"))?.filter(|&c| c != 0.0);
    if arch == Architecture::Gemma2 {
        // llama.cpp's defaults when the keys are absent, as Gemma2Config's
        let attn_cap = meta.opt_float(&key("attn_logit_softcapping"))?.unwrap_or(50.0);
        config["attn_logit_softcapping"] = json!(attn_cap);
        config["final_logit_softcapping"] = json!(final_cap.or(Some(30.0)));
        config["sliding_window"] = json!(shape.sliding_window.unwrap_or(4096));
        let local = sliding_layers(meta, &key("attention.sliding_window_pattern"), layers, 2)?;
        config["layer_types"] = layer_types(layers, |l| local[l]);
    } else {
        config["attn_logit_softcapping"] = Json::Null;
        config["final_logit_softcapping"] = json!(final_cap);
        match shape.sliding_window.filter(|&w| w > 0) {
            Some(window) => {
                config["sliding_window"] = json!(window);
                let local = sliding_layers(meta, &key("attention.sliding_window_pattern"), layers, 6)?;
                config["layer_types"] = layer_types(layers, |l| local[l]);
            }
            None => {
                config["sliding_window"] = Json::Null;
                config["layer_types"] = layer_types(layers, |_| false);
            }
        }
    }
    Ok(())
}

/// Which layers slide, as llama.cpp's `load_swa_pattern` reads `key`: one bool (or 0/1) per layer,
/// or a period n (every n-th layer global, the last of each n), else the architecture's period.
fn sliding_layers(meta: &Metadata, key: &str, layers: usize, default_period: u64) -> Result<Vec<bool>> {
    if let Some(items) = meta.array(key)? {
        if items.len() != layers {
            bail!(
                "{}: GGUF key `{key}` has {} entries for {layers} layers",
                meta.file.display(),
                items.len()
            );
        }
        return items
            .iter()
            .map(|item| match item {
                Value::Bool(b) => Ok(*b),
                Value::U32(v) => Ok(*v != 0),
                Value::I32(v) => Ok(*v != 0),
                other => bail!("{}: GGUF key `{key}` holds {:?}", meta.file.display(), other.value_type()),
            })
            .collect();
    }
    let period = meta.opt_uint(key)?.unwrap_or(default_period);
    Ok((0..layers as u64).map(|l| period == 0 || l % period < period - 1).collect())
}

/// transformers' `layer_types`: each layer's attention, local where `sliding(layer)`.
fn layer_types(layers: usize, sliding: impl Fn(usize) -> bool) -> Json {
    (0..layers).map(|l| if sliding(l) { "sliding_attention" } else { "full_attention" }).collect()
}

/// `rope_parameters` (and the top-level `rope_theta` older readers take); Gemma 3 has one set
/// for global and one for local layers, the scaling on the global ones only, as llama.cpp runs
/// them (local base `rope.freq_base_swa`, else 10000).
fn rope_parameters(meta: &Metadata, inputs: &Inputs, config: &mut Json) -> Result<()> {
    let (arch, prefix, shape) = (inputs.arch, inputs.prefix, inputs.shape);
    // transformers' config defaults where the file states no base
    let default_theta = if arch == Architecture::Gemma3 { 1_000_000.0 } else { 10_000.0 };
    let theta = shape.rope_theta.unwrap_or(default_theta);
    let mut params: Map<String, Json> = rope::from_metadata(meta, prefix)?;
    if let Some(factors) = &inputs.rope_freqs {
        if !arch.permutes_qk() {
            bail!(
                "{}: tensor `rope_freqs.weight` in a {:?} file: only Llama 3.x files carry RoPE factors",
                meta.file.display(),
                arch.model_type()
            );
        }
        if params["rope_type"] != "default" {
            bail!(
                "{}: both `{prefix}.rope.scaling.type` and tensor `rope_freqs.weight`: one RoPE \
                 scaling only",
                meta.file.display()
            );
        }
        if let Some(llama3) = rope::llama3_from_factors(meta, prefix, factors, theta, shape.head_dim)? {
            params = llama3;
        }
    }
    params.insert("rope_theta".into(), json!(theta));
    if arch == Architecture::Gemma3 {
        let local = meta.opt_float(&format!("{prefix}.rope.freq_base_swa"))?.unwrap_or(10_000.0);
        config["rope_parameters"] = json!({
            "full_attention": params,
            "sliding_attention": { "rope_type": "default", "rope_theta": local },
        });
    } else {
        config["rope_theta"] = json!(theta);
        config["rope_parameters"] = Json::Object(params);
    }
    Ok(())
}
