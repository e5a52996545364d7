//! Tool-call accuracy in `lora-ft eval`, `lora-ft chat --tools` and `data.system_message` in
//! eval, on the tiny chat model (tests/fixtures/tiny-chat) with a small tool template given by
//! `--chat-template`: an adapter trained until the model calls `lookup_order` for one question;
//! a reference built from the call it generates scores 100%, the same with one argument changed
//! 0%, and a reference reply where it calls a tool anyway counts as an unexpected call.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device};
use lora_ft::config::{Config, DataFormat, SystemMessage, TruncationSide};
use lora_ft::data::{parse_tool_calls, ChatTokenizer, Message};
use lora_ft::eval::{self, EvalModel, EvalSettings, ToolCallScore};
use lora_ft::generate::{reply_with_tools, stop_ids, GenerationSettings};
use lora_ft::quant::Quantization;

/// ChatML with the tools' names in a system turn and calls as `<tool_call>{json}</tool_call>`:
/// short rows, so the adapter is trained in seconds.
const TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
{% for t in tools %}{{ t.function.name }}{{ ' ' }}{% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls is defined %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments|tojson }}}</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

const TOOLS: &str = r#"[{"type": "function", "function": {"name": "lookup_order", "description": "Look up an order.", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}}, {"type": "function", "function": {"name": "track_parcel", "description": "Track a parcel.", "parameters": {"type": "object", "properties": {"tracking_number": {"type": "string"}}}}}]"#;

const QUESTION: &str = "Where is order 1234?";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn row(messages: &str) -> String {
    format!(r#"{{"tools": {TOOLS}, "messages": [{messages}]}}"#)
}

fn call_turn(call: &str) -> String {
    format!(
        r#"{{"role": "user", "content": "{QUESTION}"}}, {{"role": "assistant", "content": null, "tool_calls": [{call}]}}, {{"role": "tool", "content": "shipped"}}, {{"role": "assistant", "content": "It has shipped."}}"#
    )
}

/// Trains the adapter (once per test binary) and returns the test's folder.
fn trained() -> &'static Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("lora-ft-eval-tools-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("template.jinja"), TEMPLATE).unwrap();
        std::fs::write(root.join("tools.json"), TOOLS).unwrap();
        let call = r#"{"type": "function", "function": {"name": "lookup_order", "arguments": {"order_id": "1234"}}}"#;
        std::fs::write(root.join("train.jsonl"), vec![row(&call_turn(call)); 4].join("\n")).unwrap();
        let toml = format!(
            "[model]\nsource = \"{}\"\nquantization = \"none\"\nchat_template = \"{root}/template.jinja\"\n\
             [lora]\nr = 16\nalpha = 32\ndropout = 0.0\n[data]\ntrain = \"{root}/train.jsonl\"\n\
             [train]\nbatch_size = 4\nmax_steps = 120\nlr = 1e-2\ncompute_dtype = \"f32\"\n\
             device = \"cpu\"\n[output]\ndir = \"{root}/run\"\nadapter_name = \"a\"\nadapters_dir = \"{root}/adapters\"\n",
            repo("tests/fixtures/tiny-chat").display(),
            root = root.display()
        );
        let cfg = Config::from_toml(&toml, Path::new("train.toml")).unwrap();
        lora_ft::train::run(&cfg, None).unwrap();
        root
    })
}

fn settings(system_message: SystemMessage) -> EvalSettings {
    EvalSettings {
        format: DataFormat::Messages,
        max_seq_len: 1024,
        truncation_side: TruncationSide::Right,
        system_message,
        tool_call_tokens: Some(64),
    }
}

