//! A Hugging Face model (config.json, tokenizer files, weights) → what a GGUF file of it holds,
//! as llama.cpp's `convert_hf_to_gguf.py` writes it: the `general.*` keys, the model's own
//! (`llama.*` here, as `LlamaModel`; Qwen's and Gemma's in `export_family.rs`), the tokenizer
//! keys (`vocab_out.rs`), each tensor's llama.cpp name and type, and its data (Q/K rows
//! permuted for the llama graph, Gemma's norms w + 1) quantized as gguf-py quantizes.

use super::export_family::{family_keys, Family};
use super::tensors::{gguf_tensor_name, permute_rows};
use super::writer::TensorInfo;
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// The `--type` of the 2-D weights (llama.cpp's `LlamaFileType`, `general.file_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q8_0,
    /// llama.cpp's `Q4_K_M` mix (`q4km.rs`).
    Q4KM,
}

impl FileType {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "bf16" => Ok(Self::BF16),
            "q8_0" => Ok(Self::Q8_0),
            "q4_k_m" => Ok(Self::Q4KM),
            other => bail!("--type {other:?}: export-gguf writes f32, f16, bf16, q8_0 or q4_k_m"),
        }
    }

    /// `general.file_type`: `ALL_F32` = 0, `MOSTLY_F16` = 1, `MOSTLY_Q8_0` = 7,
    /// `MOSTLY_Q4_K_M` = 15, `MOSTLY_BF16` = 32.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8_0 => 7,
            Self::Q4KM => 15,
            Self::BF16 => 32,
        }
    }

    pub fn weight_type(self) -> GgmlDType {
        match self {
            Self::F32 => GgmlDType::F32,
            Self::F16 => GgmlDType::F16,
            Self::BF16 => GgmlDType::BF16,
            Self::Q8_0 => GgmlDType::Q8_0,
            // each weight's type is chosen over the whole file (`choose_types`)
            Self::Q4KM => GgmlDType::Q4K,
        }
    }
}

/// One Hugging Face tensor's place in the GGUF file.
#[derive(Debug, Clone)]
pub struct Planned {
    pub info: TensorInfo,
    /// Head groups of a Q (all heads) or K (the KV heads) weight, whose rows llama.cpp permutes.
    permute: Option<usize>,
    /// Added to every value before it is stored (Gemma's norms: w + 1).
    offset: f32,
}

/// A model read for export: its config.json, its family and the numbers the tensors need.
pub struct GgufModel {
    config_file: PathBuf,
    config: Json,
    family: Family,
    heads: usize,
    kv_heads: usize,
    file_type: FileType,
}

