//! `import_gguf` of a tiny GGUF file per architecture (llama 3.x with RoPE factors, qwen2, qwen3,
//! gemma2, gemma3; F32, F16, Q8_0 and Q4_0 tensors), written with the `gguf` package as llama.cpp's
//! converter writes them, against what transformers 5.17's GGUF loader makes of the same file:
//! every config.json key the golden lists, and every parameter bit for bit (FNV-1a 64 of its f32
//! bytes). Where that loader drops what llama.cpp reads, the golden holds llama.cpp's value and
//! names the key under `llama_cpp_overrides`. Goldens: scripts/golden/gguf_arch_golden.py →
//! tests/golden/gguf_<case>.json, files in tests/fixtures/gguf/.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::safetensors::MmapedSafetensors;
use candle_core::Device;
use lora_ft::arch::{Architecture, ModelConfig};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

fn read_json(path: &Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Same checksum as the golden script's `fnv1a64_bytes`.
fn fnv1a64(bytes: &[u8]) -> String {
    let hash =
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    format!("{hash:016x}")
}

struct Imported {
    dir: PathBuf,
    golden: Json,
}

impl Drop for Imported {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("lora-ft-gguf-arch-{name}-{}", std::process::id()))
}

/// Imports tests/fixtures/gguf/tiny-<case>.gguf and checks it against its golden: the class,
/// every golden config key, every tensor's shape, bytes and first values, and nothing else.
fn import_and_compare(case: &str) -> Imported {
    let golden = read_json(Path::new(&format!("tests/golden/gguf_{case}.json")));
    let gguf = PathBuf::from(format!("tests/fixtures/gguf/tiny-{case}.gguf"));
    let dir = temp(case);
    let _ = std::fs::remove_dir_all(&dir);
    let summary = lora_ft::gguf::import_gguf(&gguf, &dir).unwrap();
    let imported = Imported { dir, golden };
    let golden = &imported.golden;
    assert_eq!(summary.architecture, golden["config"]["architectures"][0]);

    let config = read_json(&imported.dir.join("config.json"));
    for (key, want) in golden["config"].as_object().unwrap() {
        assert_eq!(&config[key], want, "{case}: config.json key {key}");
    }

    let weights = unsafe { MmapedSafetensors::new(imported.dir.join("model.safetensors")) }.unwrap();
    let expected = golden["tensors"].as_object().unwrap();
    let mut names: Vec<String> = weights.tensors().into_iter().map(|(n, _)| n).collect();
    names.sort();
    let mut want_names: Vec<String> = expected.keys().cloned().collect();
    want_names.sort();
    assert_eq!(names, want_names, "{case}: tensor names");
    for (name, check) in expected {
        let tensor = weights.load(name, &Device::Cpu).unwrap();
        let shape: Vec<usize> = serde_json::from_value(check["shape"].clone()).unwrap();
        assert_eq!(tensor.dims(), shape.as_slice(), "{case}: {name} shape");
        let values = tensor.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (i, want) in check["first"].as_array().unwrap().iter().enumerate() {
            assert_eq!(values[i], want.as_f64().unwrap() as f32, "{case}: {name}[{i}]");
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            fnv1a64(&bytes),
            check["fnv1a64"].as_str().unwrap(),
            "{case}: {name} differs from transformers'"
        );
    }
    imported
}

fn model_architecture(imported: &Imported) -> Architecture {
    let config = ModelConfig::from_file(&imported.dir.join("config.json")).unwrap();
    Architecture::from_config(&config).unwrap()
}

/// Llama 3.x: Q/K rows un-permuted, tied embeddings, and the `rope_freqs` factors turned into
/// `llama3` rope parameters whose frequencies are llama.cpp's (transformers' loader drops them).
#[test]
fn llama3_matches_transformers_and_llama_cpp_frequencies() {
    let imported = import_and_compare("llama3");
    let golden = &imported.golden;
    assert_eq!(golden["transformers_config"]["rope_parameters"]["rope_type"], "default");
    assert_eq!(golden["llama_cpp_overrides"], serde_json::json!(["rope_parameters"]));
    let arch = model_architecture(&imported);
    assert_eq!((arch.head_dim, arch.num_heads, arch.num_kv_heads), (64, 4, 2));
    assert!(arch.tied_embeddings && !arch.qkv_bias && !arch.qk_norm);
    let (ours, _) = lora_ft::model::ops::rope::frequencies(arch.head_dim, &arch.rope);
    let want: Vec<f64> = serde_json::from_value(golden["llama_cpp_inv_freq"].clone()).unwrap();
    assert_eq!(ours.len(), want.len());
    // llama.cpp's side rounds base^(-2i/d) and the factor to f32 once each; ours is f64
    let bound = lora_ft::testing::FLOOR;
    for (i, (a, b)) in ours.iter().zip(&want).enumerate() {
        assert!((a - b).abs() <= bound * b, "inv_freq[{i}]: {a} vs llama.cpp {b}");
    }
    // the scaled entries do differ from plain RoPE: the check above is not vacuous
    let plain = 1.0 / 500000f64.powf(2.0 * 31.0 / 64.0);
    assert!((want[31] - plain / 8.0).abs() < 1e-6 * plain);
}

