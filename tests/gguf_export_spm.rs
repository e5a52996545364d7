//! `lora-ft export-gguf` of SentencePiece vocabularies (`tokenizer.ggml.model = llama`): the
//! tokens, scores and types it writes for real tokenizers equal, element for element, the
//! vocabulary GGUF files of tests/fixtures/vocab-gguf, which llama.cpp's `test-tokenizer-0`
//! tokenizes as sentencepiece / transformers do (that folder's README):
//! - from `tokenizer.model` (Mistral 7B v0.1 and v0.3, the real files of the PyPI wheel
//!   mistral_common 1.13.1): as convert_hf_to_gguf.py's `_create_vocab_sentencepiece` reads it;
//! - from tokenizer.json alone (Gemma 2 and 3, the real files): scores from the merge order.
//!
//! The special ids, add-bos/eos and `add_space_prefix` agree too; each folder's config.json is
//! the real model's (Mistral 7B, Gemma 2 2B, Gemma 3 4B), so its `<arch>.*` keys are written.

mod common;
use candle_core::quantized::gguf_file::{Content, Value};
use common::Scratch;
use lora_ft::gguf::export::{FileType, GgufModel};
use serde_json::json;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn gunzip(path: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    let file = std::fs::File::open(Path::new(FIXTURES).join(path)).unwrap();
    flate2::read::GzDecoder::new(file).read_to_end(&mut bytes).unwrap();
    bytes
}

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("gguf-spm-{name}"))
}

/// The metadata export-gguf writes for the folder `dir` (config.json and tokenizer files).
fn exported(dir: &Path) -> HashMap<String, Value> {
    let model = GgufModel::read(&dir.join("config.json"), FileType::F16).unwrap();
    model.metadata("m").unwrap().into_iter().collect()
}

fn reference(name: &str, dir: &Path) -> Content {
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, gunzip(&format!("vocab-gguf/ggml-vocab-{name}.gguf.gz"))).unwrap();
    Content::read(&mut std::fs::File::open(&path).unwrap()).unwrap()
}

/// Each of `keys` equal in both (the debug form compares strings, floats and arrays exactly).
fn same_keys(name: &str, ours: &HashMap<String, Value>, theirs: &Content, keys: &[&str]) {
    for key in keys {
        let (a, b) = (ours.get(*key), theirs.metadata.get(*key));
        assert!(b.is_some(), "{name}: the reference has no {key}");
        if let (Some(Value::Array(a)), Some(Value::Array(b))) = (a, b) {
            assert_eq!(a.len(), b.len(), "{name} {key}: lengths");
            let first = (0..a.len()).find(|&i| format!("{:?}", a[i]) != format!("{:?}", b[i]));
            assert!(
                first.is_none(),
                "{name} {key}: id {first:?}: ours {:?}, theirs {:?}",
                a[first.unwrap()],
                b[first.unwrap()]
            );
        } else {
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{name} {key}");
        }
    }
}

const VOCAB: [&str; 4] =
    ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"];
const SPECIALS: [&str; 6] = [
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
];

