//! `[lora]`: the LoRA settings, in PEFT's `LoraConfig` terms, and the projections they may adapt.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The projections an adapter may take, in PEFT's `target_modules` names.
pub const ALL_TARGET_MODULES: [&str; 7] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// The LoRA settings, in PEFT's `LoraConfig` terms: the one type the config reads, the model's
/// adapters are made with, the planner counts and the adapter files record.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
// `default` lets a section name only the keys it changes; unknown keys are still errors.
#[serde(deny_unknown_fields, default)]
pub struct LoraSpec {
    /// The adapters' rank.
    pub r: usize,
    /// The adapters' scale is `alpha / r` (`alpha / sqrt(r)` with `rslora`).
    pub alpha: f64,
    /// Dropout on the LoRA input, as PEFT applies it; in [0, 1).
    pub dropout: f64,
    /// The projections that get adapters: some of `q_proj`, `k_proj`, `v_proj`, `o_proj`,
    /// `gate_proj`, `up_proj`, `down_proj`.
    pub target_modules: Vec<String>,
    /// Rank-stabilized LoRA: scale by `alpha / sqrt(r)`.
    pub rslora: bool,
}

impl Default for LoraSpec {
    fn default() -> Self {
        Self {
            r: 16,
            alpha: 32.0,
            dropout: 0.05,
            target_modules: ALL_TARGET_MODULES.iter().map(|s| s.to_string()).collect(),
            rslora: false,
        }
    }
}

impl LoraSpec {
    /// The factor of the adapters' product: alpha / r, or alpha / sqrt(r) with rsLoRA.
    pub fn scale(&self) -> f64 {
        let r = self.r as f64;
        if self.rslora {
            self.alpha / r.sqrt()
        } else {
            self.alpha / r
        }
    }
}
