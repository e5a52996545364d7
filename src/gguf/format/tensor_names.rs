//! llama.cpp's tensor names (`gguf.get_tensor_name_map`, `token_embd.weight`,
//! `blk.N.attn_q.weight`, …) and the Hugging Face names they stand for, both ways, for a family
//! whose declaration says which tensors beyond the Llama decoder's its files hold.

use crate::arch::family::Tensors;

/// The Hugging Face name of a llama.cpp tensor of a family with `tensors`, e.g.
/// `blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`. `None` for a name this
/// importer does not know.
pub(crate) fn hf_tensor_name(tensors: Tensors, gguf_name: &str) -> Option<String> {
    if let Some((_, hf)) = FIXED_NAMES.iter().find(|(gguf, _)| *gguf == gguf_name) {
        return Some(hf.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    Some(format!("model.layers.{layer}.{}", layer_tensor(tensors, part)?))
}

/// The llama.cpp name of a Hugging Face tensor of a family with `tensors`, the inverse of
/// `hf_tensor_name` (`model.layers.3.self_attn.q_proj.weight` → `blk.3.attn_q.weight`).
pub(crate) fn gguf_tensor_name(tensors: Tensors, hf_name: &str) -> Option<String> {
    if let Some((gguf, _)) = FIXED_NAMES.iter().find(|(_, hf)| *hf == hf_name) {
        return Some(gguf.to_string());
    }
    let rest = hf_name.strip_prefix("model.layers.")?;
    let (layer, module) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let part = LAYER_PARTS.iter().find(|part| layer_tensor(tensors, part).as_deref() == Some(module))?;
    Some(format!("blk.{layer}.{part}"))
}

/// The tensors outside the layers, (llama.cpp, Hugging Face).
const FIXED_NAMES: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The Hugging Face module of a llama.cpp per-layer tensor (`attn_q.weight` →
/// `self_attn.q_proj.weight`), as `gguf.get_tensor_name_map` pairs them for a family with
/// `tensors`.
fn layer_tensor(tensors: Tensors, part: &str) -> Option<String> {
    let (stem, kind) = part.rsplit_once('.')?;
    let module = match (stem, kind) {
        ("attn_q", _) => "self_attn.q_proj",
        ("attn_k", _) => "self_attn.k_proj",
        ("attn_v", _) => "self_attn.v_proj",
        ("attn_output", "weight") => "self_attn.o_proj",
        ("ffn_gate", "weight") => "mlp.gate_proj",
        ("ffn_up", "weight") => "mlp.up_proj",
        ("ffn_down", "weight") => "mlp.down_proj",
        ("attn_norm", "weight") => "input_layernorm",
        // the norm before the MLP: with post-norms (Gemma) there is one more after each sub-layer
        ("ffn_norm", "weight") if tensors.post_norms => "pre_feedforward_layernorm",
        ("ffn_norm", "weight") => "post_attention_layernorm",
        ("post_attention_norm", "weight") if tensors.post_norms => "post_attention_layernorm",
        ("post_ffw_norm", "weight") if tensors.post_norms => "post_feedforward_layernorm",
        ("attn_q_norm", "weight") if tensors.qk_norm => "self_attn.q_norm",
        ("attn_k_norm", "weight") if tensors.qk_norm => "self_attn.k_norm",
        _ => return None,
    };
    let biased = kind == "bias" && tensors.qkv_bias && matches!(stem, "attn_q" | "attn_k" | "attn_v");
    (kind == "weight" || biased).then(|| format!("{module}.{kind}"))
}

/// Every per-layer llama.cpp tensor `layer_tensor` knows, of any family.
const LAYER_PARTS: [&str; 16] = [
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_output.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "attn_norm.weight",
    "ffn_norm.weight",
    "post_attention_norm.weight",
    "post_ffw_norm.weight",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::families::{by_class, FAMILIES};

    /// The tensors of the family of Hugging Face class `<name>ForCausalLM`.
    fn of(name: &str) -> Tensors {
        by_class(&format!("{name}ForCausalLM")).unwrap().gguf.tensors
    }

    #[test]
    fn names_map_to_hugging_face() {
        let name = |arch: &str, gguf: &str| hf_tensor_name(of(arch), gguf);
        assert_eq!(name("Llama", "token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert_eq!(name("Llama", "output.weight").unwrap(), "lm_head.weight");
        assert_eq!(
            name("Llama", "blk.12.attn_output.weight").unwrap(),
            "model.layers.12.self_attn.o_proj.weight"
        );
        assert_eq!(
            name("Llama", "blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(name("Llama", "blk.x.attn_q.weight"), None);
        assert_eq!(name("Llama", "blk.0.attn_q.bias"), None);
        assert_eq!(name("Llama", "blk.0.attn_q_norm.weight"), None);
        assert_eq!(name("Llama", "rope_freqs.weight"), None);
        // Qwen2: q/k/v biases, no output bias
        assert_eq!(name("Qwen2", "blk.1.attn_k.bias").unwrap(), "model.layers.1.self_attn.k_proj.bias");
        assert_eq!(name("Qwen2", "blk.1.attn_output.bias"), None);
        assert_eq!(name("Qwen3", "blk.1.attn_k.bias"), None);
        assert_eq!(
            name("Qwen3", "blk.1.attn_k_norm.weight").unwrap(),
            "model.layers.1.self_attn.k_norm.weight"
        );
        // Gemma: ffn_norm is the norm before the MLP, two more norms after the sub-layers
        assert_eq!(
            name("Gemma2", "blk.2.ffn_norm.weight").unwrap(),
            "model.layers.2.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            name("Gemma2", "blk.2.post_attention_norm.weight").unwrap(),
            "model.layers.2.post_attention_layernorm.weight"
        );
        assert_eq!(
            name("Gemma2", "blk.2.post_ffw_norm.weight").unwrap(),
            "model.layers.2.post_feedforward_layernorm.weight"
        );
        assert_eq!(name("Gemma2", "blk.2.attn_q_norm.weight"), None);
        assert_eq!(
            name("Gemma3", "blk.2.attn_q_norm.weight").unwrap(),
            "model.layers.2.self_attn.q_norm.weight"
        );
        assert_eq!(name("Qwen2", "blk.2.post_ffw_norm.weight"), None);
    }

    /// Export names every tensor the import reads back under the same Hugging Face name.
    #[test]
    fn gguf_names_invert_hugging_face_names() {
        for family in FAMILIES {
            let tensors = family.gguf.tensors;
            let layer_names = LAYER_PARTS.iter().map(|part| format!("blk.7.{part}"));
            for gguf in layer_names.chain(FIXED_NAMES.iter().map(|(gguf, _)| gguf.to_string())) {
                if let Some(hf) = hf_tensor_name(tensors, &gguf) {
                    assert_eq!(
                        gguf_tensor_name(tensors, &hf).as_deref(),
                        Some(gguf.as_str()),
                        "{}",
                        family.class
                    );
                }
            }
        }
        assert_eq!(
            gguf_tensor_name(of("Llama"), "model.layers.0.mlp.up_proj.weight").unwrap(),
            "blk.0.ffn_up.weight"
        );
        assert_eq!(gguf_tensor_name(of("Llama"), "model.layers.0.self_attn.q_norm.weight"), None);
        assert_eq!(gguf_tensor_name(of("Llama"), "model.rotary_emb.inv_freq"), None);
    }
}
