//! What tells the exported families apart, as llama.cpp's `convert_hf_to_gguf.py` writes each:
//! the architecture (`llama` for Llama and Mistral, `qwen2`, `qwen3`, `gemma2`, `gemma3`), the
//! `<arch>.*` keys of `Qwen2Model`/`Qwen3Model` (`TextModel.set_gguf_parameters`),
//! `Gemma2Model` and `Gemma3Model`, Gemma's norms stored as w + 1, and what llama.cpp cannot
//! run as transformers does (refused, naming the config key).

use super::arch::Architecture;
use super::export::GgufModel;
use anyhow::{bail, Result};
use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;

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

/// A sliding window llama.cpp would not run: its llama, qwen2 and qwen3 graphs attend to the
/// whole context. Mistral 7B v0.1's window of 4096 in a 32768 context is dropped with a warning,
/// as convert_hf_to_gguf.py drops it (every GGUF of that model runs so, and rows up to the window
/// are computed alike); Qwen's `use_sliding_window` is refused.
pub(super) fn check_sliding_window(model: &GgufModel) -> Result<()> {
    let config = model.config();
    let file = model.config_file().display();
    match model.family() {
        Family::Llama => {
            let window = model.opt_uint("sliding_window")?;
            let context = model.opt_uint("max_position_embeddings")?;
            if let (Some(window), Some(context)) = (window, context) {
                if window < context {
                    tracing::warn!(
                        "{file}: `sliding_window` = {window} < max_position_embeddings {context}: llama.cpp's \
                         llama graph has no sliding window, so the GGUF attends past {window} positions (as \
                         llama.cpp's own converter writes this model); rows up to {window} tokens are computed alike"
                    );
                }
            }
        }
        Family::Qwen2 | Family::Qwen3 if config["use_sliding_window"] == true => {
            bail!(
                "{file}: `use_sliding_window` is true: llama.cpp's {} has no sliding window",
                model.family().arch_name()
            )
        }
        _ => {}
    }
    Ok(())
}

/// The `<arch>.*` keys of a Qwen or Gemma model (Llama's are `GgufModel::metadata`'s own), in
/// the order the converter adds them; a later key of the same name replaces the earlier, as
/// gguf-py's writer does.
pub(super) fn family_keys(model: &GgufModel, family: Family) -> Result<Vec<(String, Value)>> {
    let arch = family.arch_name();
    let mut keys = Keys { arch, keys: Vec::new() };
    match family {
        Family::Llama => unreachable!("Llama's keys are GgufModel::metadata's"),
        Family::Qwen2 | Family::Qwen3 => text_model_keys(model, &mut keys)?,
        Family::Gemma2 => gemma2_keys(model, &mut keys)?,
        Family::Gemma3 => {
            text_model_keys(model, &mut keys)?;
            gemma3_keys(model, &mut keys)?;
        }
    }
    Ok(keys.keys)
}

struct Keys {
    arch: &'static str,
    keys: Vec<(String, Value)>,
}

impl Keys {
    fn put(&mut self, key: &str, value: Value) {
        let key = format!("{}.{key}", self.arch);
        match self.keys.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.keys.push((key, value)),
        }
    }
}

