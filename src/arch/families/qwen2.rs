//! Qwen2 / Qwen2.5: Llama with biases on q, k and v (always, whatever `attention_bias` says),
//! and a sliding window only with `use_sliding_window`, on the layers from `max_window_layers`
//! on (or as `layer_types` lists them), as transformers' Qwen2Config derives it.

use anyhow::{bail, Result};
use serde_json::{json, Value as Json};

use crate::arch::config::ModelConfig;
use crate::arch::description::Architecture;
use crate::arch::family::{Converter, Family, Gguf, HeadDim, SpacePrefix, Tensors, Training};
use crate::arch::gguf_header::{layer_types, GgufHeader};

pub const QWEN2: Family = Family {
    class: "Qwen2ForCausalLM",
    model_types: &["qwen2"],
    describe,
    tied_by_default: false,
    gguf: Gguf {
        name: "qwen2",
        also_read_from: None,
        written_as: "qwen2",
        converter: Converter::Text,
        permutes_qk: false,
        stored_norm_offset: 0.0,
        tensors: Tensors { post_norms: false, qk_norm: false, qkv_bias: true },
        head_dim: HeadDim::HiddenOverHeads,
        default_rope_theta: 10_000.0,
        rope_per_layer_kind: false,
        import,
    },
    space_prefix: SpacePrefix::Unwritten,
    training: Training { compute_dtype: "f16", compute_dtype_reason: None, folds_system_message: false },
};

fn describe(c: &ModelConfig) -> Result<Architecture> {
    let mut a = Architecture::llama(c)?;
    a.qkv_bias = true;
    a.windows = qwen_windows(c)?;
    Ok(a)
}

/// The sliding windows of the Qwen families (Qwen3's too), as their configs derive
/// `layer_types`.
pub(super) fn qwen_windows(c: &ModelConfig) -> Result<Vec<Option<usize>>> {
    let window = c.sliding_window.filter(|_| c.use_sliding_window);
    Ok(match &c.layer_types {
        Some(kinds) => {
            if kinds.len() != c.num_hidden_layers {
                bail!("layer_types: {} entries for {} layers", kinds.len(), c.num_hidden_layers);
            }
            kinds.iter().map(|k| window.filter(|_| k == "sliding_attention")).collect()
        }
        None => {
            let first = c.max_window_layers.unwrap_or(28);
            (0..c.num_hidden_layers).map(|l| window.filter(|_| l >= first)).collect()
        }
    })
}

/// Qwen2Config's keys beyond every family's (it has no head_dim nor attention_bias).
fn import(m: &GgufHeader, config: &mut Json) -> Result<()> {
    config["hidden_act"] = json!("silu");
    unwindowed(m, config);
    Ok(())
}

/// What Qwen2Config and Qwen3Config write without `use_sliding_window`: llama.cpp's graphs
/// have no window.
pub(super) fn unwindowed(m: &GgufHeader, config: &mut Json) {
    config["use_sliding_window"] = json!(false);
    config["sliding_window"] = Json::Null;
    config["max_window_layers"] = json!(28);
    config["layer_types"] = layer_types(m.layers as usize, |_| false);
}
