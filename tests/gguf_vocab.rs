//! `lora-ft import` of vocabulary-only GGUF files of real tokenizers reproduces every id expected
//! for the test strings (`ggml-vocab-*.gguf.inp` / `.out`), and the token ids of the real chat
//! templates' renders (tests/golden/chat_templates.json, from transformers):
//! - byte-level BPE (`gpt2`): Llama 3 (`llama-bpe`), Qwen2.5 (`qwen2`), Mistral Nemo (`tekken`),
//!   with llama.cpp's own test pairs;
//! - SentencePiece (`llama`): Llama 2 (`llama-spm`: llama.cpp's own file and pair), Mistral 7B
//!   v0.1 and v0.3 (sentencepiece's ids), Gemma 2 and 3 (transformers' ids).
//!
//! Except llama.cpp's `ggml-vocab-llama-spm.gguf`, the GGUF files are written by
//! scripts/golden/vocab_gguf.py and vocab_gguf_spm.py as llama.cpp's converter does; see
//! tests/fixtures/vocab-gguf/README.md.

mod common;
use common::Scratch;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use serde_json::Value as Json;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vocab-gguf");
const SEP: &str = "\n__ggml_vocab_test__\n";

/// Decompresses `ggml-vocab-<name>.gguf.gz` and imports it with the `lora-ft` binary.
fn import(name: &str) -> (Scratch, tokenizers::Tokenizer) {
    let scratch = Scratch::new(&format!("vocab-{name}"));
    let dir = scratch.0.clone();
    let gguf = dir.join(format!("ggml-vocab-{name}.gguf"));
    let mut bytes = Vec::new();
    let packed = Path::new(FIXTURES).join(format!("ggml-vocab-{name}.gguf.gz"));
    flate2::read::GzDecoder::new(std::fs::File::open(packed).unwrap()).read_to_end(&mut bytes).unwrap();
    std::fs::write(&gguf, bytes).unwrap();
    let out = dir.join("hf");
    let run =
        Command::new(env!("CARGO_BIN_EXE_lora-ft")).arg("import").arg(&gguf).arg(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("tensors: 0"), "{stdout}");
    assert!(!out.join("model.safetensors").exists() && !out.join("config.json").exists());
    let tokenizer = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    (scratch, tokenizer)
}

/// The `.inp` texts and the `.out` ids, in llama.cpp's format.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = Path::new(FIXTURES).join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(base.with_extension("gguf.out")).unwrap();
    let texts: Vec<&str> = inp.strip_suffix(SEP).unwrap().split(SEP).collect();
    let ids: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp and .out disagree on the number of tests");
    texts.into_iter().map(String::from).zip(ids).collect()
}

/// Every render of `family` in the chat template golden, with transformers' ids.
fn template_renders(family: &str) -> Vec<(String, Vec<u32>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/chat_templates.json");
    let golden: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let family = golden["families"].as_array().unwrap().iter().find(|f| f["family"] == family).unwrap();
    let cases = family["cases"].as_array().unwrap().iter().filter(|c| c.get("text").is_some());
    cases
        .map(|c| {
            (c["text"].as_str().unwrap().into(), serde_json::from_value(c["input_ids"].clone()).unwrap())
        })
        .collect()
}

fn check(name: &str, family: Option<&str>, tests: usize, vocab_size: usize) {
    let (_scratch, tokenizer) = import(name);
    assert_eq!(tokenizer.get_vocab_size(true), vocab_size, "{name}: vocabulary");
    let cases = cases(name);
    assert_eq!(cases.len(), tests);
    for (text, want) in cases {
        let got = tokenizer.encode(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(got, want, "{name}: ids of {text:?}");
    }
    let Some(family) = family else { return };
    let renders = template_renders(family);
    assert!(renders.len() >= 5, "{family}: every dialogue of the golden");
    for (text, want) in renders {
        let got = tokenizer.encode(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(got, want, "{name}: ids of the {family} render {text:?}");
    }
}

#[test]
fn llama_bpe_vocabulary_gives_llama_cpps_ids() {
    check("llama-bpe", Some("llama-3.3"), 44, 128256);
}

#[test]
fn qwen2_vocabulary_gives_llama_cpps_ids() {
    check("qwen2", Some("qwen2.5"), 43, 152064);
}

#[test]
fn tekken_vocabulary_gives_llama_cpps_ids() {
    check("tekken", Some("mistral-nemo"), 46, 131072);
}

#[test]
fn llama_spm_vocabulary_gives_llama_cpps_ids() {
    check("llama-spm", None, 46, 32000);
}

#[test]
fn mistral_v01_vocabulary_gives_sentencepieces_ids() {
    check("mistral-v0.1", None, 46, 32000);
}

#[test]
fn mistral_v03_vocabulary_gives_sentencepieces_ids_and_the_chat_fixtures() {
    check("mistral-v0.3", Some("mistral-v0.3"), 46, 32768);
}

#[test]
fn gemma2_vocabulary_gives_transformers_ids() {
    check("gemma-2", Some("gemma-2"), 46, 256000);
}

#[test]
fn gemma3_vocabulary_gives_transformers_ids() {
    check("gemma-3", Some("gemma-3"), 46, 262208);
}

/// The SentencePiece import: spaces become `▁` with one prepended to each run of text (Llama 2)
/// or none (Gemma, `add_space_prefix = false`), control tokens are special, and decoding undoes it.
#[test]
fn sentencepiece_imports_keep_llama_cpps_space_rules() {
    let (_scratch, llama) = import("llama-spm");
    let ids = llama.encode("<s>[INST] Hi [/INST]", false).unwrap().get_ids().to_vec();
    assert_eq!(ids[0], 1, "<s> is the control token, not text");
    assert_eq!(llama.decode(&ids[1..], false).unwrap(), "[INST] Hi [/INST]");
    assert_eq!(llama.encode(" Hello", false).unwrap().get_ids(), [29871, 15043]);
    let (_scratch, gemma) = import("gemma-2");
    assert_eq!(gemma.encode("<start_of_turn>user", false).unwrap().get_ids(), [106, 1645]);
    assert_eq!(gemma.decode(&[106, 1645], false).unwrap(), "<start_of_turn>user");
}
