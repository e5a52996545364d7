//! Gemma 3 (text): Gemma 2's decoder with five local layers to one global by default, q/k norms,
//! no soft caps unless the config sets them, and a RoPE of its own on the local layers:
//! `rope_parameters.sliding_attention` (transformers ≥ 5) or `rope_local_base_freq` unscaled;
//! the global layers' is `full_attention` or the usual keys.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value as Json};

use super::gemma2::{gemma, import_common, GEMMA_TRAINING};
use crate::arch::config::ModelConfig;
use crate::arch::description::{scaling_of, Architecture, RopeScaling, RopeSpec};
use crate::arch::family::{Converter, Family, Gguf, HeadDim, SpacePrefix, Tensors};
use crate::arch::gguf_header::{layer_types, GgufHeader};

pub const GEMMA3: Family = Family {
    class: "Gemma3ForCausalLM",
    model_types: &["gemma3_text", "gemma3"],
    describe,
    tied_by_default: true,
    gguf: Gguf {
        name: "gemma3",
        also_read_from: None,
        written_as: "gemma3",
        converter: Converter::Gemma3,
        permutes_qk: false,
        stored_norm_offset: 1.0,
        tensors: Tensors { post_norms: true, qk_norm: true, qkv_bias: false },
        head_dim: HeadDim::KeyLength,
        default_rope_theta: 1_000_000.0,
        rope_per_layer_kind: true,
        import,
    },
    space_prefix: SpacePrefix::Off,
    training: GEMMA_TRAINING,
};

fn describe(c: &ModelConfig) -> Result<Architecture> {
    if c.use_bidirectional_attention == Some(true) {
        bail!("use_bidirectional_attention: true (lora-ft trains causal decoders)");
    }
    let mut a = gemma(c, c.sliding_window_pattern.unwrap_or(6))?;
    a.qk_norm = true;
    let by_kind = c.rope_parameters.as_ref().filter(|p| p.get("sliding_attention").is_some());
    let local = match by_kind {
        Some(p) => {
            let local = &p["sliding_attention"];
            let theta = local.get("rope_theta").and_then(|t| t.as_f64()).unwrap_or(10_000.0);
            let key = "rope_parameters.sliding_attention";
            RopeSpec { theta, scaling: scaling_of(local, key, c)?, max_positions: c.max_position_embeddings }
        }
        None => RopeSpec {
            theta: c.rope_local_base_freq.unwrap_or(10_000.0),
            scaling: RopeScaling::None,
            max_positions: c.max_position_embeddings,
        },
    };
    if let Some(p) = by_kind {
        let global = p.get("full_attention").context("rope_parameters.full_attention is missing")?;
        a.rope.scaling = scaling_of(global, "rope_parameters.full_attention", c)?;
    }
    a.local_rope = Some(local);
    Ok(a)
}

/// Gemma3TextConfig's keys beyond every family's, by llama.cpp's rules: no attention cap, five
/// local layers to one global where the file has a window, none sliding where it has not.
fn import(m: &GgufHeader, config: &mut Json) -> Result<()> {
    let final_cap = import_common(m, config, 62)?;
    config["attn_logit_softcapping"] = Json::Null;
    config["final_logit_softcapping"] = json!(final_cap);
    match m.sliding_window.filter(|&w| w > 0) {
        Some(window) => {
            config["sliding_window"] = json!(window);
            let local = m.sliding_layers(6)?;
            config["layer_types"] = layer_types(m.layers as usize, |l| local[l]);
        }
        None => {
            config["sliding_window"] = Json::Null;
            config["layer_types"] = layer_types(m.layers as usize, |_| false);
        }
    }
    Ok(())
}
