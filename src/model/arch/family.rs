//! The typed description of a decoder architecture, and the family declarations that map a
//! config.json onto it.
//!
//! Every decoder family lora-ft meets is the Llama decoder (pre-norm → attention with RoPE →
//! pre-norm → gated MLP) with a handful of differences: how RoPE is scaled, biases on q/k/v,
//! per-head norms on q and k, a head_dim that is not hidden/heads, tied embeddings, sliding
//! windows (on every layer or on some), soft-capped logits, a (1 + w) norm, norms after the
//! sublayers too, another activation, a scaled embedding, another query scale. [`Architecture`]
//! names each of them once; the layers branch on it, never on a model's name. A family is one
//! [`Family`] entry: its `architectures` name in config.json, and a function that reads that
//! family's keys into an `Architecture` (starting from [`Architecture::llama`]) — Mistral below
//! is Llama plus a sliding window.
//!
//! [`Architecture::check_supported`] is the one place that says which of these the layers compute
//! today; anything else is refused there by name before a weight is read. RoPE scaling of every
//! kind is computed (`model::ops::rope::frequencies`).

use anyhow::{bail, Context};

use super::config::ModelConfig;

/// One family: its `architectures` name in config.json and how its keys map onto the description.
pub struct Family {
    pub architecture: &'static str,
    pub describe: fn(&ModelConfig) -> anyhow::Result<Architecture>,
}

/// Every family lora-ft reads, in the order they are tried.
pub const FAMILIES: &[Family] = &[
    Family { architecture: "LlamaForCausalLM", describe: llama },
    Family { architecture: "MistralForCausalLM", describe: mistral },
    Family { architecture: "Qwen2ForCausalLM", describe: qwen2 },
    Family { architecture: "Qwen3ForCausalLM", describe: qwen3 },
    Family { architecture: "Gemma2ForCausalLM", describe: gemma2 },
    Family { architecture: "Gemma3ForCausalLM", describe: gemma3 },
];

/// Llama 2 / 3.x: the base every other family is written against.
fn llama(c: &ModelConfig) -> anyhow::Result<Architecture> {
    Architecture::llama(c)
}

/// Mistral: Llama with a sliding window on every layer (keys more than `sliding_window - 1`
/// positions back are masked, as HF does); v0.3 and Nemo set `sliding_window: null`.
fn mistral(c: &ModelConfig) -> anyhow::Result<Architecture> {
    let mut a = Architecture::llama(c)?;
    a.windows = vec![c.sliding_window; c.num_hidden_layers];
    Ok(a)
}

/// Qwen2 / Qwen2.5: Llama with biases on q, k and v (always, whatever `attention_bias` says),
/// and a sliding window only with `use_sliding_window`, on the layers from `max_window_layers`
/// on (or as `layer_types` lists them), as transformers' Qwen2Config derives it.
fn qwen2(c: &ModelConfig) -> anyhow::Result<Architecture> {
    let mut a = Architecture::llama(c)?;
    a.qkv_bias = true;
    a.windows = qwen_windows(c)?;
    Ok(a)
}

/// Qwen3 dense: Qwen2's window rule, an explicit head_dim, RMSNorm over each head of q and k
/// before RoPE, and biases only where `attention_bias` says.
fn qwen3(c: &ModelConfig) -> anyhow::Result<Architecture> {
    let mut a = Architecture::llama(c)?;
    a.qk_norm = true;
    a.windows = qwen_windows(c)?;
    Ok(a)
}

/// What Gemma 2 and 3 share: (1 + w) norms, norms after each sublayer's output too, GeGLU
/// (`hidden_activation`), embeddings times sqrt(hidden), scores scaled by
/// 1/sqrt(query_pre_attn_scalar), `layer_types` (or every `pattern`-th layer global) for the
/// sliding windows, and the soft caps where the config sets them (Gemma 2's do).
fn gemma(c: &ModelConfig, pattern: usize) -> anyhow::Result<Architecture> {
    let mut a = Architecture::llama(c)?;
    a.norm_weight_offset = 1.0;
    a.post_sublayer_norms = true;
    a.embedding_scale = Some((c.hidden_size as f64).sqrt());
    a.query_scale = 1.0 / c.query_pre_attn_scalar.unwrap_or(256.0).sqrt();
    let kinds: Vec<bool> = match &c.layer_types {
        Some(kinds) => {
            if kinds.len() != c.num_hidden_layers {
                bail!("layer_types: {} entries for {} layers", kinds.len(), c.num_hidden_layers);
            }
            kinds.iter().map(|k| k == "sliding_attention").collect()
        }
        None => (0..c.num_hidden_layers).map(|l| (l + 1) % pattern != 0).collect(),
    };
    a.windows = kinds.iter().map(|&sliding| c.sliding_window.filter(|_| sliding)).collect();
    a.attention_softcap = c.attn_logit_softcapping;
    a.final_logit_softcap = c.final_logit_softcapping;
    Ok(a)
}