impl GgufModel {
    /// Reads `config_file`; refuses what this exporter does not write (another family, RoPE
    /// scaling).
    pub fn read(config_file: &Path, file_type: FileType) -> Result<Self> {
        let text = std::fs::read_to_string(config_file)
            .with_context(|| format!("reading {}", config_file.display()))?;
        let config: Json =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config_file.display()))?;
        let model_type = config["model_type"].as_str().unwrap_or_default().to_string();
        let Some(family) = Family::of_model_type(&model_type) else {
            bail!(
                "{}: model_type {model_type:?}; export-gguf writes llama, mistral, qwen2, qwen3, gemma2 \
                 and gemma3(_text)",
                config_file.display()
            );
        };
        if family == Family::Gemma3 && !config["text_config"].is_null() {
            bail!(
                "{}: a multimodal Gemma 3 (`text_config`); export-gguf writes the text model \
                 (Gemma3ForCausalLM, model_type gemma3_text)",
                config_file.display()
            );
        }
        let model =
            Self { config_file: config_file.to_path_buf(), config, family, heads: 0, kv_heads: 0, file_type };
        let allowed: &[&str] = if family == Family::Llama { &["linear", "llama3"] } else { &["linear"] };
        if let Some((kind, _)) = model.rope_scaling().filter(|(kind, _)| !allowed.contains(kind)) {
            bail!(
                "{}: RoPE scaling {kind:?} is not exported yet (export-gguf writes {} for {model_type})",
                config_file.display(),
                allowed.join(" and ")
            );
        }
        super::export_family::check_sliding_window(&model)?;
        let heads = model.uint("num_attention_heads")? as usize;
        let kv_heads = model.opt_uint("num_key_value_heads")?.map_or(heads, |n| n as usize);
        Ok(Self { heads, kv_heads, ..model })
    }

    /// The RoPE scaling config.json states, with its type: `rope_parameters` (transformers ≥ 5)
    /// or `rope_scaling`; `None` for plain RoPE.
    fn rope_scaling(&self) -> Option<(&str, &Json)> {
        [&self.config["rope_parameters"], &self.config["rope_scaling"]].into_iter().find_map(|p| {
            let kind = p["rope_type"].as_str().or(p["type"].as_str())?;
            (kind != "default").then_some((kind, p))
        })
    }

    /// A number of the RoPE scaling, or its default.
    fn scaling_float(&self, scaling: &Json, key: &str, default: Option<f64>) -> Result<f64> {
        match &scaling[key] {
            Json::Null => default,
            value => value.as_f64(),
        }
        .with_context(|| format!("{}: RoPE scaling `{key}` is {}", self.config_file.display(), scaling[key]))
    }

    /// Tensors llama.cpp's converter adds to the model's own: for Llama 3's RoPE scaling
    /// (`llama3`), `rope_freqs.weight`, each frequency's divisor (its `generate_extra_tensors`).
    pub fn extra_tensors(&self) -> Result<Vec<(TensorInfo, Vec<u8>)>> {
        let Some(("llama3", scaling)) = self.rope_scaling() else { return Ok(Vec::new()) };
        let head_dim = match self.opt_uint("head_dim")? {
            Some(dim) => dim,
            None => self.uint("hidden_size")? / self.heads.max(1) as u64,
        };
        let theta = f64::from(self.float("rope_theta")?.unwrap_or(10000.0));
        let factor = self.scaling_float(scaling, "factor", Some(8.0))?;
        let low = self.scaling_float(scaling, "low_freq_factor", Some(1.0))?;
        let high = self.scaling_float(scaling, "high_freq_factor", Some(4.0))?;
        let original = super::rope::LLAMA3_ORIGINAL_CONTEXT as f64;
        let original = self.scaling_float(scaling, "original_max_position_embeddings", Some(original))?;
        let factors: Vec<f32> = (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
                super::rope::llama3_factor(freq, factor, low, high, original) as f32
            })
            .collect();
        let info = TensorInfo {
            name: super::tensors::ROPE_FREQS.into(),
            shape: vec![factors.len()],
            dtype: GgmlDType::F32,
        };
        Ok(vec![(info, factors.iter().flat_map(|v| v.to_le_bytes()).collect())])
    }

    pub(super) fn config(&self) -> &Json {
        &self.config
    }

    pub(super) fn config_file(&self) -> &Path {
        &self.config_file
    }

    pub fn family(&self) -> Family {
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

    /// Every key of the file: `general.*`, the model's own (`<arch>.*`, as convert_hf_to_gguf.py's
    /// model class writes them) and the tokenizer's, from the folder of config.json.
    pub fn metadata(&self, name: &str) -> Result<Vec<(String, Value)>> {
        let vocab_size = self.uint("vocab_size")?;
        let string = |s: &str| Value::String(s.to_string());
        let mut keys: Vec<(String, Value)> = vec![
            ("general.architecture".into(), string(self.family.arch_name())),
            ("general.type".into(), string("model")),
            ("general.name".into(), string(name)),
        ];
        match self.family {
            Family::Llama => keys.extend(self.llama_keys()?),
            family => keys.extend(family_keys(self, family)?),
        }
        keys.push(("general.file_type".into(), Value::U32(self.file_type.id())));
        keys.push(("general.quantization_version".into(), Value::U32(2)));
        let dir = self.config_file.parent().unwrap_or(Path::new("."));
        keys.extend(super::vocab_out::tokenizer_metadata(dir, vocab_size as usize, &self.config)?);
        Ok(keys)
    }

    /// The `llama.*` keys (`TextModel` and `LlamaModel.set_gguf_parameters`).
    fn llama_keys(&self) -> Result<Vec<(String, Value)>> {
        let hidden = self.uint("hidden_size")?;
        let head_dim = self.opt_uint("head_dim")?;
        let eps = self.required_float("rms_norm_eps")?;
        let mut keys = vec![
            ("llama.block_count", self.u32_of("num_hidden_layers")?),
            ("llama.context_length", self.u32_of("max_position_embeddings")?),
            ("llama.embedding_length", self.u32_of("hidden_size")?),
            ("llama.feed_forward_length", self.u32_of("intermediate_size")?),
            ("llama.attention.head_count", Value::U32(self.heads as u32)),
            ("llama.attention.head_count_kv", Value::U32(self.kv_heads as u32)),
        ];
        if let Some(theta) = self.float("rope_theta")? {
            keys.push(("llama.rope.freq_base", Value::F32(theta)));
        }
        keys.push(("llama.attention.layer_norm_rms_epsilon", Value::F32(eps)));
        if let Some(("linear", scaling)) = self.rope_scaling() {
            keys.push(("llama.rope.scaling.type", Value::String("linear".into())));
            keys.push((
                "llama.rope.scaling.factor",
                Value::F32(self.scaling_float(scaling, "factor", None)? as f32),
            ));
        }
        // Mistral Nemo: head_dim 128 with hidden / heads = 160
        if let Some(head_dim) = head_dim {
            keys.push(("llama.attention.key_length", Value::U32(head_dim as u32)));
            keys.push(("llama.attention.value_length", Value::U32(head_dim as u32)));
        }
        keys.push(("llama.vocab_size", self.u32_of("vocab_size")?));
        let rope_dims = head_dim.unwrap_or(hidden / self.heads.max(1) as u64);
        keys.push(("llama.rope.dimension_count", Value::U32(rope_dims as u32)));
        Ok(keys.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// The GGUF name, shape and type of Hugging Face tensor `hf_name`; `None` for what llama.cpp
    /// does not keep (`rotary_emb.inv_freq`). Types as convert_hf_to_gguf.py's
    /// `prepare_tensors`: 1-D tensors and norms f32; 2-D weights in the file type, f16 where a
    /// row does not split into q8_0 blocks of 32 (gguf-py's `QuantError` fallback).
    pub fn plan(&self, hf_name: &str, shape: &[usize]) -> Result<Option<Planned>> {
        if hf_name.ends_with(".rotary_emb.inv_freq") {
            return Ok(None);
        }
        if hf_name == "lm_head.weight" && self.family == Family::Gemma2 {
            // Gemma2Model skips it: llama.cpp's gemma2 has no output.weight, token_embd is the head
            if self.config["tie_word_embeddings"] == false {
                bail!(
                    "{}: tie_word_embeddings is false, but llama.cpp's gemma2 computes the logits with \
                     the embedding matrix (it has no output.weight)",
                    self.config_file.display()
                );
            }
            return Ok(None);
        }
        let arch = self.family.arch_name();
        let Some(name) = gguf_tensor_name(self.family.architecture(), hf_name) else {
            bail!("tensor {hf_name} has no llama.cpp counterpart in a {arch} GGUF file");
        };
        let dtype = if shape.len() <= 1 || name.ends_with("_norm.weight") || !name.ends_with(".weight") {
            GgmlDType::F32
        } else {
            let dtype = self.file_type.weight_type();
            match shape.last() {
                _ if self.file_type == FileType::Q4KM => dtype,
                Some(cols) if cols % dtype.block_size() == 0 => dtype,
                _ => GgmlDType::F16,
            }
        };
        let permute = if self.family != Family::Llama {
            None
        } else if name.ends_with(".attn_q.weight") {
            Some(self.heads)
        } else if name.ends_with(".attn_k.weight") {
            Some(self.kv_heads)
        } else {
            None
        };
        if let Some(groups) = permute {
            if shape.len() != 2 || groups == 0 || !shape[0].is_multiple_of(2 * groups) {
                bail!("tensor {hf_name} of shape {shape:?} does not split into {groups} heads of even size");
            }
        }
        let offset = self.family.stored_offset(hf_name);
        Ok(Some(Planned { info: TensorInfo { name, shape: shape.to_vec(), dtype }, permute, offset }))
    }

    /// The tensor's bytes in the file: rows permuted for Q/K, then converted or quantized.
    pub fn data(&self, planned: &Planned, tensor: &Tensor) -> Result<Vec<u8>> {
        let name = &planned.info.name;
        let mut values = tensor.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        if planned.offset != 0.0 {
            values.iter_mut().for_each(|v| *v += planned.offset);
        }
        if let Some(groups) = planned.permute {
            values = permute_rows(&values, planned.info.shape[0], groups);
        }
        quantize_rows(&values, &planned.info.shape, planned.info.dtype)
            .with_context(|| format!("tensor {name}: converting to {:?}", planned.info.dtype))
    }

    /// `--type q4_k_m`: each planned tensor's type as llama.cpp's Q4_K_M picks it, over the
    /// whole file (whether it has an `output.weight`, the layer count); other types as planned.
    pub fn choose_types(&self, infos: &mut [&mut TensorInfo]) -> Result<()> {
        if self.file_type != FileType::Q4KM {
            return Ok(());
        }
        let layers = self.uint("num_hidden_layers")? as usize;
        super::q4km::choose_types(
            infos,
            super::q4km::Shape { layers, heads: self.heads, kv_heads: self.kv_heads },
        )
    }
}

impl GgufModel {
    /// A LoRA adapter's halves for `planned` (a base weight W = scale·B·A adapts) as llama.cpp's
    /// LoRA files hold them: `<name>.lora_a` `[r, in]` and `<name>.lora_b` `[out, r]`, f32; B's
    /// rows permuted as W's are (a Q/K weight's: permuting W's rows is permuting B's).
    pub fn lora_halves(
        &self,
        planned: &Planned,
        a: &Tensor,
        b: &Tensor,
    ) -> Result<[(TensorInfo, Vec<u8>); 2]> {
        let base = &planned.info.name;
        let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
        let (rank, inputs) = a.dims2()?;
        let (outputs, rank_b) = b.dims2()?;
        if planned.info.shape != [outputs, inputs] || rank != rank_b {
            bail!(
                "the adapter does not fit {base} {:?}: lora_A {:?}, lora_B {:?} (another model's adapter?)",
                planned.info.shape,
                a.dims(),
                b.dims()
            );
        }
        let mut b_values = b.flatten_all()?.to_vec1::<f32>()?;
        if let Some(groups) = planned.permute {
            b_values = permute_rows(&b_values, outputs, groups);
        }
        let bytes = |v: Vec<f32>| v.into_iter().flat_map(f32::to_le_bytes).collect::<Vec<u8>>();
        let info = |half: &str, shape: Vec<usize>| TensorInfo {
            name: format!("{base}.{half}"),
            shape,
            dtype: GgmlDType::F32,
        };
        Ok([
            (info("lora_a", vec![rank, inputs]), bytes(a.flatten_all()?.to_vec1::<f32>()?)),
            (info("lora_b", vec![outputs, rank]), bytes(b_values)),
        ])
    }
}

/// The quantized blocks of `values` in `dtype` (for the golden tests against gguf-py).
pub fn quantize(values: &[f32], dtype: GgmlDType) -> Result<Vec<u8>> {
    quantize_rows(values, &[values.len()], dtype)
}

/// The bytes of a row-major tensor of `shape` in `dtype`: the K-quants and Q5_0 by llama.cpp's
/// reference quantizers (`kquants.rs`), the rest by candle (F32/F16/BF16/Q8_0, equal to gguf-py).
fn quantize_rows(values: &[f32], shape: &[usize], dtype: GgmlDType) -> Result<Vec<u8>> {
    let cols = *shape.last().unwrap_or(&0);
    if !cols.is_multiple_of(dtype.block_size()) {
        bail!("rows of {cols} values do not split into {dtype:?} blocks of {}", dtype.block_size());
    }
    Ok(match dtype {
        GgmlDType::Q4K => super::kquants::quantize_q4_k(values),
        GgmlDType::Q5K => super::kquants::quantize_q5_k(values),
        GgmlDType::Q6K => super::kquants::quantize_q6_k(values),
        GgmlDType::Q5_0 => super::kquants::quantize_q5_0(values),
        _ => {
            let tensor = Tensor::from_slice(values, shape, &candle_core::Device::Cpu)?;
            QTensor::quantize(&tensor, dtype)?.data()?.into_owned()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn model(config: Json) -> GgufModel {
        let dir = std::env::temp_dir().join(format!("lora-ft-gguf-rope-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!(
            "config-{}.json",
            config["rope_parameters"]["rope_type"].as_str().unwrap_or("none")
        ));
        std::fs::write(&file, config.to_string()).unwrap();
        let model = GgufModel::read(&file, FileType::F16).unwrap();
        std::fs::remove_file(&file).unwrap();
        model
    }

    fn llama(rope_parameters: Json) -> Json {
        json!({
            "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "rope_parameters": rope_parameters,
        })
    }

    /// Llama 3.1's scaling written as llama.cpp's `rope_freqs`, read back by the import as the
    /// same `llama3` parameters.
    #[test]
    fn llama3_scaling_becomes_rope_freqs_the_import_reads_back() {
        let scaling = json!({ "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192 });
        let extra = model(llama(scaling)).extra_tensors().unwrap();
        let [(info, bytes)] = extra.as_slice() else { panic!("{} extra tensors", extra.len()) };
        assert_eq!(
            (info.name.as_str(), info.shape.as_slice(), info.dtype),
            ("rope_freqs.weight", &[64][..], GgmlDType::F32)
        );
        let factors: Vec<f32> = bytes.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!((factors[0], factors[63]), (1.0, 8.0));
        let map = HashMap::new();
        let meta = super::super::Metadata { file: Path::new("x.gguf"), map: &map };
        let back = super::super::rope::llama3_from_factors(&meta, "llama", &factors, 500000.0, 128)
            .unwrap()
            .unwrap();
        assert_eq!(back["factor"], 8.0);
        assert_eq!(
            (back["low_freq_factor"].as_f64(), back["high_freq_factor"].as_f64()),
            (Some(1.0), Some(4.0))
        );
        assert_eq!(back["original_max_position_embeddings"], 8192);
        assert!(model(llama(json!({ "rope_type": "default", "rope_theta": 1e4 })))
            .extra_tensors()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn other_rope_scalings_are_named_and_refused() {
        let dir = std::env::temp_dir().join(format!("lora-ft-gguf-yarn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config.json");
        std::fs::write(&file, llama(json!({ "rope_type": "yarn", "factor": 4.0 })).to_string()).unwrap();
        let err = GgufModel::read(&file, FileType::F16).err().unwrap().to_string();
        assert!(err.contains("\"yarn\"") && err.contains("linear and llama3"), "{err}");
        let mut config = llama(Json::Null);
        config["rope_scaling"] = json!({ "type": "linear", "factor": 2.0 });
        std::fs::write(&file, config.to_string()).unwrap();
        let linear = GgufModel::read(&file, FileType::F16).unwrap();
        assert!(linear.extra_tensors().unwrap().is_empty());
        assert_eq!(linear.rope_scaling().map(|(kind, _)| kind), Some("linear"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
