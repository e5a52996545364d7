//! llama.cpp's tensor names (`gguf.get_tensor_name_map`, `token_embd.weight`,
//! `blk.N.attn_q.weight`, …) and the Hugging Face names they stand for, both ways.

use super::architecture::Architecture;

/// The Hugging Face name of a llama.cpp tensor of `arch`, e.g. `blk.3.attn_q.weight` →
/// `model.layers.3.self_attn.q_proj.weight`. `None` for a name this importer does not know.
pub(crate) fn hf_tensor_name(arch: Architecture, gguf_name: &str) -> Option<String> {
    if let Some((_, hf)) = FIXED_NAMES.iter().find(|(gguf, _)| *gguf == gguf_name) {
        return Some(hf.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    Some(format!("model.layers.{layer}.{}", arch.layer_tensor(part)?))
}

/// The llama.cpp name of a Hugging Face tensor of `arch`, the inverse of `hf_tensor_name`
/// (`model.layers.3.self_attn.q_proj.weight` → `blk.3.attn_q.weight`).
pub(crate) fn gguf_tensor_name(arch: Architecture, hf_name: &str) -> Option<String> {
    if let Some((gguf, _)) = FIXED_NAMES.iter().find(|(_, hf)| *hf == hf_name) {
        return Some(gguf.to_string());
    }
    let rest = hf_name.strip_prefix("model.layers.")?;
    let (layer, module) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let part = LAYER_PARTS.iter().find(|part| arch.layer_tensor(part).as_deref() == Some(module))?;
    Some(format!("blk.{layer}.{part}"))
}

/// The tensors outside the layers, (llama.cpp, Hugging Face).
const FIXED_NAMES: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// Every per-layer llama.cpp tensor `Architecture::layer_tensor` knows, of any family.
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

    #[test]
    fn names_map_to_hugging_face() {
        use Architecture::*;
        let name = |arch, gguf: &str| hf_tensor_name(arch, gguf);
        assert_eq!(name(Llama, "token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert_eq!(name(Llama, "output.weight").unwrap(), "lm_head.weight");
        assert_eq!(
            name(Llama, "blk.12.attn_output.weight").unwrap(),
            "model.layers.12.self_attn.o_proj.weight"
        );
        assert_eq!(
            name(Llama, "blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(name(Llama, "blk.x.attn_q.weight"), None);
        assert_eq!(name(Llama, "blk.0.attn_q.bias"), None);
        assert_eq!(name(Llama, "blk.0.attn_q_norm.weight"), None);
        assert_eq!(name(Llama, "rope_freqs.weight"), None);
        // Qwen2: q/k/v biases, no output bias
        assert_eq!(name(Qwen2, "blk.1.attn_k.bias").unwrap(), "model.layers.1.self_attn.k_proj.bias");
        assert_eq!(name(Qwen2, "blk.1.attn_output.bias"), None);
        assert_eq!(name(Qwen3, "blk.1.attn_k.bias"), None);
        assert_eq!(
            name(Qwen3, "blk.1.attn_k_norm.weight").unwrap(),
            "model.layers.1.self_attn.k_norm.weight"
        );
        // Gemma: ffn_norm is the norm before the MLP, two more norms after the sub-layers
        assert_eq!(
            name(Gemma2, "blk.2.ffn_norm.weight").unwrap(),
            "model.layers.2.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            name(Gemma2, "blk.2.post_attention_norm.weight").unwrap(),
            "model.layers.2.post_attention_layernorm.weight"
        );
        assert_eq!(
            name(Gemma2, "blk.2.post_ffw_norm.weight").unwrap(),
            "model.layers.2.post_feedforward_layernorm.weight"
        );
        assert_eq!(name(Gemma2, "blk.2.attn_q_norm.weight"), None);
        assert_eq!(
            name(Gemma3, "blk.2.attn_q_norm.weight").unwrap(),
            "model.layers.2.self_attn.q_norm.weight"
        );
        assert_eq!(name(Qwen2, "blk.2.post_ffw_norm.weight"), None);
    }

    /// Export names every tensor the import reads back under the same Hugging Face name.
    #[test]
    fn gguf_names_invert_hugging_face_names() {
        use Architecture::*;
        for arch in [Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3] {
            let layer_names = LAYER_PARTS.iter().map(|part| format!("blk.7.{part}"));
            for gguf in layer_names.chain(FIXED_NAMES.iter().map(|(gguf, _)| gguf.to_string())) {
                if let Some(hf) = hf_tensor_name(arch, &gguf) {
                    assert_eq!(gguf_tensor_name(arch, &hf).as_deref(), Some(gguf.as_str()), "{arch:?}");
                }
            }
        }
        assert_eq!(
            gguf_tensor_name(Llama, "model.layers.0.mlp.up_proj.weight").unwrap(),
            "blk.0.ffn_up.weight"
        );
        assert_eq!(gguf_tensor_name(Llama, "model.layers.0.self_attn.q_norm.weight"), None);
        assert_eq!(gguf_tensor_name(Llama, "model.rotary_emb.inv_freq"), None);
    }
}
