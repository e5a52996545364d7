//! `import_gguf` on the real SmolLM2-135M-Instruct Q4_1 file must agree with transformers' own
//! GGUF loader: config, dequantized weights (Q/K permutation undone), tokenizer and token ids.
//! Golden values: scripts/golden/gguf_golden.py → tests/golden/gguf_smollm2.json.

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{safetensors::MmapedSafetensors, Device, Tensor};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

fn golden() -> Json {
    let text = std::fs::read_to_string("tests/golden/gguf_smollm2.json").expect("golden file");
    serde_json::from_str(&text).unwrap()
}

fn read_json(path: &Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Same checksum as the golden script's `fnv1a64`.
fn fnv1a64(text: &str) -> String {
    let hash =
        text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{hash:016x}")
}

fn close(actual: f64, expected: f64, rel: f64) -> bool {
    (actual - expected).abs() <= rel * expected.abs().max(1.0)
}

struct Imported {
    dir: PathBuf,
}

impl Drop for Imported {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn import() -> Imported {
    let dir = std::env::temp_dir().join(format!("lora-ft-gguf-import-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let started = std::time::Instant::now();
    let summary = lora_ft::gguf::import_gguf(&lora_ft::fixtures::smollm2_gguf(), &dir).unwrap();
    eprintln!("import took {:.2?}: {summary:?}", started.elapsed());
    assert_eq!(summary.architecture, "LlamaForCausalLM");
    assert_eq!(summary.tensors, 272);
    assert_eq!(summary.vocab_size, 49152);
    Imported { dir }
}

#[test]
fn import_matches_transformers_gguf_loader() {
    let golden = golden();
    let imported = import();
    check_config(&imported.dir, &golden["config"]);
    check_tensors(&imported.dir, &golden);
    check_tokenizer(&imported.dir, &golden["tokenizer"]);
    check_tokenizer_config(&imported.dir, &golden["tokenizer"]);
    let files = lora_ft::hub::local_folder(&imported.dir).unwrap();
    assert_eq!(files.weights, vec![imported.dir.join("model.safetensors")]);
    assert!(files.generation_config.is_some());
}

fn check_config(dir: &Path, expected: &Json) {
    let config = read_json(&dir.join("config.json"));
    assert_eq!(config["architectures"][0], expected["architectures"]);
    assert_eq!(config["model_type"], "llama");
    for key in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rope_theta",
        "rms_norm_eps",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ] {
        assert_eq!(config[key], expected[key], "config.json key {key}");
    }
    let generation = read_json(&dir.join("generation_config.json"));
    assert_eq!(generation["eos_token_id"], expected["eos_token_id"]);
    assert_eq!(generation["bos_token_id"], expected["bos_token_id"]);
}

fn check_tensors(dir: &Path, golden: &Json) {
    let weights = unsafe { MmapedSafetensors::new(dir.join("model.safetensors")) }.unwrap();
    assert_eq!(weights.tensors().len() as u64, golden["tensor_count"].as_u64().unwrap());
    assert!(weights.get("lm_head.weight").is_err(), "tied embeddings: no lm_head in the file");
    for (name, check) in golden["tensors"].as_object().unwrap() {
        let tensor: Tensor = weights.load(name, &Device::Cpu).unwrap();
        let shape: Vec<usize> = serde_json::from_value(check["shape"].clone()).unwrap();
        assert_eq!(tensor.dims(), shape.as_slice(), "{name} shape");
        let values: Vec<f64> =
            tensor.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f64::from).collect();
        let sum: f64 = values.iter().sum();
        let sum_sq: f64 = values.iter().map(|v| v * v).sum();
        let expected_sum = check["sum"].as_f64().unwrap();
        let expected_sq = check["sum_sq"].as_f64().unwrap();
        assert!(close(sum, expected_sum, 1e-6), "{name}: sum {sum} vs {expected_sum}");
        assert!(close(sum_sq, expected_sq, 1e-9), "{name}: sum of squares {sum_sq} vs {expected_sq}");
        let cols = if shape.len() == 2 { shape[1] } else { shape[0] };
        for (row, expected) in check["rows"].as_object().unwrap() {
            let row: usize = row.parse().unwrap();
            for (i, want) in expected.as_array().unwrap().iter().enumerate() {
                let got = values[row * cols + i];
                // both sides dequantize the same blocks in f32: equal to the last bit
                assert_eq!(got as f32, want.as_f64().unwrap() as f32, "{name}[{row}, {i}]");
            }
        }
    }
}

fn check_tokenizer(dir: &Path, expected: &Json) {
    let json = read_json(&dir.join("tokenizer.json"));
    for key in ["normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens"] {
        assert_eq!(json[key], expected[key], "tokenizer.json `{key}` differs from transformers'");
    }
    for (key, value) in expected["model"].as_object().unwrap() {
        assert_eq!(&json["model"][key], value, "tokenizer.json model.{key}");
    }
    let mut vocab: Vec<(&String, u64)> =
        json["model"]["vocab"].as_object().unwrap().iter().map(|(t, id)| (t, id.as_u64().unwrap())).collect();
    vocab.sort_by_key(|(_, id)| *id);
    assert_eq!(vocab.len() as u64, expected["vocab_len"].as_u64().unwrap());
    let vocab_text: Vec<String> = vocab.iter().map(|(t, id)| format!("{id}\t{t}")).collect();
    assert_eq!(fnv1a64(&vocab_text.join("\n")), expected["vocab_fnv1a64"]);
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{} {}", m[0].as_str().unwrap(), m[1].as_str().unwrap()))
        .collect();
    assert_eq!(merges.len() as u64, expected["merges_len"].as_u64().unwrap());
    assert_eq!(fnv1a64(&merges.join("\n")), expected["merges_fnv1a64"]);

    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    for case in expected["encodings"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        for (add_special, key) in [(true, "ids"), (false, "ids_no_special")] {
            let ids = tokenizer.encode(text, add_special).unwrap().get_ids().to_vec();
            let want: Vec<u32> = serde_json::from_value(case[key].clone()).unwrap();
            assert_eq!(ids, want, "token ids of {text:?} (add_special_tokens={add_special})");
        }
        let want: Vec<u32> = serde_json::from_value(case["ids_no_special"].clone()).unwrap();
        assert_eq!(tokenizer.decode(&want, false).unwrap(), text, "decoding {text:?}");
    }
}

fn check_tokenizer_config(dir: &Path, expected: &Json) {
    let config = read_json(&dir.join("tokenizer_config.json"));
    for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
        assert_eq!(config[key], expected[key], "tokenizer_config.json {key}");
    }
    assert_eq!(config["add_bos_token"], false);
    assert_eq!(config["model_max_length"], 8192);
    assert_eq!(config["added_tokens_decoder"]["1"]["content"], "<|im_start|>");
    assert_eq!(config["added_tokens_decoder"]["1"]["special"], true);

    let gguf = lora_ft::fixtures::smollm2_gguf();
    let content = Content::read(&mut std::fs::File::open(gguf).unwrap()).unwrap();
    let Some(Value::String(template)) = content.metadata.get("tokenizer.chat_template") else {
        panic!("the GGUF fixture has no tokenizer.chat_template")
    };
    assert!(template.contains("<|im_start|>"));
    assert_eq!(config["chat_template"].as_str().unwrap(), template);
}

#[test]
fn importing_a_non_gguf_file_names_the_file() {
    let path = std::env::temp_dir().join(format!("lora-ft-not-gguf-{}.gguf", std::process::id()));
    std::fs::write(&path, b"not a gguf file at all").unwrap();
    let out = std::env::temp_dir().join(format!("lora-ft-not-gguf-out-{}", std::process::id()));
    let err = format!("{:#}", lora_ft::gguf::import_gguf(&path, &out).unwrap_err());
    let _ = std::fs::remove_file(&path);
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(!out.join("config.json").exists());
}

/// A `.gguf` source is imported once into `<cache>/imported/<stem>-<hash>` and then reused.
#[test]
fn resolving_a_gguf_source_imports_once() {
    let gguf = lora_ft::fixtures::smollm2_gguf();
    let first = lora_ft::hub::resolve(gguf.to_str().unwrap(), "main").unwrap();
    let folder = first.dir.file_name().unwrap().to_str().unwrap().to_string();
    assert!(folder.starts_with("SmolLM2-135M-Instruct.Q4_1-"), "{folder}");
    assert_eq!(first.dir.parent().unwrap(), lora_ft::cache::dir().join("imported"));
    assert_eq!(first.weights, vec![first.dir.join("model.safetensors")]);
    assert!(first.tokenizer_config.is_some() && first.generation_config.is_some());
    let stamp = std::fs::metadata(&first.weights[0]).unwrap().modified().unwrap();
    let second = lora_ft::hub::resolve(gguf.to_str().unwrap(), "main").unwrap();
    assert_eq!(second, first);
    assert_eq!(std::fs::metadata(&second.weights[0]).unwrap().modified().unwrap(), stamp, "re-imported");
}
