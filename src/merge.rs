//! `lora-ft merge`: the base model with an adapter folded in, W' = W + scale · B·A for every
//! adapted projection (PEFT's `merge_and_unload`), written as an HF-layout folder that
//! transformers loads without PEFT: the base's safetensors shards with the same tensor names,
//! in f16/bf16 (or f32), its config.json with the new dtype, and its tokenizer files.
//! One shard is in memory at a time; every adapter tensor must find its projection
//! (`adapter_deltas.rs`). `lora-ft export-gguf` writes the same merge as one GGUF file
//! (`to_gguf.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{safetensors::MmapedSafetensors, DType};

use crate::durable;

mod adapter_deltas;
mod disk_full;
mod to_gguf;

use adapter_deltas::{merged_tensor, AdapterDeltas};
use disk_full::not_created;
pub use to_gguf::{export_adapter_gguf, export_gguf, GgufSummary};

/// Files of the base folder that the merged folder keeps as they are.
const COPIED: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
];

/// What a merge wrote.
#[derive(Debug)]
pub struct MergeSummary {
    pub merged_projections: usize,
    pub tensors: usize,
    pub shards: usize,
}

/// Merges the adapter in `adapter_dir` into the model `source` (folder, .gguf or Hub id) and
/// writes the result to `out_dir` in `dtype`.
pub fn merge(
    source: &str,
    revision: &str,
    adapter_dir: &Path,
    out_dir: &Path,
    dtype: DType,
) -> anyhow::Result<MergeSummary> {
    let (config, weights) = crate::hub::config_and_weights(source, revision)?;
    let mut deltas = AdapterDeltas::load(adapter_dir)?;
    let mut summary = None;
    // the folder appears whole or not at all: a full disk leaves no half-merged model behind
    durable::write_dir_atomic(out_dir, |dir| {
        summary = Some(write_merged_shards(&weights, &mut deltas, dir, dtype)?);
        deltas.ensure_all_used(adapter_dir)?;
        write_config(&config, dir, dtype)?;
        copy_side_files(&config, dir, weights.len() > 1)
    })
    .map_err(|e| not_created(e, out_dir))?;
    summary.context("the merge wrote no shards")
}

/// Each shard of the base with its adapted weights replaced by W + scale·B·A, in `dtype`, into
/// `dir` under the shard's own name.
fn write_merged_shards(
    weights: &[PathBuf],
    deltas: &mut AdapterDeltas,
    dir: &Path,
    dtype: DType,
) -> anyhow::Result<MergeSummary> {
    let (mut merged, mut tensors) = (0, 0);
    for shard in weights {
        // SAFETY: read-only maps of files nobody writes while we read them.
        let st = unsafe { MmapedSafetensors::new(shard) }
            .with_context(|| format!("opening {}", shard.display()))?;
        let mut out = HashMap::new();
        for (name, _) in st.tensors() {
            let (w, adapted) = merged_tensor(&st, shard, &name, deltas)?;
            merged += usize::from(adapted);
            out.insert(name, w.to_dtype(dtype)?);
        }
        tensors += out.len();
        let file = dir.join(shard.file_name().context("a shard without a file name")?);
        // the "format": "pt" metadata torch's own writer adds (transformers checks it)
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::tensor::serialize_to_file(
            out.iter().map(|(k, v)| (k.as_str(), v)),
            Some(metadata),
            &file,
        )
        .with_context(|| durable::Writing(file.clone()))?;
        durable::as_created(&file)?;
    }
    Ok(MergeSummary { merged_projections: merged, tensors, shards: weights.len() })
}

/// The base's config.json with the merged dtype (`torch_dtype`, and `dtype` as transformers 5 writes).
fn write_config(config: &Path, out_dir: &Path, dtype: DType) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
    let name = match dtype {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        _ => "float32",
    };
    if let Some(obj) = json.as_object_mut() {
        obj.insert("torch_dtype".into(), name.into());
        obj.insert("dtype".into(), name.into());
    }
    durable::write(&out_dir.join("config.json"), serde_json::to_string_pretty(&json)?.as_bytes())
}

