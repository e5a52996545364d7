//! The typed description of a decoder, the one thing the layers branch on: every family lora-ft
//! reads is the Llama decoder (pre-norm → attention with RoPE → pre-norm → gated MLP) with a handful
//! of differences, each a field of [`Architecture`] — how RoPE is scaled, biases on q/k/v, per-head
//! norms on q and k, a head_dim that is not hidden/heads, tied embeddings, sliding windows (on every
//! layer or on some), soft-capped logits, a (1 + w) norm, norms after the sublayers too, another
//! activation, a scaled embedding, another query scale. Each family's declaration
//! (`families/`) starts from [`Architecture::llama`] and sets the fields that differ.
//!
//! [`Architecture::check_supported`] is the one place that says which of these the layers compute
//! today; anything else is refused there by name before a weight is read. RoPE scaling of every
//! kind is computed (`model::ops::rope::frequencies`).

use anyhow::{bail, Context};

use super::config::ModelConfig;

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) ⊙ up (SwiGLU): Llama, Mistral, Qwen.
    Silu,
    /// gelu_pytorch_tanh(gate) ⊙ up (GeGLU): Gemma.
    GeluTanh,
}

/// How RoPE's frequencies are scaled for long contexts (`rope_scaling` / `rope_parameters`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear { factor: f64 },
    /// NTK-aware: the base grows with the sequence past the original length.
    Dynamic { factor: f64 },
    /// YaRN: frequencies interpolated between `beta_fast` and `beta_slow` rotations, cos and sin
    /// scaled by `attention_factor` (default 0.1 ln(factor) + 1); `truncate` rounds the
    /// correction range to whole dims (transformers' default).
    Yarn {
        factor: f64,
        original_max_position: usize,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: Option<f64>,
        truncate: bool,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position: usize },
}

/// RoPE as a model uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    pub scaling: RopeScaling,
    pub max_positions: usize,
}

/// What differs between decoder families, for one model. Sizes are those of config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct Architecture {
    /// The `architectures` name it was read as.
    pub family: &'static str,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// Explicit in config.json where it is not hidden/heads (Mistral Nemo, Qwen3, Gemma).
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    /// Added to every norm weight: 0 (w ⊙ x̂), or 1 for Gemma's (1 + w) ⊙ x̂.
    pub norm_weight_offset: f64,
    /// Norms after the attention and MLP outputs too, before the residual add (Gemma 2/3).
    pub post_sublayer_norms: bool,
    pub rope: RopeSpec,
    /// The RoPE of the sliding-window layers where it is not `rope` (Gemma 3's local layers).
    pub local_rope: Option<RopeSpec>,
    /// Biases on q, k and v (Qwen2/2.5; frozen, LoRA adds to the projection).
    pub qkv_bias: bool,
    /// RMSNorm over each head of q and of k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    pub activation: Activation,
    /// lm_head is the embedding table.
    pub tied_embeddings: bool,
    /// The embedding output multiplied by this (Gemma: sqrt(hidden)).
    pub embedding_scale: Option<f64>,
    /// Scores are q·k × this: 1/sqrt(head_dim), or Gemma's 1/sqrt(query_pre_attn_scalar).
    pub query_scale: f64,
    /// Attention scores soft-capped: cap · tanh(s / cap) (Gemma 2).
    pub attention_softcap: Option<f64>,
    /// Final logits soft-capped likewise (Gemma 2).
    pub final_logit_softcap: Option<f64>,
    /// Each layer's sliding window (`None`: full causal attention), one entry per layer, so
    /// families that alternate local and global layers need no other field.
    pub windows: Vec<Option<usize>>,
}

impl Architecture {
    /// The Llama decoder with `c`'s sizes: what each family starts from.
    pub fn llama(c: &ModelConfig) -> anyhow::Result<Self> {
        let sizes = [c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size];
        if c.num_attention_heads == 0 || c.num_kv_heads() == 0 || sizes.contains(&0) {
            bail!("hidden_size, intermediate_size, num_hidden_layers, vocab_size and the head counts must be positive");
        }
        if !c.num_attention_heads.is_multiple_of(c.num_kv_heads()) {
            bail!("num_key_value_heads must divide num_attention_heads");
        }
        if c.mlp_bias {
            bail!("mlp_bias: biased MLP projections are not supported");
        }
        // Gemma's configs name it `hidden_activation` (Gemma 2's carry both; that one wins)
        let (key, act) = match &c.hidden_activation {
            Some(act) => ("hidden_activation", act.as_str()),
            None => ("hidden_act", c.hidden_act.as_str()),
        };
        let activation = match act {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_tanh" => Activation::GeluTanh,
            other => bail!("{key}: {other:?} (lora-ft computes silu and gelu_pytorch_tanh)"),
        };
        let head_dim = c.head_dim();
        Ok(Self {
            family: "LlamaForCausalLM",
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_kv_heads(),
            head_dim,
            rms_norm_eps: c.rms_norm_eps,
            norm_weight_offset: 0.0,
            post_sublayer_norms: false,
            rope: RopeSpec {
                theta: c.rope_theta(),
                scaling: rope_scaling(c)?,
                max_positions: c.max_position_embeddings,
            },
            local_rope: None,
            qkv_bias: c.attention_bias,
            qk_norm: false,
            activation,
            // the base's default; `Architecture::from_config` applies the family's
            tied_embeddings: c.tie_word_embeddings.unwrap_or(false),
            embedding_scale: None,
            query_scale: 1.0 / (head_dim as f64).sqrt(),
            attention_softcap: None,
            final_logit_softcap: None,
            windows: vec![None; c.num_hidden_layers],
        })
    }

