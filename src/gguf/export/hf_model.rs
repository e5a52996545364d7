//! The Hugging Face model being exported, as its config.json says: its family, its head counts,
//! and typed reading of its keys (every error names the file and the key). What llama.cpp would
//! run otherwise than transformers (RoPE scalings it lacks, sliding windows) is refused here, on
//! reading.

use crate::arch::families::{by_model_type, listed, FAMILIES};
use crate::arch::family::{Converter, Family};
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// A model's config.json read for export, and the numbers the tensors need.
pub(super) struct HfModel {
    config_file: PathBuf,
    config: Json,
    family: &'static Family,
    heads: usize,
    kv_heads: usize,
}

impl HfModel {
    /// Reads `config_file`; refuses what this exporter does not write (another family, RoPE
    /// scaling).
    pub(super) fn read(config_file: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(config_file)
            .with_context(|| format!("reading {}", config_file.display()))?;
        let config: Json =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config_file.display()))?;
        let model_type = config["model_type"].as_str().unwrap_or_default().to_string();
        let Some(family) = by_model_type(&model_type) else {
            let types: Vec<String> = FAMILIES.iter().map(|f| model_types(f.model_types)).collect();
            bail!(
                "{}: model_type {model_type:?}; export-gguf writes {}",
                config_file.display(),
                listed(&types)
            );
        };
        if family.gguf.converter == Converter::Gemma3 && !config["text_config"].is_null() {
            bail!(
                "{}: a multimodal Gemma 3 (`text_config`); export-gguf writes the text model \
                 (Gemma3ForCausalLM, model_type gemma3_text)",
                config_file.display()
            );
        }
        let model = Self { config_file: config_file.to_path_buf(), config, family, heads: 0, kv_heads: 0 };
        let allowed: &[&str] =
            if family.gguf.converter == Converter::Llama { &["linear", "llama3"] } else { &["linear"] };
        if let Some((kind, _)) = model.rope_scaling().filter(|(kind, _)| !allowed.contains(kind)) {
            bail!(
                "{}: RoPE scaling {kind:?} is not exported yet (export-gguf writes {} for {model_type})",
                config_file.display(),
                allowed.join(" and ")
            );
        }
        check_sliding_window(&model)?;
        let heads = model.uint("num_attention_heads")? as usize;
        let kv_heads = model.opt_uint("num_key_value_heads")?.map_or(heads, |n| n as usize);
        Ok(Self { heads, kv_heads, ..model })
    }

    /// The RoPE scaling config.json states, with its type: `rope_parameters` (transformers ≥ 5)
    /// or `rope_scaling`; `None` for plain RoPE.
    pub(super) fn rope_scaling(&self) -> Option<(&str, &Json)> {
        [&self.config["rope_parameters"], &self.config["rope_scaling"]].into_iter().find_map(|p| {
            let kind = p["rope_type"].as_str().or(p["type"].as_str())?;
            (kind != "default").then_some((kind, p))
        })
    }

    /// A number of the RoPE scaling, or its default.
    pub(super) fn scaling_float(&self, scaling: &Json, key: &str, default: Option<f64>) -> Result<f64> {
        match &scaling[key] {
            Json::Null => default,
            value => value.as_f64(),
        }
        .with_context(|| format!("{}: RoPE scaling `{key}` is {}", self.config_file.display(), scaling[key]))
    }

    pub(super) fn config(&self) -> &Json {
        &self.config
    }

    pub(super) fn config_file(&self) -> &Path {
        &self.config_file
    }

    pub(super) fn family(&self) -> &'static Family {
        self.family
    }

    pub(super) fn heads(&self) -> usize {
        self.heads
    }

    pub(super) fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub(super) fn opt_uint(&self, key: &str) -> Result<Option<u64>> {
        match &self.config[key] {
            Json::Null => Ok(None),
            value => value.as_u64().map(Some).with_context(|| {
                format!("{}: `{key}` is {value}, expected a non-negative integer", self.config_file.display())
            }),
        }
    }

    pub(super) fn uint(&self, key: &str) -> Result<u64> {
        self.opt_uint(key)?.with_context(|| format!("{}: `{key}` is missing", self.config_file.display()))
    }

    /// A config number as a GGUF u32.
    pub(super) fn u32_of(&self, key: &str) -> Result<Value> {
        let value = self.uint(key)?;
        u32::try_from(value)
            .map(Value::U32)
            .with_context(|| format!("{}: `{key}` = {value} is over 2^32", self.config_file.display()))
    }

    pub(super) fn required_float(&self, key: &str) -> Result<f32> {
        self.float(key)?.with_context(|| format!("{}: `{key}` is missing", self.config_file.display()))
    }

    pub(super) fn float(&self, key: &str) -> Result<Option<f32>> {
        let value = match key {
            "rope_theta" if self.config[key].is_null() => &self.config["rope_parameters"][key],
            _ => &self.config[key],
        };
        match value {
            Json::Null => Ok(None),
            value => value.as_f64().map(|v| Some(v as f32)).with_context(|| {
                format!("{}: `{key}` is {value}, expected a number", self.config_file.display())
            }),
        }
    }
}

/// A family's `model_type`s as the refusal lists them: `gemma3(_text)` for a name and its
/// longer form, else joined by slashes.
fn model_types(types: &[&str]) -> String {
    match types {
        [long, short] if long.starts_with(short) => format!("{short}({})", &long[short.len()..]),
        _ => types.join("/"),
    }
}

/// A sliding window llama.cpp would not run: its llama, qwen2 and qwen3 graphs attend to the
/// whole context. Mistral 7B v0.1's window of 4096 in a 32768 context is dropped with a warning,
/// as convert_hf_to_gguf.py drops it (every GGUF of that model runs so, and rows up to the window
/// are computed alike); Qwen's `use_sliding_window` is refused.
fn check_sliding_window(model: &HfModel) -> Result<()> {
    let config = model.config();
    let file = model.config_file().display();
    match model.family().gguf.converter {
        Converter::Llama => {
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
        Converter::Text if config["use_sliding_window"] == true => {
            bail!(
                "{file}: `use_sliding_window` is true: llama.cpp's {} has no sliding window",
                model.family().gguf.written_as
            )
        }
        _ => {}
    }
    Ok(())
}
