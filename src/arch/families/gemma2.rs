//! Gemma 2: (1 + w) norms, norms after each sublayer's output too, GeGLU, embeddings times
//! sqrt(hidden), scores scaled by 1/sqrt(query_pre_attn_scalar), local and global layers
//! alternating (the first local), soft-capped attention scores and final logits. What Gemma 3
//! shares of it is here too (`gemma`, `import_common`).

use anyhow::{bail, Result};
use serde_json::{json, Value as Json};

use crate::arch::config::ModelConfig;
use crate::arch::description::Architecture;
use crate::arch::family::{Converter, Family, Gguf, HeadDim, SpacePrefix, Tensors, Training};
use crate::arch::gguf_header::{layer_types, GgufHeader};

pub const GEMMA2: Family = Family {
    class: "Gemma2ForCausalLM",
    model_types: &["gemma2"],
    describe,
    tied_by_default: true,
    gguf: Gguf {
        name: "gemma2",
        also_read_from: None,
        written_as: "gemma2",
        converter: Converter::Gemma2,
        permutes_qk: false,
        stored_norm_offset: 1.0,
        tensors: Tensors { post_norms: true, qk_norm: false, qkv_bias: false },
        head_dim: HeadDim::KeyLength,
        default_rope_theta: 10_000.0,
        rope_per_layer_kind: false,
        import,
    },
    space_prefix: SpacePrefix::Off,
    // its chat template refuses a system role
    training: Training { folds_system_message: true, ..GEMMA_TRAINING },
};

/// What `lora-ft init` writes for Gemma 2 and 3: bf16, as their activations overflow f16.
pub(super) const GEMMA_TRAINING: Training = Training {
    compute_dtype: "bf16",
    compute_dtype_reason: Some("Gemma's activations overflow f16"),
    folds_system_message: false,
};

fn describe(c: &ModelConfig) -> Result<Architecture> {
    gemma(c, 2)
}

/// What Gemma 2 and 3 share: (1 + w) norms, norms after each sublayer's output too, GeGLU
/// (`hidden_activation`), embeddings times sqrt(hidden), scores scaled by
/// 1/sqrt(query_pre_attn_scalar), `layer_types` (or every `pattern`-th layer global) for the
/// sliding windows, and the soft caps where the config sets them (Gemma 2's do).
pub(super) fn gemma(c: &ModelConfig, pattern: usize) -> Result<Architecture> {
    let mut a = Architecture::llama(c)?;
    a.norm_weight_offset = 1.0;
    a.post_sublayer_norms = true;
    a.embedding_scale = Some((c.hidden_size as f64).sqrt());
    a.query_scale = 1.0 / c.query_pre_attn_scalar.unwrap_or(256.0).sqrt();
    let kinds: Vec<bool> = match &c.layer_types {
        Some(kinds) => {
            if kinds.len() != c.num_hidden_layers {
                bail!("layer_types: {} entries for {} layers", kinds.len(), c.num_hidden_layers);
            }
            kinds.iter().map(|k| k == "sliding_attention").collect()
        }
        None => (0..c.num_hidden_layers).map(|l| (l + 1) % pattern != 0).collect(),
    };
    a.windows = kinds.iter().map(|&sliding| c.sliding_window.filter(|_| sliding)).collect();
    a.attention_softcap = c.attn_logit_softcapping;
    a.final_logit_softcap = c.final_logit_softcapping;
    Ok(a)
}

/// Gemma2Config's keys beyond every family's, by llama.cpp's `llm_load_hparams` rules: its
/// default caps and window where the keys are absent (Gemma2Config's too), even layers local.
fn import(m: &GgufHeader, config: &mut Json) -> Result<()> {
    let final_cap = import_common(m, config, 46)?;
    let attn_cap = m.keys.opt_float(&m.key("attn_logit_softcapping"))?.unwrap_or(50.0);
    config["attn_logit_softcapping"] = json!(attn_cap);
    config["final_logit_softcapping"] = json!(final_cap.or(Some(30.0)));
    config["sliding_window"] = json!(m.sliding_window.unwrap_or(4096));
    let local = m.sliding_layers(2)?;
    config["layer_types"] = layer_types(m.layers as usize, |l| local[l]);
    Ok(())
}

/// The keys Gemma 2 and 3 share, and the file's final soft cap (0 read as none). The attention
/// scale is 1/sqrt(head_dim) except for the 27B models (told apart by their layer count,
/// `big_layers`), which use hidden / heads.
pub(super) fn import_common(m: &GgufHeader, config: &mut Json, big_layers: u64) -> Result<Option<f64>> {
    config["head_dim"] = json!(m.head_dim);
    config["attention_bias"] = json!(false);
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    let scalar = if m.layers == big_layers { m.hidden / m.heads as u64 } else { m.head_dim };
    config["query_pre_attn_scalar"] = json!(scalar);
    Ok(m.keys.opt_float(&m.key("final_logit_softcapping"))?.filter(|&c| c != 0.0))
}
