//! config.json → the model's `<arch>.*` keys, as llama.cpp's `convert_hf_to_gguf.py` writes
//! each family's: `LlamaModel` (Llama and Mistral), `Qwen2Model`/`Qwen3Model`
//! (`TextModel.set_gguf_parameters`), `Gemma2Model` and `Gemma3Model`, chosen by the converter
//! each family's declaration names; what llama.cpp cannot run as transformers does is refused,
//! naming the config key.

use super::hf_model::HfModel;
use crate::arch::family::Converter;
use anyhow::{bail, Result};
use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;

/// The model's `<arch>.*` keys, in the order the converter adds them; for Qwen and Gemma a later
/// key of the same name replaces the earlier, as gguf-py's writer does.
pub(super) fn arch_keys(model: &HfModel) -> Result<Vec<(String, Value)>> {
    let family = model.family();
    let arch = family.gguf.written_as;
    let mut keys = Keys { arch, keys: Vec::new() };
    match family.gguf.converter {
        Converter::Llama => return llama_keys(model),
        Converter::Text => text_model_keys(model, &mut keys)?,
        Converter::Gemma2 => gemma2_keys(model, &mut keys)?,
        Converter::Gemma3 => {
            text_model_keys(model, &mut keys)?;
            gemma3_keys(model, &mut keys)?;
        }
    }
    Ok(keys.keys)
}

/// The `llama.*` keys (`TextModel` and `LlamaModel.set_gguf_parameters`).
fn llama_keys(model: &HfModel) -> Result<Vec<(String, Value)>> {
    let hidden = model.uint("hidden_size")?;
    let head_dim = model.opt_uint("head_dim")?;
    let eps = model.required_float("rms_norm_eps")?;
    let mut keys = vec![
        ("llama.block_count", model.u32_of("num_hidden_layers")?),
        ("llama.context_length", model.u32_of("max_position_embeddings")?),
        ("llama.embedding_length", model.u32_of("hidden_size")?),
        ("llama.feed_forward_length", model.u32_of("intermediate_size")?),
        ("llama.attention.head_count", Value::U32(model.heads() as u32)),
        ("llama.attention.head_count_kv", Value::U32(model.kv_heads() as u32)),
    ];
    if let Some(theta) = model.float("rope_theta")? {
        keys.push(("llama.rope.freq_base", Value::F32(theta)));
    }
    keys.push(("llama.attention.layer_norm_rms_epsilon", Value::F32(eps)));
    if let Some(("linear", scaling)) = model.rope_scaling() {
        keys.push(("llama.rope.scaling.type", Value::String("linear".into())));
        keys.push((
            "llama.rope.scaling.factor",
            Value::F32(model.scaling_float(scaling, "factor", None)? as f32),
        ));
    }
    // Mistral Nemo: head_dim 128 with hidden / heads = 160
    if let Some(head_dim) = head_dim {
        keys.push(("llama.attention.key_length", Value::U32(head_dim as u32)));
        keys.push(("llama.attention.value_length", Value::U32(head_dim as u32)));
    }
    keys.push(("llama.vocab_size", model.u32_of("vocab_size")?));
    let rope_dims = head_dim.unwrap_or(hidden / model.heads().max(1) as u64);
    keys.push(("llama.rope.dimension_count", Value::U32(rope_dims as u32)));
    Ok(keys.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
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
/// only: the others are refused by `HfModel::read`), the norm epsilon, `head_dim`.
fn text_model_keys(model: &HfModel, keys: &mut Keys) -> Result<()> {
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
    // Gemma 3's global set (`full_attention`) escapes HfModel::read's check of the flat one
    match full["rope_type"].as_str().or(full["type"].as_str()) {
        None | Some("default" | "linear") => {}
        Some(kind) => bail!(
            "{}: RoPE scaling {kind:?} is not exported yet (export-gguf writes linear for {})",
            model.config_file().display(),
            model.family().gguf.written_as
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
fn rope_sets(model: &HfModel) -> (&Json, &Json) {
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
fn gemma2_keys(model: &HfModel, keys: &mut Keys) -> Result<()> {
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
fn gemma3_keys(model: &HfModel, keys: &mut Keys) -> Result<()> {
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
fn layer_types(model: &HfModel) -> Result<Option<Vec<bool>>> {
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
fn check_layer_types(model: &HfModel, rule: impl Fn(usize) -> bool, says: &str) -> Result<()> {
    if let Some(types) = layer_types(model)? {
        if let Some(layer) = (0..types.len()).find(|&l| types[l] != rule(l)) {
            bail!(
                "{}: `layer_types`[{layer}] is {}; llama.cpp's {} {says}",
                model.config_file().display(),
                if types[layer] { "sliding_attention" } else { "full_attention" },
                model.family().gguf.written_as
            );
        }
    }
    Ok(())
}

/// llama.cpp scales Gemma's queries by 1/√head_dim, or 1/√(hidden / heads) for the 27B models
/// (told apart by their layer count, `big_layers`), not by config.json's
/// `query_pre_attn_scalar`: a config whose scalar is another number is refused.
fn check_attention_scale(model: &HfModel, big_layers: u64) -> Result<()> {
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
            model.family().gguf.written_as
        );
    }
    Ok(())
}
