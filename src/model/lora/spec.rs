//! What LoRA is applied to and how strongly, in PEFT's own names: the seven projections'
//! `target_modules` names, their module paths, and the rank/alpha/dropout of `LoraConfig`.

/// The seven projections, in PEFT's `target_modules` names and in a fixed order.
pub const PROJECTIONS: [&str; 7] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// LoRA hyper-parameters as they apply to the model.
#[derive(Debug, Clone)]
pub struct LoraSpec {
    pub r: usize,
    pub alpha: f64,
    pub dropout: f64,
    pub target_modules: Vec<String>,
    pub rslora: bool,
}

impl LoraSpec {
    pub fn scale(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }
}

/// `model.layers.{l}.{self_attn|mlp}.{proj}` — the HF module path of a projection.
pub fn module_path(layer: usize, proj: &str) -> String {
    let block = if matches!(proj, "gate_proj" | "up_proj" | "down_proj") { "mlp" } else { "self_attn" };
    format!("model.layers.{layer}.{block}.{proj}")
}