/// Tokenizer and generation files, and the shard index when there are shards.
fn copy_side_files(config: &Path, out_dir: &Path, sharded: bool) -> anyhow::Result<()> {
    let dir: PathBuf = config.parent().map(Path::to_path_buf).unwrap_or_default();
    let index = sharded.then_some("model.safetensors.index.json");
    for name in COPIED.iter().copied().chain(index) {
        let from = dir.join(name);
        if from.is_file() {
            let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
            durable::write(&out_dir.join(name), &bytes)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CausalLm;
    use crate::peft_adapter::ADAPTER_WEIGHTS;
    use crate::quant::Quantization;
    use candle_core::{Device, Tensor};

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama")
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lora-ft-merge-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn logits(dir: &Path, adapter: Option<&Path>) -> Tensor {
        let (config, weights) = crate::hub::local_weights(dir).unwrap();
        let mut lm = CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap();
        if let Some(adapter) = adapter {
            crate::peft_adapter::load_adapter(&mut lm, adapter).unwrap();
        }
        let ids = Tensor::new(&[[1u32, 5, 9, 2, 7, 3, 11, 4]], &Device::Cpu).unwrap();
        lm.forward(&ids, None).unwrap()
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        d / b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    /// The merged model's logits equal the base model's with the adapter applied: to f32
    /// rounding when merged in f32, to f16 rounding of the weights in f16.
    #[test]
    fn merged_logits_equal_base_plus_adapter_logits() {
        let adapter = fixture().join("adapter");
        let want = logits(&fixture(), Some(&adapter));
        let base = logits(&fixture(), None);
        assert!(max_rel(&base, &want) > 1e-3, "the fixture's adapter changes the logits");
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 5e-3)] {
            let out = scratch(&format!("{dtype:?}"));
            let s = merge(fixture().to_str().unwrap(), "main", &adapter, &out, dtype).unwrap();
            assert_eq!((s.merged_projections, s.shards), (2 * 7, 1), "2 layers x 7 projections");
            let got = logits(&out, None);
            let err = max_rel(&got, &want);
            assert!(err < tol, "{dtype:?}: {err}");
            let config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
            assert_eq!(config["torch_dtype"], if dtype == DType::F16 { "float16" } else { "float32" });
            let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
            let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
            assert_eq!(
                header.metadata().as_ref().and_then(|m| m.get("format")).map(String::as_str),
                Some("pt")
            );
            std::fs::remove_dir_all(&out).unwrap();
        }
    }

    /// An adapter of another model says which weight and shapes disagree, and writes no config.
    #[test]
    fn an_adapter_that_does_not_fit_the_model_is_an_error() {
        let adapter = scratch("bad-adapter");
        std::fs::create_dir_all(&adapter).unwrap();
        let src = fixture().join("adapter");
        std::fs::copy(src.join("adapter_config.json"), adapter.join("adapter_config.json")).unwrap();
        let mut tensors = candle_core::safetensors::load(src.join(ADAPTER_WEIGHTS), &Device::Cpu).unwrap();
        let key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
        let a = tensors.get(key).unwrap().clone();
        tensors.insert(
            key.to_string(),
            Tensor::zeros((a.dim(0).unwrap(), a.dim(1).unwrap() + 1), DType::F32, &Device::Cpu).unwrap(),
        );
        candle_core::safetensors::save(&tensors, adapter.join(ADAPTER_WEIGHTS)).unwrap();
        let out = scratch("bad-out");
        let err =
            merge(fixture().to_str().unwrap(), "main", &adapter, &out, DType::F16).unwrap_err().to_string();
        assert!(
            err.contains("model.layers.0.self_attn.q_proj.weight") && err.contains("does not fit"),
            "{err}"
        );
        assert!(!out.join("config.json").exists());
        // a module the model does not have
        tensors.remove(key);
        let b = tensors.remove("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight").unwrap();
        tensors.insert("base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight".into(), a);
        tensors.insert("base_model.model.model.layers.9.self_attn.q_proj.lora_B.weight".into(), b);
        candle_core::safetensors::save(&tensors, adapter.join(ADAPTER_WEIGHTS)).unwrap();
        let err =
            merge(fixture().to_str().unwrap(), "main", &adapter, &out, DType::F16).unwrap_err().to_string();
        assert!(err.contains("match no weight") && err.contains("layers.9"), "{err}");
        // a config whose rank or targets are not the weights'
        let config = std::fs::read_to_string(src.join("adapter_config.json")).unwrap();
        let weights = adapter.join(ADAPTER_WEIGHTS).display().to_string();
        for (from, to, what) in
            [("\"r\": 4", "\"r\": 8", "has rank 4"), ("\"v_proj\"", "\"k_proj\"", "lists target_modules")]
        {
            std::fs::write(adapter.join("adapter_config.json"), config.replace(from, to)).unwrap();
            let err = merge(fixture().to_str().unwrap(), "main", &adapter, &out, DType::F16).unwrap_err();
            let err = err.to_string();
            assert!(err.starts_with(&format!("{weights}: ")) && err.contains(what), "{err}");
        }
        let _ = std::fs::remove_dir_all(&adapter);
        let _ = std::fs::remove_dir_all(&out);
    }
}