fn score(root: &Path, name: &str, rows: &[String]) -> Vec<Option<ToolCallScore>> {
    let data = root.join(name);
    std::fs::write(&data, rows.join("\n")).unwrap();
    let (template, adapter) = (root.join("template.jinja"), root.join("adapters/a"));
    let tiny = repo("tests/fixtures/tiny-chat");
    let m = EvalModel {
        source: tiny.to_str().unwrap(),
        revision: "main",
        adapter: Some(&adapter),
        dtype: DType::F32,
        quantization: Quantization::None,
        chat_template: Some(&template),
    };
    let report = eval::run(&m, &data, &settings(SystemMessage::Keep), &Device::Cpu).unwrap();
    report.dialogues.iter().map(|d| d.tool_calls).collect()
}

/// The call the trained model makes for QUESTION, as `lora_ft::generate` gives it.
fn generated_call(root: &Path) -> String {
    let dir = repo("tests/fixtures/tiny-chat");
    let m = EvalModel {
        source: dir.to_str().unwrap(),
        revision: "main",
        adapter: Some(&root.join("adapters/a")),
        dtype: DType::F32,
        quantization: Quantization::None,
        chat_template: None,
    };
    let model = eval::load_model(&m, &eval::resolve(&m).unwrap(), &Device::Cpu).unwrap();
    let tokenizer = ChatTokenizer::load(&dir, Some(&root.join("template.jinja"))).unwrap();
    let tools = lora_ft::data::read_tools_file(&root.join("tools.json")).unwrap();
    let settings = GenerationSettings { max_new_tokens: 64, ..Default::default() };
    let messages = [Message::new("user", QUESTION)];
    let stop = stop_ids(&dir, &tokenizer);
    let text = reply_with_tools(&model, &tokenizer, &messages, Some(&tools), &stop, &settings).unwrap();
    let calls = parse_tool_calls(&text);
    assert_eq!(calls.len(), 1, "the trained model calls one tool: {text:?}");
    let call = &calls[0];
    format!(
        r#"{{"type": "function", "function": {{"name": "{}", "arguments": {}}}}}"#,
        call.name, call.arguments
    )
}

#[test]
fn the_generated_call_scores_exact_and_a_changed_argument_does_not() {
    let root = trained();
    let call = generated_call(root);
    let changed = call.replace("1234", "1235");
    assert_ne!(call, changed);
    let no_tools =
        r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}"#;
    let reply_instead = row(&format!(
        r#"{{"role": "user", "content": "{QUESTION}"}}, {{"role": "assistant", "content": "Let me check."}}"#
    ));
    let rows = [row(&call_turn(&call)), row(&call_turn(&changed)), no_tools.to_string(), reply_instead];
    let scores = score(root, "scored.jsonl", &rows);
    let s = |turns, exact, replies, unexpected| {
        Some(ToolCallScore {
            tool_call_turns: turns,
            tool_calls_exact: exact,
            reply_turns: replies,
            unexpected_calls: unexpected,
        })
    };
    // the reply after the tool result is a reply turn of each tool dialogue, answered without a call
    assert_eq!(scores, [s(1, 1, 1, 0), s(1, 0, 1, 0), None, s(0, 0, 1, 1)]);
    let total = ToolCallScore::total(scores.iter().flatten()).unwrap();
    assert_eq!(total.summary(), "tool calls: 1/2 turns exact (50.0%), 1 unexpected calls in 3 reply turns");
}

fn lora_ft(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_LOG", "lora_ft=warn")
        .output()
        .unwrap()
}