#[test]
fn qwen2_matches_transformers() {
    let imported = import_and_compare("qwen2");
    let arch = model_architecture(&imported);
    assert!(arch.qkv_bias && !arch.tied_embeddings && !arch.qk_norm);
    assert_eq!(arch.head_dim, 16);
    assert!(arch.windows.iter().all(Option::is_none));
}

/// Qwen3: head_dim (32, not hidden / heads = 16) from `attention.key_length`, which
/// transformers 5.17's mapping lacks (the golden script passes it to from_pretrained).
#[test]
fn qwen3_matches_transformers() {
    let imported = import_and_compare("qwen3");
    assert_eq!(imported.golden["llama_cpp_overrides"], serde_json::json!(["head_dim"]));
    let arch = model_architecture(&imported);
    assert!(arch.qk_norm && !arch.qkv_bias && arch.tied_embeddings);
    assert_eq!((arch.head_dim, arch.num_heads, arch.num_kv_heads), (32, 4, 2));
}

/// Gemma 2: norms stored as w + 1 come back as w, softcaps (40 / 25 in this file, not the
/// defaults) from the metadata, query_pre_attn_scalar = head_dim, even layers local.
#[test]
fn gemma2_matches_transformers() {
    let imported = import_and_compare("gemma2");
    let config = read_json(&imported.dir.join("config.json"));
    assert_eq!(config["model_type"], "gemma2");
    assert_eq!(config["attn_logit_softcapping"], 40.0);
    assert_eq!(config["final_logit_softcapping"], 25.0);
    assert_eq!(config["query_pre_attn_scalar"], 32);
    assert_eq!(
        config["layer_types"],
        serde_json::json!(["sliding_attention", "full_attention", "sliding_attention"])
    );
    // and the model reads it as Gemma 2
    let arch = model_architecture(&imported);
    assert_eq!((arch.attention_softcap, arch.final_logit_softcap), (Some(40.0), Some(25.0)));
    assert_eq!((arch.norm_weight_offset, arch.post_sublayer_norms), (1.0, true));
    assert_eq!(arch.query_scale, 1.0 / 32f64.sqrt());
    assert_eq!(arch.windows.iter().map(Option::is_some).collect::<Vec<_>>(), [true, false, true]);
}

/// Gemma 3: q/k norms, five local layers to one global, linear RoPE scaling (8) on the global
/// layers only, local base 10000.
#[test]
fn gemma3_matches_transformers() {
    let imported = import_and_compare("gemma3");
    let config = read_json(&imported.dir.join("config.json"));
    assert_eq!(config["model_type"], "gemma3_text");
    let rope = &config["rope_parameters"];
    assert_eq!(
        rope["full_attention"],
        serde_json::json!({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6})
    );
    assert_eq!(rope["sliding_attention"], serde_json::json!({"rope_type": "default", "rope_theta": 1e4}));
    let kinds: Vec<String> = serde_json::from_value(config["layer_types"].clone()).unwrap();
    assert_eq!(kinds.iter().filter(|k| *k == "full_attention").count(), 1);
    assert_eq!(kinds[5], "full_attention");
    // and the model reads it as Gemma 3: the global layer's RoPE scaled, the local ones' not
    let arch = model_architecture(&imported);
    assert!(arch.qk_norm && arch.tied_embeddings);
    assert_eq!(arch.rope_of(5).scaling, lora_ft::arch::RopeScaling::Linear { factor: 8.0 });
    assert_eq!((arch.rope_of(0).theta, &arch.rope_of(0).scaling), (1e4, &lora_ft::arch::RopeScaling::None));
}

fn write_gguf(name: &str, metadata: &[(&str, Value)]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("lora-ft-{name}-{}.gguf", std::process::id()));
    let mut file = std::fs::File::create(&path).unwrap();
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut file, &metadata, &[]).unwrap();
    path
}

/// An unknown `general.architecture` is named with the supported list, before anything is
/// written; a missing key of a known one is named.
#[test]
fn unknown_architectures_and_missing_keys_are_named() {
    let path = write_gguf("phi3", &[("general.architecture", Value::String("phi3".into()))]);
    let out = temp("phi3-out");
    let err = format!("{:#}", lora_ft::gguf::import_gguf(&path, &out).unwrap_err());
    let _ = std::fs::remove_file(&path);
    let want = format!(
        "{}: GGUF key `general.architecture` is \"phi3\"; lora-ft imports \"llama\", \"mistral\", \
         \"qwen2\", \"qwen3\", \"gemma2\" and \"gemma3\"",
        path.display()
    );
    assert_eq!(err, want);
    assert!(!out.exists());

    let path = write_gguf(
        "gemma3-keys",
        &[
            ("general.architecture", Value::String("gemma3".into())),
            ("gemma3.embedding_length", Value::U32(64)),
            ("gemma3.attention.head_count", Value::U32(4)),
        ],
    );
    let err = format!("{:#}", lora_ft::gguf::import_gguf(&path, &out).unwrap_err());
    let _ = std::fs::remove_file(&path);
    assert_eq!(err, format!("{}: GGUF key `gemma3.feed_forward_length` is missing", path.display()));
    assert!(!out.exists());
}
