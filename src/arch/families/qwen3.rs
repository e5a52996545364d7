//! Qwen3 dense: Qwen2's window rule, an explicit head_dim, RMSNorm over each head of q and k
//! before RoPE, and biases only where `attention_bias` says.

use anyhow::Result;
use serde_json::{json, Value as Json};

use super::qwen2::{qwen_windows, unwindowed};
use crate::arch::config::ModelConfig;
use crate::arch::description::Architecture;
use crate::arch::family::{Converter, Family, Gguf, HeadDim, SpacePrefix, Tensors, Training};
use crate::arch::gguf_header::GgufHeader;

pub const QWEN3: Family = Family {
    class: "Qwen3ForCausalLM",
    model_types: &["qwen3"],
    describe,
    tied_by_default: false,
    gguf: Gguf {
        name: "qwen3",
        also_read_from: None,
        written_as: "qwen3",
        converter: Converter::Text,
        permutes_qk: false,
        stored_norm_offset: 0.0,
        tensors: Tensors { post_norms: false, qk_norm: true, qkv_bias: false },
        head_dim: HeadDim::KeyLength,
        default_rope_theta: 10_000.0,
        rope_per_layer_kind: false,
        import,
    },
    space_prefix: SpacePrefix::Unwritten,
    training: Training { compute_dtype: "f16", compute_dtype_reason: None, folds_system_message: false },
};

fn describe(c: &ModelConfig) -> Result<Architecture> {
    let mut a = Architecture::llama(c)?;
    a.qk_norm = true;
    a.windows = qwen_windows(c)?;
    Ok(a)
}

/// Qwen3Config's keys beyond every family's.
fn import(m: &GgufHeader, config: &mut Json) -> Result<()> {
    config["head_dim"] = json!(m.head_dim);
    config["attention_bias"] = json!(false);
    config["hidden_act"] = json!("silu");
    unwindowed(m, config);
    Ok(())
}
