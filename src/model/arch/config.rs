//! An HF `config.json` as written (serde): the sizes the planner reads, and the keys each family
//! declaration (`family.rs`) maps onto the typed `Architecture`.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
pub struct ModelConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers ≥ 5 writes `{"rope_theta": …, "rope_type": "default"}` here.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2: the window applies only where this is true, to layers from `max_window_layers` on.
    #[serde(default)]
    pub use_sliding_window: bool,
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// transformers ≥ 5 may list each layer's kind ("full_attention" / "sliding_attention").
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Absent: tied for Gemma (its configs leave the key out), untied otherwise; read it through
    /// `tied_embeddings()`.
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Gemma's name for the MLP activation (Gemma 2 configs carry both; this one wins).
    #[serde(default)]
    pub hidden_activation: Option<String>,
    /// Gemma: scores are q·k / sqrt(query_pre_attn_scalar).
    #[serde(default)]
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 2: attention scores and final logits soft-capped, cap · tanh(x / cap).
    #[serde(default)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 3 before transformers 5: the RoPE base of the sliding-window layers, and every
    /// how-many-th layer is global.
    #[serde(default)]
    pub rope_local_base_freq: Option<f64>,
    #[serde(default)]
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 3: attention both ways (an encoder use); refused.
    #[serde(default)]
    pub use_bidirectional_attention: Option<bool>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub bos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn default_max_pos() -> usize {
    4096
}
fn default_act() -> String {
    "silu".into()
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let de = &mut serde_json::Deserializer::from_str(&text);
        let cfg: ModelConfig = serde_path_to_error::deserialize(de)
            .map_err(|e| anyhow::anyhow!("{}: {}: {}", path.display(), e.path(), e.inner()))?;
        cfg.checked(&path.display().to_string())
    }

    /// A config.json held as JSON (a GGUF file's, `gguf::read_configs`), checked as `from_file`
    /// checks a file; errors name `origin`.
    pub fn from_value(value: serde_json::Value, origin: &str) -> anyhow::Result<Self> {
        let cfg: ModelConfig = serde_path_to_error::deserialize(value)
            .map_err(|e| anyhow::anyhow!("{origin}: {}: {}", e.path(), e.inner()))?;
        cfg.checked(origin)
    }

    /// Itself, when its family is one the layers compute.
    fn checked(self, origin: &str) -> anyhow::Result<Self> {
        super::Architecture::from_config(&self).with_context(|| format!("{origin}: unsupported model"))?;
        Ok(self)
    }

    /// RoPE base frequency: `rope_parameters.rope_theta` (transformers ≥ 5; Gemma 3 keeps one
    /// per layer kind, this is the global layers') or `rope_theta`.
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.get("full_attention").unwrap_or(p).get("rope_theta"))
            .and_then(|t| t.as_f64())
            .unwrap_or(self.rope_theta)
    }

    /// Whether lm_head is the embedding table: `tie_word_embeddings`, whose default is the
    /// family's (transformers' Gemma configs default to tied).
    pub fn tied_embeddings(&self) -> bool {
        let gemma = self.architectures.first().is_some_and(|a| a.starts_with("Gemma"));
        self.tie_word_embeddings.unwrap_or(gemma)
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Parameters of the full model (embeddings, projections, norms — Gemma's four a layer, the
    /// q/k norms —, q/k/v biases, lm_head unless tied): the N of the usual 6·N training FLOPs per
    /// token (Mistral-7B: 7.24e9).
    pub fn parameter_count(&self) -> usize {
        let (h, i, d) = (self.hidden_size, self.intermediate_size, self.head_dim());
        let q = self.num_attention_heads * d;
        let kv = self.num_key_value_heads.unwrap_or(self.num_attention_heads) * d;
        let mut layer = h * q * 2 + h * kv * 2 + 3 * h * i + 2 * h;
        if let Ok(arch) = super::Architecture::from_config(self) {
            layer += if arch.post_sublayer_norms { 2 * h } else { 0 };
            layer += if arch.qk_norm { 2 * d } else { 0 };
            layer += if arch.qkv_bias { q + 2 * kv } else { 0 };
        }
        let heads = if self.tied_embeddings() { 1 } else { 2 };
        self.num_hidden_layers * layer + heads * self.vocab_size * h + h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> ModelConfig {
        serde_json::from_value(json).unwrap()
    }

    /// A config.json with no heads is refused by name, not a division by zero in the planner.
    #[test]
    fn zero_sizes_are_refused() {
        let dir = std::env::temp_dir().join(format!("lora-ft-zero-heads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config.json");
        std::fs::write(
            &file,
            r#"{"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 0}"#,
        )
        .unwrap();
        let err = format!("{:#}", ModelConfig::from_file(&file).unwrap_err());
        assert!(err.contains("config.json") && err.contains("head counts must be positive"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The published sizes: Mistral-7B 7,241,732,096; Llama-2-13B 13,015,864,320;
    /// SmolLM2-135M (tied embeddings) 134,515,008.
    #[test]
    fn parameter_count_matches_the_published_sizes() {
        let mistral = config(serde_json::json!({"vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8}));
        assert_eq!(mistral.parameter_count(), 7_241_732_096);
        let llama13 = config(serde_json::json!({"vocab_size": 32000, "hidden_size": 5120,
            "intermediate_size": 13824, "num_hidden_layers": 40, "num_attention_heads": 40}));
        assert_eq!(llama13.parameter_count(), 13_015_864_320);
        let smollm2 = config(serde_json::json!({"vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "tie_word_embeddings": true}));
        assert_eq!(smollm2.parameter_count(), 134_515_008);
    }

    /// With each family's extra tensors (the counts of scripts/bench/bench_models.py and the
    /// model cards): Gemma-2-9B's four norms a layer (tied), Qwen3-8B's q/k norms, Qwen2.5-7B's
    /// q/k/v biases.
    #[test]
    fn parameter_count_holds_each_familys_extra_tensors() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bench-models");
        for (name, n) in
            [("gemma2-9b", 9_241_705_984), ("qwen3-8b", 8_190_735_360), ("qwen2.5-7b", 7_615_616_512)]
        {
            let cfg = ModelConfig::from_file(Path::new(&format!("{dir}/{name}/config.json"))).unwrap();
            assert_eq!(cfg.parameter_count(), n, "{name}");
        }
    }
}
