//! `<arch>.*` hyperparameters → config.json, keyed as transformers 5.17 writes each family's
//! config (`integrations/ggml.py` GGUF_CONFIG_MAPPING for what its loader maps; llama.cpp's
//! `llama-model.cpp` for what that loader drops: RoPE scaling, Qwen3's head_dim, Gemma's
//! softcaps, local RoPE base and attention scale). What every family writes is here; each
//! family's own keys are its declaration's (`Gguf::import`, src/arch/families/).

use super::rope;
use crate::arch::family::{Family, HeadDim};
use crate::arch::gguf_header::GgufHeader;
use crate::gguf::format::metadata::Metadata;
use anyhow::{bail, Result};
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
    pub fn read(meta: &Metadata, family: &Family, prefix: &str) -> Result<Self> {
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
        let head_dim = match family.gguf.head_dim {
            HeadDim::RopeDimensionCount => meta.opt_uint(&key("rope.dimension_count"))?,
            HeadDim::HiddenOverHeads => {
                if let Some(k) = key_length.filter(|&k| k != hidden / heads) {
                    bail!(
                        "{}: GGUF key `{}` = {k} differs from embedding_length / head_count = {}, \
                         which {} cannot express",
                        meta.file.display(),
                        key("attention.key_length"),
                        hidden / heads,
                        family.class.trim_end_matches("ForCausalLM")
                    );
                }
                None
            }
            HeadDim::KeyLength => key_length,
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
    pub family: &'static Family,
    pub prefix: &'a str,
    pub shape: &'a ModelShape,
    pub has_output: bool,
    pub tokens: usize,
    /// The `rope_freqs.weight` tensor (Llama 3.x), if the file has one.
    pub rope_freqs: Option<Vec<f32>>,
}

pub(super) fn model_config(meta: &Metadata, inputs: &Inputs) -> Result<Json> {
    let Inputs { family, shape, .. } = *inputs;
    let mut config = json!({
        "architectures": [family.class],
        "model_type": family.model_types[0],
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
    let header = GgufHeader {
        keys: meta,
        prefix: inputs.prefix,
        hidden: shape.hidden,
        heads: shape.heads,
        layers: shape.layers,
        head_dim: shape.head_dim,
        sliding_window: shape.sliding_window,
    };
    (family.gguf.import)(&header, &mut config)?;
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

/// `rope_parameters` (and the top-level `rope_theta` older readers take); a family with RoPE per
/// layer kind (Gemma 3) has one set for global and one for local layers, the scaling on the
/// global ones only, as llama.cpp runs them (local base `rope.freq_base_swa`, else 10000).
fn rope_parameters(meta: &Metadata, inputs: &Inputs, config: &mut Json) -> Result<()> {
    let (family, prefix, shape) = (inputs.family, inputs.prefix, inputs.shape);
    // transformers' config defaults where the file states no base
    let theta = shape.rope_theta.unwrap_or(family.gguf.default_rope_theta);
    let mut params: Map<String, Json> = rope::from_metadata(meta, prefix)?;
    if let Some(factors) = &inputs.rope_freqs {
        if !family.gguf.permutes_qk {
            bail!(
                "{}: tensor `rope_freqs.weight` in a {:?} file: only Llama 3.x files carry RoPE factors",
                meta.file.display(),
                family.model_types[0]
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
    if family.gguf.rope_per_layer_kind {
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