/// Gemma 2: local and global layers alternating (the first local), soft-capped attention scores
/// and final logits.
fn gemma2(c: &ModelConfig) -> anyhow::Result<Architecture> {
    gemma(c, 2)
}

/// Gemma 3 (text): five local layers to one global by default, q/k norms, and a RoPE of their
/// own on the local layers: `rope_parameters.sliding_attention` (transformers ≥ 5) or
/// `rope_local_base_freq` unscaled; the global layers' is `full_attention` or the usual keys.
fn gemma3(c: &ModelConfig) -> anyhow::Result<Architecture> {
    if c.use_bidirectional_attention == Some(true) {
        bail!("use_bidirectional_attention: true (lora-ft trains causal decoders)");
    }
    let mut a = gemma(c, c.sliding_window_pattern.unwrap_or(6))?;
    a.qk_norm = true;
    let by_kind = c.rope_parameters.as_ref().filter(|p| p.get("sliding_attention").is_some());
    let local = match by_kind {
        Some(p) => {
            let local = &p["sliding_attention"];
            let theta = local.get("rope_theta").and_then(|t| t.as_f64()).unwrap_or(10_000.0);
            let key = "rope_parameters.sliding_attention";
            RopeSpec { theta, scaling: scaling_of(local, key, c)?, max_positions: c.max_position_embeddings }
        }
        None => RopeSpec {
            theta: c.rope_local_base_freq.unwrap_or(10_000.0),
            scaling: RopeScaling::None,
            max_positions: c.max_position_embeddings,
        },
    };
    if let Some(p) = by_kind {
        let global = p.get("full_attention").context("rope_parameters.full_attention is missing")?;
        a.rope.scaling = scaling_of(global, "rope_parameters.full_attention", c)?;
    }
    a.local_rope = Some(local);
    Ok(a)
}

/// The sliding windows of the Qwen families, as their configs derive `layer_types`.
fn qwen_windows(c: &ModelConfig) -> anyhow::Result<Vec<Option<usize>>> {
    let window = c.sliding_window.filter(|_| c.use_sliding_window);
    Ok(match &c.layer_types {
        Some(kinds) => {
            if kinds.len() != c.num_hidden_layers {
                bail!("layer_types: {} entries for {} layers", kinds.len(), c.num_hidden_layers);
            }
            kinds.iter().map(|k| window.filter(|_| k == "sliding_attention")).collect()
        }
        None => {
            let first = c.max_window_layers.unwrap_or(28);
            (0..c.num_hidden_layers).map(|l| window.filter(|_| l >= first)).collect()
        }
    })
}

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
    /// The description of `c` by its family (`architectures[0]`; none given reads as Llama).
    pub fn from_config(c: &ModelConfig) -> anyhow::Result<Self> {
        let name = c.architectures.first().map(String::as_str).unwrap_or("LlamaForCausalLM");
        let Some(family) = FAMILIES.iter().find(|f| f.architecture == name) else {
            let known: Vec<&str> = FAMILIES.iter().map(|f| f.architecture).collect();
            bail!("architectures: {name} (lora-ft reads {})", known.join(", "));
        };
        let arch = Architecture {
            family: family.architecture,
            ..(family.describe)(c).with_context(|| format!("reading {name}"))?
        };
        arch.check_supported()?;
        Ok(arch)
    }

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
            tied_embeddings: c.tied_embeddings(),
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
fn scaling_of(p: &serde_json::Value, key: &str, c: &ModelConfig) -> anyhow::Result<RopeScaling> {
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

#[cfg(test)]
#[path = "family_tests.rs"]
mod tests;
