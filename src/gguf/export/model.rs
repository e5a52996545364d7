//! A Hugging Face model (config.json, tokenizer files, weights) → what a GGUF file of it holds,
//! as llama.cpp's `convert_hf_to_gguf.py` writes it: the `general.*` keys, the model's own
//! (`<arch>.*`, `hparams.rs`), the tokenizer keys (`vocab.rs`), each tensor's llama.cpp name and
//! type, and its data (Q/K rows permuted for the llama graph, Gemma's norms w + 1) quantized as
//! gguf-py quantizes.

use super::file_type::FileType;
use super::hf_model::HfModel;
use super::{hparams, q4km, vocab};
use crate::arch::family::{Converter, Family};
use crate::gguf::format::qk_permutation::permute_rows;
use crate::gguf::format::quants::quantize_rows;
use crate::gguf::format::rope_freqs::{llama3_factor, LLAMA3_ORIGINAL_CONTEXT, ROPE_FREQS};
use crate::gguf::format::tensor_names::gguf_tensor_name;
use crate::gguf::format::writer::TensorInfo;
use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Tensor};
use std::path::Path;

/// One Hugging Face tensor's place in the GGUF file.
#[derive(Debug, Clone)]
pub struct Planned {
    pub info: TensorInfo,
    /// Head groups of a Q (all heads) or K (the KV heads) weight, whose rows llama.cpp permutes.
    permute: Option<usize>,
    /// Added to every value before it is stored (Gemma's norms: w + 1).
    offset: f32,
}

/// A model read for export, and the type of its 2-D weights in the file.
pub struct GgufModel {
    hf: HfModel,
    file_type: FileType,
}

impl GgufModel {
    /// Reads `config_file`; refuses what this exporter does not write (another family, RoPE
    /// scaling).
    pub fn read(config_file: &Path, file_type: FileType) -> Result<Self> {
        Ok(Self { hf: HfModel::read(config_file)?, file_type })
    }

    /// The declaration of the model's family.
    pub fn family(&self) -> &'static Family {
        self.hf.family()
    }

    /// Tensors llama.cpp's converter adds to the model's own: for Llama 3's RoPE scaling
    /// (`llama3`), `rope_freqs.weight`, each frequency's divisor (its `generate_extra_tensors`).
    pub fn extra_tensors(&self) -> Result<Vec<(TensorInfo, Vec<u8>)>> {
        let Some(("llama3", scaling)) = self.hf.rope_scaling() else { return Ok(Vec::new()) };
        let head_dim = match self.hf.opt_uint("head_dim")? {
            Some(dim) => dim,
            None => self.hf.uint("hidden_size")? / self.hf.heads().max(1) as u64,
        };
        let theta = f64::from(self.hf.float("rope_theta")?.unwrap_or(10000.0));
        let factor = self.hf.scaling_float(scaling, "factor", Some(8.0))?;
        let low = self.hf.scaling_float(scaling, "low_freq_factor", Some(1.0))?;
        let high = self.hf.scaling_float(scaling, "high_freq_factor", Some(4.0))?;
        let original = LLAMA3_ORIGINAL_CONTEXT as f64;
        let original = self.hf.scaling_float(scaling, "original_max_position_embeddings", Some(original))?;
        let factors: Vec<f32> = (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
                llama3_factor(freq, factor, low, high, original) as f32
            })
            .collect();
        let info = TensorInfo { name: ROPE_FREQS.into(), shape: vec![factors.len()], dtype: GgmlDType::F32 };
        Ok(vec![(info, factors.iter().flat_map(|v| v.to_le_bytes()).collect())])
    }

    /// Every key of the file: `general.*`, the model's own (`<arch>.*`, as convert_hf_to_gguf.py's
    /// model class writes them) and the tokenizer's, from the folder of config.json.
    pub fn metadata(&self, name: &str) -> Result<Vec<(String, Value)>> {
        let vocab_size = self.hf.uint("vocab_size")?;
        let string = |s: &str| Value::String(s.to_string());
        let mut keys: Vec<(String, Value)> = vec![
            ("general.architecture".into(), string(self.hf.family().gguf.written_as)),
            ("general.type".into(), string("model")),
            ("general.name".into(), string(name)),
        ];
        keys.extend(hparams::arch_keys(&self.hf)?);
        keys.push(("general.file_type".into(), Value::U32(self.file_type.id())));
        keys.push(("general.quantization_version".into(), Value::U32(2)));
        let dir = self.hf.config_file().parent().unwrap_or(Path::new("."));
        keys.extend(vocab::tokenizer_metadata(dir, vocab_size as usize, self.hf.config())?);
        Ok(keys)
    }

    /// The GGUF name, shape and type of Hugging Face tensor `hf_name`; `None` for what llama.cpp
    /// does not keep (`rotary_emb.inv_freq`). Types as convert_hf_to_gguf.py's
    /// `prepare_tensors`: 1-D tensors and norms f32; 2-D weights in the file type, f16 where a
    /// row does not split into q8_0 blocks of 32 (gguf-py's `QuantError` fallback).
    pub fn plan(&self, hf_name: &str, shape: &[usize]) -> Result<Option<Planned>> {
        if hf_name.ends_with(".rotary_emb.inv_freq") {
            return Ok(None);
        }
        if hf_name == "lm_head.weight" && self.hf.family().gguf.converter == Converter::Gemma2 {
            // Gemma2Model skips it: llama.cpp's gemma2 has no output.weight, token_embd is the head
            if self.hf.config()["tie_word_embeddings"] == false {
                bail!(
                    "{}: tie_word_embeddings is false, but llama.cpp's gemma2 computes the logits with \
                     the embedding matrix (it has no output.weight)",
                    self.hf.config_file().display()
                );
            }
            return Ok(None);
        }
        let family = self.hf.family();
        let arch = family.gguf.written_as;
        let Some(name) = gguf_tensor_name(family.gguf.tensors, hf_name) else {
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
        let permute = if !family.gguf.permutes_qk {
            None
        } else if name.ends_with(".attn_q.weight") {
            Some(self.hf.heads())
        } else if name.ends_with(".attn_k.weight") {
            Some(self.hf.kv_heads())
        } else {
            None
        };
        if let Some(groups) = permute {
            if shape.len() != 2 || groups == 0 || !shape[0].is_multiple_of(2 * groups) {
                bail!("tensor {hf_name} of shape {shape:?} does not split into {groups} heads of even size");
            }
        }
        // Gemma's RMSNorm scales by (1 + w), and its converters write every `*norm.weight` as
        // w + 1 (`modify_tensors`, `norm_shift`)
        let offset = if hf_name.ends_with("norm.weight") { family.gguf.stored_norm_offset } else { 0.0 };
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
        let layers = self.hf.uint("num_hidden_layers")? as usize;
        q4km::choose_types(
            infos,
            q4km::Shape { layers, heads: self.hf.heads(), kv_heads: self.hf.kv_heads() },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::format::metadata::Metadata;
    use serde_json::{json, Value as Json};
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
        let meta = Metadata { file: Path::new("x.gguf"), map: &map };
        let back = crate::gguf::import::rope::llama3_from_factors(&meta, "llama", &factors, 500000.0, 128)
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
        assert_eq!(linear.hf.rope_scaling().map(|(kind, _)| kind), Some("linear"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