/// The command: the summary line, the `--out` fields, `--no-tool-calls`.
#[test]
fn the_eval_command_prints_tool_call_accuracy() {
    let root = trained();
    let data = root.join("one.jsonl");
    std::fs::write(&data, row(&call_turn(&generated_call(root)))).unwrap();
    let (out, template, adapter) =
        (root.join("out.jsonl"), root.join("template.jinja"), root.join("adapters/a"));
    let mut args =
        vec!["eval", "--model", "tests/fixtures/tiny-chat", "--quantization", "none", "--device", "cpu"];
    args.extend(["--adapter", adapter.to_str().unwrap(), "--chat-template", template.to_str().unwrap()]);
    args.extend(["--data", data.to_str().unwrap(), "--out", out.to_str().unwrap(), "--max-new-tokens", "64"]);
    let run = lora_ft(&args);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(
        stdout.ends_with("tool calls: 1/1 turns exact (100.0%), 0 unexpected calls in 1 reply turns\n"),
        "{stdout}"
    );
    let line: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let fields =
        ["tool_call_turns", "tool_calls_exact", "reply_turns", "unexpected_calls"].map(|k| line[k].as_u64());
    assert_eq!(fields, [Some(1), Some(1), Some(1), Some(0)], "{line}");
    args.push("--no-tool-calls");
    let run = lora_ft(&args);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success() && !stdout.contains("tool calls"), "{stdout}");
    let line: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(line.get("tool_call_turns").is_none(), "{line}");
}

/// `lora-ft chat --tools FILE --prompt ...` prints the reply, then each call parsed.
#[test]
fn chat_with_tools_prints_the_parsed_call() {
    let root = trained();
    let (template, adapter, tools) =
        (root.join("template.jinja"), root.join("adapters/a"), root.join("tools.json"));
    let mut args = vec!["chat", "--model", "tests/fixtures/tiny-chat", "--quantization", "none"];
    args.extend(["--adapter", adapter.to_str().unwrap(), "--chat-template", template.to_str().unwrap()]);
    args.extend(["--tools", tools.to_str().unwrap(), "--prompt", QUESTION]);
    let run = lora_ft(&args);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(
        stdout,
        "<tool_call>{\"name\": \"lookup_order\", \"arguments\": {\"order_id\": \"1234\"}}</tool_call>\n\
         tool call: lookup_order {\"order_id\":\"1234\"}\n"
    );
    // a tools file that is not a list of schemas is refused, naming the file
    std::fs::write(root.join("bad-tools.json"), r#"{"name": "f"}"#).unwrap();
    let bad = root.join("bad-tools.json");
    let n = args.len();
    args[n - 3] = bad.to_str().unwrap();
    let run = lora_ft(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success()
            && stderr.contains(&format!("error: {}: \"tools\" must be a list", bad.display())),
        "{stderr}"
    );
}

/// `data.system_message = "fold"` in the config given to `lora-ft eval` scores a dialogue as
/// training does: like the same dialogue with its system text folded into the first user turn.
#[test]
fn eval_folds_the_system_message_as_the_config_says() {
    let dir = std::env::temp_dir().join(format!("lora-ft-eval-fold-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let with_system = r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! How can I help?"}]}"#;
    let folded = r#"{"messages": [{"role": "user", "content": "Be brief.\n\nHello there"}, {"role": "assistant", "content": "Hi! How can I help?"}]}"#;
    let loss_of = |name: &str, row: &str, fold: bool| {
        let (data, out, config) =
            (dir.join(format!("{name}.jsonl")), dir.join("out.jsonl"), dir.join("eval.toml"));
        std::fs::write(&data, row).unwrap();
        let policy = if fold { "system_message = \"fold\"\n" } else { "" };
        let toml = format!(
            "[model]\nsource = \"tests/fixtures/tiny-chat\"\nquantization = \"none\"\n[data]\ntrain = \"unused.jsonl\"\n{policy}\
             [train]\ncompute_dtype = \"f32\"\ndevice = \"cpu\"\n"
        );
        std::fs::write(&config, toml).unwrap();
        let args = [
            "eval",
            "--config",
            config.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        let run = lora_ft(&args);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let line: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        (line["loss"].as_f64().unwrap(), line["tokens"].as_u64().unwrap())
    };
    let fold = loss_of("system", with_system, true);
    assert_eq!(fold, loss_of("folded", folded, false), "fold scores the folded dialogue");
    assert_ne!(fold.0, loss_of("system", with_system, false).0, "keep scores another text");
    std::fs::remove_dir_all(&dir).ok();
}
