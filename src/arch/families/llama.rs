//! Llama 2 / 3.x: the Llama decoder itself, the base every other family is declared against.

use anyhow::Result;
use serde_json::{json, Value as Json};

use crate::arch::description::Architecture;
use crate::arch::family::{Converter, Family, Gguf, HeadDim, SpacePrefix, Tensors, Training};
use crate::arch::gguf_header::GgufHeader;

pub const LLAMA: Family = Family {
    class: "LlamaForCausalLM",
    model_types: &["llama"],
    describe: Architecture::llama,
    tied_by_default: false,
    gguf: Gguf {
        name: "llama",
        also_read_from: None,
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

/// LlamaConfig's keys beyond every family's.
fn import(m: &GgufHeader, config: &mut Json) -> Result<()> {
    config["head_dim"] = json!(m.head_dim);
    config["attention_bias"] = json!(false);
    config["hidden_act"] = json!("silu");
    config["mlp_bias"] = json!(false);
    Ok(())
}
