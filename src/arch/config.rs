//! An HF `config.json` as written (serde): the sizes the planner reads, and the keys each family's
//! declaration (`families/`) maps onto the typed `Architecture`. Reading one from a file, checked
//! against the declared families, is `read.rs`'s.

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
    /// RoPE base frequency: `rope_parameters.rope_theta` (transformers ≥ 5; Gemma 3 keeps one
    /// per layer kind, this is the global layers') or `rope_theta`.
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.get("full_attention").unwrap_or(p).get("rope_theta"))
            .and_then(|t| t.as_f64())
            .unwrap_or(self.rope_theta)
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }
}