/// `TextModel.set_gguf_parameters`, for what these configs hold: the sizes, RoPE (linear scaling
/// only: the others are refused by `GgufModel::read`), the norm epsilon, `head_dim`.
fn text_model_keys(model: &GgufModel, keys: &mut Keys) -> Result<()> {
    keys.put("block_count", model.u32_of("num_hidden_layers")?);
    for (key, name) in [
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.head_count_kv", "num_key_value_heads"),
    ] {
        if model.opt_uint(name)?.is_some() {
            keys.put(key, model.u32_of(name)?);
        }
    }
    let (full, sliding) = rope_sets(model);
    // Gemma 3's global set (`full_attention`) escapes GgufModel::read's check of the flat one
    match full["rope_type"].as_str().or(full["type"].as_str()) {
        None | Some("default" | "linear") => {}
        Some(kind) => bail!(
            "{}: RoPE scaling {kind:?} is not exported yet (export-gguf writes linear for {})",
            model.config_file().display(),
            model.family().arch_name()
        ),
    }
    if full["rope_type"] == "linear" || full["type"] == "linear" {
        if let Some(factor) = full["factor"].as_f64() {
            keys.put("rope.scaling.type", Value::String("linear".into()));
            keys.put("rope.scaling.factor", Value::F32(factor as f32));
        }
    }
    let theta = match &full["rope_theta"] {
        Json::Null => model.float("rope_theta")?,
        value => value.as_f64().map(|v| v as f32),
    };
    if let Some(theta) = theta {
        keys.put("rope.freq_base", Value::F32(theta));
    }
    let local = sliding["rope_theta"].as_f64().or(model.config()["rope_local_base_freq"].as_f64());
    if let Some(local) = local {
        keys.put("rope.freq_base_swa", Value::F32(local as f32));
    }
    if let Some(eps) = model.float("rms_norm_eps")? {
        keys.put("attention.layer_norm_rms_epsilon", Value::F32(eps));
    }
    if let Some(head_dim) = model.opt_uint("head_dim")? {
        keys.put("attention.key_length", Value::U32(head_dim as u32));
        keys.put("attention.value_length", Value::U32(head_dim as u32));
    }
    Ok(())
}

/// The RoPE parameters of global and of sliding-window layers: transformers ≥ 5's
/// `rope_parameters` (one set, or `full_attention`/`sliding_attention`), else `rope_scaling`.
fn rope_sets(model: &GgufModel) -> (&Json, &Json) {
    let config = model.config();
    let params = match &config["rope_parameters"] {
        Json::Null => &config["rope_scaling"],
        params => params,
    };
    match &params["full_attention"] {
        Json::Null => (params, &params["sliding_attention"]),
        full => (full, &params["sliding_attention"]),
    }
}

/// `Gemma2Model.set_gguf_parameters` (which does not call TextModel's: no RoPE base is written,
/// and llama.cpp runs 10000).
fn gemma2_keys(model: &GgufModel, keys: &mut Keys) -> Result<()> {
    for (key, name) in [
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
    ] {
        keys.put(key, model.u32_of(name)?);
    }
    keys.put("attention.head_count_kv", Value::U32(model.kv_heads() as u32));
    keys.put("attention.layer_norm_rms_epsilon", Value::F32(model.required_float("rms_norm_eps")?));
    keys.put("attention.key_length", model.u32_of("head_dim")?);
    keys.put("attention.value_length", model.u32_of("head_dim")?);
    keys.put("attn_logit_softcapping", Value::F32(model.required_float("attn_logit_softcapping")?));
    keys.put("final_logit_softcapping", Value::F32(model.required_float("final_logit_softcapping")?));
    keys.put("attention.sliding_window", model.u32_of("sliding_window")?);
    if let Some(theta) = model.float("rope_theta")?.filter(|&t| t != 10_000.0) {
        bail!(
            "{}: `rope_theta` = {theta}: llama.cpp's gemma2 has no RoPE base key and runs 10000",
            model.config_file().display()
        );
    }
    check_layer_types(model, |layer| layer % 2 == 0, "alternates local and global layers, local first")?;
    check_attention_scale(model, 46)
}

