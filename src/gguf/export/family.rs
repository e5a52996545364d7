//! The families the export writes, from config.json's `model_type`: each one's
//! `general.architecture`, its tensor names (`format::architecture`'s, run backwards) and
//! Gemma's norms stored as w + 1.

use crate::gguf::format::architecture::Architecture;

/// The family of a config.json's `model_type`, as the exporter writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `llama` and `mistral` (llama.cpp writes both as `llama`, Q/K rows permuted).
    Llama,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
}

impl Family {
    pub fn of_model_type(model_type: &str) -> Option<Self> {
        Some(match model_type {
            "llama" | "mistral" => Self::Llama,
            "qwen2" => Self::Qwen2,
            "qwen3" => Self::Qwen3,
            "gemma2" => Self::Gemma2,
            "gemma3" | "gemma3_text" => Self::Gemma3,
            _ => return None,
        })
    }

    /// `general.architecture`, the prefix of the model's own keys.
    pub fn arch_name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
        }
    }

    /// The import's table of tensor names, run backwards.
    pub(super) fn architecture(self) -> Architecture {
        match self {
            Self::Llama => Architecture::Llama,
            Self::Qwen2 => Architecture::Qwen2,
            Self::Qwen3 => Architecture::Qwen3,
            Self::Gemma2 => Architecture::Gemma2,
            Self::Gemma3 => Architecture::Gemma3,
        }
    }

    /// Added to a tensor before it is stored: Gemma's RMSNorm scales by (1 + w) and its
    /// converters write every `*norm.weight` as w + 1 (`modify_tensors`, `norm_shift`).
    pub fn stored_offset(self, hf_name: &str) -> f32 {
        if hf_name.ends_with("norm.weight") {
            self.architecture().stored_norm_offset()
        } else {
            0.0
        }
    }
}
