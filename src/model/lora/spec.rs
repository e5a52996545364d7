//! What LoRA is applied to and how strongly, in PEFT's own names: the seven projections'
//! `target_modules` names, their module paths, and the rank/alpha/dropout of `LoraConfig` (the
//! config's `LoraSpec`, one type from the config file to the adapter files).

/// The seven projections, in PEFT's `target_modules` names and in a fixed order.
pub const PROJECTIONS: [&str; 7] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

// the LoRA settings the adapters are made with: the config's `[lora]` section's type
pub use crate::config::LoraSpec;

/// `model.layers.{l}.{self_attn|mlp}.{proj}` — the HF module path of a projection.
pub fn module_path(layer: usize, proj: &str) -> String {
    let block = if matches!(proj, "gate_proj" | "up_proj" | "down_proj") { "mlp" } else { "self_attn" };
    format!("model.layers.{layer}.{block}.{proj}")
}
