//! `data.eval_prompts`: a run of the tiny chat model (tests/fixtures/tiny-chat, with
//! configs/templates/chatml-tools.jinja so a prompt can carry tools) answers its prompts at the
//! start, at each evaluation and at the end into samples.jsonl; the base answers are those of
//! the untrained model and the last ones those of the exported adapter, each generated apart
//! with `lora_ft::generate`; a run resumed from an earlier checkpoint rewrites the later lines
//! exactly once, and the end of the run prints base and tuned answers side by side.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device};
use lora_ft::config::Config;
use lora_ft::data::{parse_tool_calls, read_prompts_jsonl, ChatTokenizer};
use lora_ft::generate::{reply_with_tools, stop_ids, GenerationSettings};
use lora_ft::model::CausalLm;
use lora_ft::quant::Quantization;
use lora_ft::train::samples::{read_samples, SampleRecord};

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "lookup_order", "description": "Look up an order.", "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description": "The order number."}}, "required": ["order_id"]}}}]"#;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The run's files under `root`: training rows, three prompts (with tools; with a system
/// message; a second user turn), the config (4 steps, an evaluation and a checkpoint every 2).
fn write_run(root: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root).unwrap();
    let call =
        r#"{"type": "function", "function": {"name": "lookup_order", "arguments": {"order_id": "1234"}}}"#;
    let tool_row = format!(
        r#"{{"tools": {TOOLS}, "messages": [{{"role": "user", "content": "Where is order 1234?"}}, {{"role": "assistant", "content": null, "tool_calls": [{call}]}}, {{"role": "tool", "content": "shipped"}}, {{"role": "assistant", "content": "It has shipped."}}]}}"#
    );
    let plain = r#"{"messages": [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! How can I help?"}]}"#;
    std::fs::write(root.join("train.jsonl"), [tool_row.as_str(), plain, &tool_row, plain].join("\n"))
        .unwrap();
    let prompts = [
        format!(r#"{{"tools": {TOOLS}, "messages": [{{"role": "user", "content": "Where is order 1234?"}}]}}"#),
        r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]}"#.into(),
        r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "My parcel is late."}]}"#.into(),
    ];
    std::fs::write(root.join("prompts.jsonl"), prompts.join("\n") + "\n").unwrap();
    let toml = format!(
        r#"[model]
source = "{model}"
quantization = "none"
chat_template = "{template}"
[lora]
r = 4
alpha = 8
dropout = 0.0
[data]
train = "{root}/train.jsonl"
max_seq_len = 2048
eval_prompts = "{root}/prompts.jsonl"
eval_max_new_tokens = 12
[train]
batch_size = 2
max_steps = 4
lr = 1e-2
compute_dtype = "f32"
device = "cpu"
eval_every = 2
[checkpoint]
every = 2
keep_last = 0
[output]
dir = "{root}/run"
adapter_name = "a"
adapters_dir = "{root}/adapters"
"#,
        model = repo("tests/fixtures/tiny-chat").display(),
        template = repo("configs/templates/chatml-tools.jinja").display(),
        root = root.display()
    );
    let file = root.join("train.toml");
    std::fs::write(&file, toml).unwrap();
    file
}

/// Every prompt answered greedily by tiny-chat, with `adapter` if given: what samples.jsonl
/// should hold.
fn answers(cfg: &Config, adapter: Option<&Path>) -> Vec<String> {
    let dir = repo("tests/fixtures/tiny-chat");
    let (config, weights) = lora_ft::hub::local_weights(&dir).unwrap();
    let mut model = CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap();
    if let Some(adapter) = adapter {
        lora_ft::peft_adapter::load_adapter(&mut model, adapter).unwrap();
    }
    let tokenizer = ChatTokenizer::load(&dir, cfg.model.chat_template.as_deref()).unwrap();
    let stop = stop_ids(&dir, &tokenizer);
    let settings = GenerationSettings { max_new_tokens: 12, ..Default::default() };
    let prompts = read_prompts_jsonl(cfg.data.eval_prompts.as_deref().unwrap()).unwrap();
    let reply = |p: &lora_ft::data::Conversation| {
        reply_with_tools(&model, &tokenizer, &p.messages, p.tools.as_deref(), &stop, &settings).unwrap()
    };
    prompts.iter().map(reply).collect()
}

