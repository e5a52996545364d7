//! Which decoder a GGUF file holds (`general.architecture`), and what tells its families apart
//! in the file: the Hugging Face class, llama.cpp's tensor names, the Q/K row permutation and
//! Gemma's stored norm offset. The import reads it from the file; the export maps its own
//! families onto it for the names and the offset.

use super::metadata::Metadata;
use anyhow::{bail, Result};

/// The decoder families this importer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
}

/// The `general.architecture` values read, as the refusal of any other lists them.
const SUPPORTED: &str = "\"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"gemma2\" and \"gemma3\"";

impl Architecture {
    /// `general.architecture`, and the prefix of the model's own keys. llama.cpp writes Mistral
    /// models as "llama"; a "llama" file whose `general.name` says "mistral" becomes
    /// MistralForCausalLM, as transformers' loader decides.
    pub fn read(meta: &Metadata) -> Result<(Self, String)> {
        let key = "general.architecture";
        let name = meta.opt_string("general.name")?.unwrap_or_default().to_lowercase();
        let arch = meta.string(key)?;
        let family = match arch {
            "llama" if name.contains("mistral") => Self::Mistral,
            "llama" => Self::Llama,
            "mistral" => Self::Mistral,
            "qwen2" => Self::Qwen2,
            "qwen3" => Self::Qwen3,
            "gemma2" => Self::Gemma2,
            "gemma3" => Self::Gemma3,
            other => {
                bail!("{}: GGUF key `{key}` is {other:?}; lora-ft imports {SUPPORTED}", meta.file.display())
            }
        };
        Ok((family, arch.to_string()))
    }

    pub fn class_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Mistral => "MistralForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Gemma2 => "Gemma2ForCausalLM",
            Self::Gemma3 => "Gemma3ForCausalLM",
        }
    }

    /// `model_type` of config.json (Gemma 3 GGUF files hold the text model only).
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3_text",
        }
    }

    pub fn is_gemma(self) -> bool {
        matches!(self, Self::Gemma2 | Self::Gemma3)
    }

    /// llama.cpp's converter permutes the rows of Q and K for the llama graph only (its
    /// `LlamaModel.permute`); Qwen and Gemma keep Hugging Face's order.
    pub fn permutes_qk(self) -> bool {
        matches!(self, Self::Llama | Self::Mistral)
    }

    /// What llama.cpp added to every `*norm.weight` it stored: Gemma's RMSNorm scales by
    /// (1 + w) and its converter writes w + 1; transformers' loader subtracts 1 again.
    pub fn stored_norm_offset(self) -> f32 {
        if self.is_gemma() {
            1.0
        } else {
            0.0
        }
    }

    /// The Hugging Face module of a llama.cpp per-layer tensor (`attn_q.weight` →
    /// `self_attn.q_proj.weight`), as `gguf.get_tensor_name_map` pairs them for this family.
    pub fn layer_tensor(self, part: &str) -> Option<String> {
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
            // the norm before the MLP: Gemma has one more after each sub-layer
            ("ffn_norm", "weight") if self.is_gemma() => "pre_feedforward_layernorm",
            ("ffn_norm", "weight") => "post_attention_layernorm",
            ("post_attention_norm", "weight") if self.is_gemma() => "post_attention_layernorm",
            ("post_ffw_norm", "weight") if self.is_gemma() => "post_feedforward_layernorm",
            ("attn_q_norm", "weight") if self.has_qk_norm() => "self_attn.q_norm",
            ("attn_k_norm", "weight") if self.has_qk_norm() => "self_attn.k_norm",
            _ => return None,
        };
        // only Qwen2 has q/k/v biases
        let biased = kind == "bias" && self == Self::Qwen2 && matches!(stem, "attn_q" | "attn_k" | "attn_v");
        (kind == "weight" || biased).then(|| format!("{module}.{kind}"))
    }

    fn has_qk_norm(self) -> bool {
        matches!(self, Self::Qwen3 | Self::Gemma3)
    }
}
