//! Mistral: Llama with a sliding window on every layer (keys more than `sliding_window - 1`
//! positions back are masked, as HF does); v0.3 and Nemo set `sliding_window: null`. llama.cpp
//! writes it as a Llama.

use anyhow::Result;
use serde_json::{json, Value as Json};

use crate::arch::config::ModelConfig;
use crate::arch::description::Architecture;
use crate::arch::family::{Converter, Family, Gguf, HeadDim, SpacePrefix, Tensors, Training};
use crate::arch::gguf_header::GgufHeader;

pub const MISTRAL: Family = Family {
    class: "MistralForCausalLM",
    model_types: &["mistral"],
    describe,
    tied_by_default: false,
    gguf: Gguf {
        name: "mistral",
        also_read_from: Some(("llama", "mistral")),
        written_as: "llama",
        converter: Converter::Llama,
        permutes_qk: true,
        stored_norm_offset: 0.0,
        tensors: Tensors { post_norms: false, qk_norm: false, qkv_bias: false },
        head_dim: HeadDim::RopeDimensionCount,
        default_rope_theta: 10_000.0,
        rope_per_layer_kind: false,
        import,
    },
    space_prefix: SpacePrefix::FromTokenizerConfig,
    training: Training { compute_dtype: "f16", compute_dtype_reason: None, folds_system_message: false },
};

fn describe(c: &ModelConfig) -> Result<Architecture> {
    let mut a = Architecture::llama(c)?;
    a.windows = vec![c.sliding_window; c.num_hidden_layers];
    Ok(a)
}

/// MistralConfig's keys beyond every family's: the window as the file states it.
fn import(m: &GgufHeader, config: &mut Json) -> Result<()> {
    config["head_dim"] = json!(m.head_dim);
    config["attention_bias"] = json!(false);
    config["hidden_act"] = json!("silu");
    config["sliding_window"] = json!(m.sliding_window);
    Ok(())
}