#[test]
fn mistral_tokenizer_model_files_give_llama_cpps_vocabularies() {
    for (name, version) in [("mistral-v0.1", "v0.1"), ("mistral-v0.3", "v0.3")] {
        let dir = scratch(name);
        let config = json!({
            "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
            "vocab_size": if version == "v0.1" { 32000 } else { 32768 }, "sliding_window": null,
        });
        std::fs::write(dir.0.join("config.json"), config.to_string()).unwrap();
        let model = gunzip(&format!("tokenizers/mistral-{version}/tokenizer.model.gz"));
        std::fs::write(dir.0.join("tokenizer.model"), model).unwrap();
        let tokenizer_config = json!({ "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "add_bos_token": true, "add_eos_token": false });
        std::fs::write(dir.0.join("tokenizer_config.json"), tokenizer_config.to_string()).unwrap();
        let ours = exported(&dir.0);
        let theirs = reference(name, &dir.0);
        same_keys(name, &ours, &theirs, &VOCAB);
        same_keys(name, &ours, &theirs, &SPECIALS);
        assert!(
            !ours.contains_key("tokenizer.ggml.merges")
                && !ours.contains_key("tokenizer.ggml.add_space_prefix")
        );
    }
}

#[test]
fn gemma_tokenizer_json_gives_the_vocabularies_llama_cpp_tokenizes_right() {
    let gemma2 = json!({
        "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": 256000,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4096,
        "tie_word_embeddings": true,
    });
    let gemma3 = json!({
        "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "vocab_size": 262208,
        "final_logit_softcapping": null, "attn_logit_softcapping": null, "sliding_window": 1024,
        "rope_parameters": { "full_attention": { "rope_type": "linear", "factor": 8.0, "rope_theta": 1e6 },
                             "sliding_attention": { "rope_type": "default", "rope_theta": 1e4 } },
    });
    for (name, vocab, config) in [("gemma-2", "gemma2", gemma2), ("gemma-3", "gemma3", gemma3)] {
        let dir = scratch(name);
        std::fs::write(dir.0.join("config.json"), config.to_string()).unwrap();
        std::fs::write(
            dir.0.join("tokenizer.json"),
            gunzip(&format!("tokenizers/vocab/{vocab}.tokenizer.json.gz")),
        )
        .unwrap();
        let family = Path::new(FIXTURES).join("tokenizers").join(name);
        let tokenizer_config = match std::fs::read(family.join("tokenizer_config.json")) {
            Ok(bytes) => bytes,
            Err(_) => gunzip(&format!("tokenizers/{name}/tokenizer_config.json.gz")),
        };
        std::fs::write(dir.0.join("tokenizer_config.json"), tokenizer_config).unwrap();
        if family.join("chat_template.jinja").is_file() {
            std::fs::copy(family.join("chat_template.jinja"), dir.0.join("chat_template.jinja")).unwrap();
        }
        let ours = exported(&dir.0);
        let theirs = reference(name, &dir.0);
        same_keys(name, &ours, &theirs, &VOCAB);
        same_keys(name, &ours, &theirs, &SPECIALS);
        same_keys(
            name,
            &ours,
            &theirs,
            &[
                "tokenizer.ggml.padding_token_id",
                "tokenizer.ggml.add_space_prefix",
                "tokenizer.chat_template",
            ],
        );
    }
}

/// A `tokenizer.model` that is not a SentencePiece model is refused with the file named.
#[test]
fn a_broken_tokenizer_model_is_refused() {
    let dir = scratch("broken");
    let config = json!({ "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "vocab_size": 256 });
    std::fs::write(dir.0.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.0.join("tokenizer_config.json"), "{}").unwrap();
    std::fs::write(dir.0.join("tokenizer.model"), [0x0a, 0x10, 0x0a]).unwrap();
    let model = GgufModel::read(&dir.0.join("config.json"), FileType::F16).unwrap();
    let err = format!("{:#}", model.metadata("m").unwrap_err());
    assert!(
        err.contains("tokenizer.model")
            && err.contains("not a SentencePiece model")
            && err.contains("truncated"),
        "{err}"
    );
}

/// Byte-level BPE vocabularies (`gpt2`) of Llama 3, Qwen 2.5 and Mistral Nemo's Tekken: tokens,
/// types and merges equal tests/fixtures/vocab-gguf's files, and the pre-tokenizer is the name
/// llama.cpp's vocabulary loader accepts for each (`llama-bpe`, `qwen2`, `tekken`).
#[test]
fn bpe_tokenizers_give_llama_cpps_vocabularies_and_pre_tokenizer_names() {
    let llama = json!({ "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 128256 });
    let qwen = json!({ "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "vocab_size": 152064 });
    let nemo = json!({ "model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 1024000, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "vocab_size": 131072 });
    for (name, vocab, family, config) in [
        ("llama-bpe", "llama3", "llama-3.2", llama),
        ("qwen2", "qwen2.5", "qwen2.5", qwen),
        ("tekken", "tekken", "mistral-nemo", nemo),
    ] {
        let dir = scratch(name);
        std::fs::write(dir.0.join("config.json"), config.to_string()).unwrap();
        let tokenizer = gunzip(&format!("tokenizers/vocab/{vocab}.tokenizer.json.gz"));
        std::fs::write(dir.0.join("tokenizer.json"), tokenizer).unwrap();
        let folder = Path::new(FIXTURES).join("tokenizers").join(family);
        let tokenizer_config = match std::fs::read(folder.join("tokenizer_config.json")) {
            Ok(bytes) => bytes,
            Err(_) => gunzip(&format!("tokenizers/{family}/tokenizer_config.json.gz")),
        };
        std::fs::write(dir.0.join("tokenizer_config.json"), tokenizer_config).unwrap();
        let ours = exported(&dir.0);
        let theirs = reference(name, &dir.0);
        let keys = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens"];
        same_keys(name, &ours, &theirs, &keys);
        same_keys(name, &ours, &theirs, &["tokenizer.ggml.token_type", "tokenizer.ggml.merges"]);
    }
}