    /// The one place that says what the layers compute today; the rest is refused by name.
    pub fn check_supported(&self) -> anyhow::Result<()> {
        if self.norm_weight_offset != 0.0 && self.norm_weight_offset != 1.0 {
            bail!("a norm weight offset of {} ({})", self.norm_weight_offset, self.family);
        }
        for (key, cap) in [
            ("attn_logit_softcapping", self.attention_softcap),
            ("final_logit_softcapping", self.final_logit_softcap),
        ] {
            if cap.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
                bail!("{key}: {cap:?} (a soft cap must be a positive number)");
            }
        }
        if !(self.query_scale > 0.0 && self.query_scale.is_finite()) {
            bail!("query_pre_attn_scalar: gives the query scale {} (must be positive)", self.query_scale);
        }
        Ok(())
    }

    /// The RoPE of layer `l`: the local one on sliding-window layers where the family has one.
    pub fn rope_of(&self, l: usize) -> &RopeSpec {
        match (&self.local_rope, self.window(l)) {
            (Some(local), Some(_)) => local,
            _ => &self.rope,
        }
    }

    /// The sliding window of layer `l` (`None`: full causal attention).
    pub fn window(&self, l: usize) -> Option<usize> {
        self.windows.get(l).copied().flatten()
    }
}

/// `rope_scaling` (transformers < 5) or `rope_parameters` (≥ 5), typed.
fn rope_scaling(c: &ModelConfig) -> anyhow::Result<RopeScaling> {
    let Some(p) = c.rope_scaling.as_ref().filter(|s| !s.is_null()).or(c.rope_parameters.as_ref()) else {
        return Ok(RopeScaling::None);
    };
    let key = if c.rope_scaling.as_ref().is_some_and(|s| !s.is_null()) {
        "rope_scaling"
    } else {
        "rope_parameters"
    };
    // Gemma 3 under transformers ≥ 5: one set per layer kind; the global layers' here
    match p.get("full_attention") {
        Some(global) => scaling_of(global, "rope_parameters.full_attention", c),
        None => scaling_of(p, key, c),
    }
}

/// One RoPE parameter set `p` (found at `key`), typed; `rope_type` or the older `type` names the
/// kind.
pub(crate) fn scaling_of(p: &serde_json::Value, key: &str, c: &ModelConfig) -> anyhow::Result<RopeScaling> {
    let kind = p.get("rope_type").or_else(|| p.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
    let num = |name: &str| -> anyhow::Result<f64> {
        p.get(name)
            .and_then(|v| v.as_f64())
            .with_context(|| format!("{key}.{name}: a number is required for {kind:?}"))
    };
    let original = || -> anyhow::Result<usize> {
        let v = p.get("original_max_position_embeddings").and_then(|v| v.as_u64());
        Ok(v.map(|v| v as usize).unwrap_or(c.max_position_embeddings))
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: num("factor")? },
        "dynamic" => RopeScaling::Dynamic { factor: num("factor")? },
        "yarn" => {
            let factor = num("factor")?;
            let opt = |name: &str| p.get(name).and_then(|v| v.as_f64());
            // DeepSeek's form: the ratio of two mscales
            let mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
            let attention_factor = opt("attention_factor").or(match (opt("mscale"), opt("mscale_all_dim")) {
                (Some(m), Some(all)) if m != 0.0 && all != 0.0 => Some(mscale(m) / mscale(all)),
                _ => None,
            });
            RopeScaling::Yarn {
                factor,
                original_max_position: original()?,
                beta_fast: opt("beta_fast").unwrap_or(32.0),
                beta_slow: opt("beta_slow").unwrap_or(1.0),
                attention_factor,
                truncate: p.get("truncate").and_then(|v| v.as_bool()).unwrap_or(true),
            }
        }
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position: original()?,
        },
        other => {
            bail!("{key}.rope_type: {other:?} (lora-ft reads default, linear, dynamic, yarn and llama3)")
        }
    })
}
