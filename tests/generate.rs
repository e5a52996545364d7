//! `lora-ft generate` end to end on the tiny random Llama (`common::tiny_smollm2_dir`) on the CPU:
//! every prompt answered `--n` times, one JSON line a reply; the file does not depend on
//! `--batch` (each reply draws with its own seed), greedy samples of a prompt are equal, seeded
//! samples are not; a text prompt is continued from its own tokens without the chat template; a
//! malformed prompts file is refused naming its line, before the model loads.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The first three held-out prompts of the customer-service set (system, user, tools).
fn prompts(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/customer-service/eval_prompts.jsonl"),
    )
    .unwrap();
    let path = dir.join("prompts.jsonl");
    std::fs::write(&path, text.lines().take(3).collect::<Vec<_>>().join("\n") + "\n").unwrap();
    path
}

/// `lora-ft generate` with `extra` flags; the rows it wrote.
fn generate(dir: &Path, name: &str, extra: &[&str]) -> Vec<Value> {
    let out = dir.join(name);
    let status = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(["generate", "--model", common::tiny_smollm2_dir().to_str().unwrap(), "--quantization", "none"])
        .args(["--input", prompts(dir).to_str().unwrap(), "--output", out.to_str().unwrap()])
        .args(["--max-new-tokens", "6", "--chat-template"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/templates/chatml-tools.jinja"))
        .args(extra)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    std::fs::read_to_string(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn generate_answers_every_prompt_n_times_whatever_the_batch() {
    let dir = std::env::temp_dir().join(format!("lora-ft-generate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let greedy = generate(&dir, "greedy.jsonl", &["--n", "2", "--batch", "4"]);
    assert_eq!(greedy.len(), 6, "3 prompts × 2 samples");
    let keys: Vec<(u64, u64)> =
        greedy.iter().map(|r| (r["line"].as_u64().unwrap(), r["sample"].as_u64().unwrap())).collect();
    assert_eq!(keys, [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]);
    for r in &greedy {
        assert!(["stop", "length"].contains(&r["finish_reason"].as_str().unwrap()), "{r}");
        assert!(r["completion_tokens"].as_u64().unwrap() <= 6, "{r}");
        assert!(
            r["prompt_tokens"].as_u64().unwrap() > 100,
            "the system message and tools are in the prompt: {r}"
        );
        assert!(r["tool_calls"].is_array());
    }
    for pair in greedy.chunks(2) {
        assert_eq!(pair[0]["text"], pair[1]["text"], "greedy samples of one prompt");
    }
    assert_eq!(generate(&dir, "greedy-1.jsonl", &["--n", "2", "--batch", "1"]), greedy, "batch 1 against 4");

    let sampled =
        generate(&dir, "t1.jsonl", &["--n", "3", "--batch", "5", "--temperature", "1.0", "--seed", "7"]);
    assert_eq!(sampled.len(), 9);
    let texts: Vec<&str> = sampled.iter().map(|r| r["text"].as_str().unwrap()).collect();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "three seeded samples of one prompt all equal: {texts:?}"
    );
    let again =
        generate(&dir, "t2.jsonl", &["--n", "3", "--batch", "2", "--temperature", "1.0", "--seed", "7"]);
    assert_eq!(again, sampled, "each reply's seed is its own, not its batch's");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_malformed_prompts_file_is_refused_naming_its_line() {
    let dir = std::env::temp_dir().join(format!("lora-ft-generate-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"messages\": 3}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(["generate", "--model", "/nonexistent/model", "--input", input.to_str().unwrap()])
        .args(["--output", dir.join("out.jsonl").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("bad.jsonl:2"), "the file and line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!dir.join("out.jsonl").exists(), "nothing written before the prompts are read");
    std::fs::remove_dir_all(&dir).ok();
}

/// A text prompt (`{"prompt": ...}`) beside a chat prompt: continued from its own tokens, without
/// the chat template, into the completion the library's `generate` gives those tokens; its row
/// has no `tool_calls`. A bad text row is refused naming its line and field before the model
/// loads.
#[test]
fn a_text_prompt_is_continued_without_the_chat_template() {
    let dir = std::env::temp_dir().join(format!("lora-ft-generate-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let chat = std::fs::read_to_string(prompts(&dir)).unwrap().lines().next().unwrap().to_string();
    let text = "Thank you for contacting";
    let input = dir.join("mixed.jsonl");
    std::fs::write(&input, format!("{chat}\n{{\"prompt\": {text:?}, \"id\": \"t-1\"}}\n")).unwrap();
    let model_dir = common::tiny_smollm2_dir();
    let out = dir.join("out.jsonl");
    let run = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(["generate", "--model", model_dir.to_str().unwrap(), "--quantization", "none"])
        .args([
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--max-new-tokens",
            "6",
        ])
        .arg("--chat-template")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/templates/chatml-tools.jinja"))
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let rows: Vec<Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2);
    assert!(rows[0]["tool_calls"].is_array(), "{}", rows[0]);
    assert_eq!(rows[1]["line"], 2);
    assert!(rows[1].get("tool_calls").is_none(), "no tool calls parsed out of text: {}", rows[1]);

    let (config, weights) = lora_ft::hub::local_weights(&model_dir).unwrap();
    let model = lora_ft::model::CausalLm::load(
        &config,
        &weights,
        candle_core::DType::F32,
        lora_ft::quant::Quantization::None,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let tokenizer = lora_ft::data::ChatTokenizer::load(&model_dir, None).unwrap();
    let ids = lora_ft::generate::text_prompt_ids(tokenizer.tokenizer(), text).unwrap();
    let stop = lora_ft::generate::stop_ids(&model_dir, &tokenizer);
    let settings = lora_ft::generate::GenerationSettings { max_new_tokens: 6, ..Default::default() };
    let reply = lora_ft::generate::generate(&model, &ids, &stop, &settings).unwrap();
    assert_eq!(rows[1]["prompt_tokens"], ids.len());
    assert_eq!(rows[1]["completion_tokens"], reply.len());
    assert_eq!(rows[1]["text"], lora_ft::generate::decode_reply(tokenizer.tokenizer(), &reply).unwrap());

    std::fs::write(&input, format!("{chat}\n{{\"prompt\": 42}}\n")).unwrap();
    let bad = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(["generate", "--model", "/nonexistent/model", "--input", input.to_str().unwrap()])
        .args(["--output", dir.join("bad-out.jsonl").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(err.contains(r#"mixed.jsonl:2: "prompt" must be a string (got a number)"#), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
