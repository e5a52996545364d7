//! The `--type` of `export-gguf`: llama.cpp's `LlamaFileType`, written as `general.file_type`,
//! and the tensor type of the 2-D weights it stands for.

use anyhow::{bail, Result};
use candle_core::quantized::GgmlDType;

/// The `--type` of the 2-D weights (llama.cpp's `LlamaFileType`, `general.file_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q8_0,
    /// llama.cpp's `Q4_K_M` mix (`q4km.rs`).
    Q4KM,
}

impl FileType {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "bf16" => Ok(Self::BF16),
            "q8_0" => Ok(Self::Q8_0),
            "q4_k_m" => Ok(Self::Q4KM),
            other => bail!("--type {other:?}: export-gguf writes f32, f16, bf16, q8_0 or q4_k_m"),
        }
    }

    /// `general.file_type`: `ALL_F32` = 0, `MOSTLY_F16` = 1, `MOSTLY_Q8_0` = 7,
    /// `MOSTLY_Q4_K_M` = 15, `MOSTLY_BF16` = 32.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8_0 => 7,
            Self::Q4KM => 15,
            Self::BF16 => 32,
        }
    }

    pub fn weight_type(self) -> GgmlDType {
        match self {
            Self::F32 => GgmlDType::F32,
            Self::F16 => GgmlDType::F16,
            Self::BF16 => GgmlDType::BF16,
            Self::Q8_0 => GgmlDType::Q8_0,
            // each weight's type is chosen over the whole file (`choose_types`)
            Self::Q4KM => GgmlDType::Q4K,
        }
    }
}