/// `Gemma3Model.set_gguf_parameters` over TextModel's keys.
fn gemma3_keys(model: &GgufModel, keys: &mut Keys) -> Result<()> {
    let config = model.config();
    let uint_or = |name: &str, default: u64| -> Result<Value> {
        Ok(Value::U32(model.opt_uint(name)?.unwrap_or(default) as u32))
    };
    keys.put("context_length", uint_or("max_position_embeddings", 131_072)?);
    keys.put("attention.head_count", uint_or("num_attention_heads", 8)?);
    let eps = model.float("rms_norm_eps")?.unwrap_or(1e-6);
    keys.put("attention.layer_norm_rms_epsilon", Value::F32(eps));
    keys.put("attention.key_length", uint_or("head_dim", 256)?);
    keys.put("attention.value_length", uint_or("head_dim", 256)?);
    let (full, _) = rope_sets(model);
    let theta = full["rope_theta"].as_f64().or(config["rope_theta"].as_f64()).unwrap_or(1_000_000.0);
    keys.put("rope.freq_base", Value::F32(theta as f32));
    if !config["attn_logit_softcapping"].is_null() {
        bail!(
            "{}: `attn_logit_softcapping` is set; Gemma 3 has none (llama.cpp's converter refuses it)",
            model.config_file().display()
        );
    }
    if let Some(cap) = config["final_logit_softcapping"].as_f64().filter(|&c| c != 0.0) {
        keys.put("final_logit_softcapping", Value::F32(cap as f32));
    }
    let window = config["sliding_window"].as_u64().filter(|&w| w > 0);
    if config["sliding_window_pattern"] != 1 {
        keys.put("attention.sliding_window", model.u32_of("sliding_window")?);
    }
    keys.put("attention.head_count_kv", uint_or("num_key_value_heads", 4)?);
    if window.is_some() && config["sliding_window_pattern"] != 1 {
        // llama.cpp runs five local layers to one global unless the file says otherwise: where
        // `layer_types` says otherwise, each layer's kind is written (gguf-py's
        // `add_sliding_window_pattern` of bools, which llama.cpp's `load_swa_pattern` reads)
        if let Some(types) = layer_types(model)? {
            let layers = types.len();
            if (0..layers).any(|l| types[l] != ((l + 1) % 6 != 0)) {
                keys.put(
                    "attention.sliding_window_pattern",
                    Value::Array(types.into_iter().map(Value::Bool).collect()),
                );
            }
        }
    }
    check_attention_scale(model, 62)
}

/// config.json's `layer_types` as "is a sliding-window layer", if it has them.
fn layer_types(model: &GgufModel) -> Result<Option<Vec<bool>>> {
    let Some(types) = model.config()["layer_types"].as_array() else { return Ok(None) };
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => bail!("{}: `layer_types` holds {t}", model.config_file().display()),
        })
        .collect::<Result<Vec<bool>>>()
        .map(Some)
}

/// llama.cpp fixes which layers slide (`rule`, a layer's index → local); a config.json whose
/// `layer_types` differ is refused.
fn check_layer_types(model: &GgufModel, rule: impl Fn(usize) -> bool, says: &str) -> Result<()> {
    if let Some(types) = layer_types(model)? {
        if let Some(layer) = (0..types.len()).find(|&l| types[l] != rule(l)) {
            bail!(
                "{}: `layer_types`[{layer}] is {}; llama.cpp's {} {says}",
                model.config_file().display(),
                if types[layer] { "sliding_attention" } else { "full_attention" },
                model.family().arch_name()
            );
        }
    }
    Ok(())
}

/// llama.cpp scales Gemma's queries by 1/√head_dim, or 1/√(hidden / heads) for the 27B models
/// (told apart by their layer count, `big_layers`), not by config.json's
/// `query_pre_attn_scalar`: a config whose scalar is another number is refused.
fn check_attention_scale(model: &GgufModel, big_layers: u64) -> Result<()> {
    let Some(scalar) = model.opt_uint("query_pre_attn_scalar")? else { return Ok(()) };
    let head_dim = model.opt_uint("head_dim")?.unwrap_or(256);
    let used = if model.uint("num_hidden_layers")? == big_layers {
        model.uint("hidden_size")? / model.heads().max(1) as u64
    } else {
        head_dim
    };
    if scalar != used {
        bail!(
            "{}: `query_pre_attn_scalar` = {scalar}, but llama.cpp's {} scales queries by \
             1/sqrt({used}) for this model (head_dim, or hidden_size / heads for the 27B layer count)",
            model.config_file().display(),
            model.family().arch_name()
        );
    }
    Ok(())
}