#[test]
fn samples_hold_the_base_and_tuned_answers_and_survive_a_resume() {
    let root = std::env::temp_dir().join(format!("lora-ft-eval-prompts-{}", std::process::id()));
    let file = write_run(&root);
    let cfg = Config::from_file(&file).unwrap();
    lora_ft::train::run(&cfg, None).unwrap();
    let samples_file = root.join("run/samples.jsonl");
    let records = read_samples(&samples_file).unwrap();
    let keys: Vec<(usize, usize)> = records.iter().map(|r| (r.step, r.prompt)).collect();
    assert_eq!(keys, [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 2), (4, 0), (4, 1), (4, 2)]);
    let questions: Vec<&str> = records[..3].iter().map(|r| r.question.as_str()).collect();
    assert_eq!(questions, ["Where is order 1234?", "Hello there", "My parcel is late."]);
    let at = |step: usize| records.iter().filter(|r| r.step == step).collect::<Vec<&SampleRecord>>();
    let texts = |rs: Vec<&SampleRecord>| rs.iter().map(|r| r.answer.clone()).collect::<Vec<_>>();
    let (base, tuned) = (answers(&cfg, None), answers(&cfg, Some(&root.join("adapters/a"))));
    assert_eq!(texts(at(0)), base, "the base answers are the untrained model's");
    assert_eq!(texts(at(4)), tuned, "the last answers are the final adapter's");
    assert_ne!(base, tuned, "4 steps at lr 1e-2 change the answers");
    for r in &records {
        assert_eq!(r.tool_calls, parse_tool_calls(&r.answer));
    }

    // killed after step 4's samples, before its checkpoint: the resumed run starts at step 2
    let whole = std::fs::read_to_string(&samples_file).unwrap();
    std::fs::remove_dir_all(root.join("run/checkpoints/step-4")).unwrap();
    std::fs::remove_dir_all(root.join("adapters")).unwrap();
    std::fs::write(&samples_file, whole.clone() + r#"{"step":4,"prompt":0,"ques"#).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(["train", file.to_str().unwrap()])
        .env("RUST_LOG", "lora_ft=info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("resuming from"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&samples_file).unwrap(), whole, "no line lost or written twice");
    let one_line = |t: &str| t.trim().replace('\n', "\\n");
    let expected = format!(
        "base (step 0) and tuned (step 4) answers\n[0] question: Where is order 1234?\n    base:  {}\n    tuned: {}",
        one_line(&base[0]),
        one_line(&tuned[0])
    );
    assert!(stderr.contains(&expected), "{stderr}\nexpected:\n{expected}");
    assert!(stderr.contains(&format!("[2] question: My parcel is late.\n    base:  {}", one_line(&base[2]))));
    std::fs::remove_dir_all(&root).ok();
}

/// A prompt that does not end with a user turn stops the run before training, naming its line.
#[test]
fn a_bad_prompt_is_refused_before_training() {
    let root = std::env::temp_dir().join(format!("lora-ft-eval-prompts-bad-{}", std::process::id()));
    let file = write_run(&root);
    let prompts = root.join("prompts.jsonl");
    let bad = r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#;
    std::fs::write(
        &prompts,
        format!("{}\n{bad}\n", std::fs::read_to_string(&prompts).unwrap().lines().next().unwrap()),
    )
    .unwrap();
    let err = format!("{:#}", lora_ft::train::run(&Config::from_file(&file).unwrap(), None).err().unwrap());
    assert!(
        err.contains(&format!(
            "{}:2: a prompt must end with a user (or tool) message, the turn the model answers",
            prompts.display()
        )),
        "{err}"
    );
    assert!(!root.join("run/samples.jsonl").exists() && !root.join("run/checkpoints").exists());
    std::fs::remove_dir_all(&root).ok();
}
