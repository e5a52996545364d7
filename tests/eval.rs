//! `lora-ft eval` against transformers + PEFT (scripts/golden/eval_golden.py): on
//! tests/fixtures/eval_dialogues.jsonl, the rows lora-ft scores (ids and assistant-only labels
//! after the cut) are the golden's, and every dialogue's mean loss and the file's token-weighted
//! mean are within the derived f32 tolerance (lora_ft::testing) of the float64 reference, with
//! and without the adapter, on a tiny random Llama with its own tokenizer and on SmolLM2-135M.
//! The command itself: the same numbers through --config and --out, and its errors.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use lora_ft::config::TruncationSide;
use lora_ft::data::ChatTokenizer;
use lora_ft::eval::{self, EvalModel, EvalReport, EvalSettings};
use lora_ft::quant::Quantization;
use lora_ft::testing::assert_within_reference_error;
use serde_json::Value as Json;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn golden(case: &str) -> Json {
    let file = repo(&format!("tests/golden/eval_{case}.json"));
    serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
}

fn model_dir(case: &str) -> PathBuf {
    match case {
        "smollm2" => lora_ft::fixtures::smollm2_dir(),
        _ => repo("tests/fixtures/tiny-chat"),
    }
}

fn settings(golden: &Json) -> EvalSettings {
    assert_eq!(golden["truncation_side"], "right");
    EvalSettings {
        format: lora_ft::config::DataFormat::Messages,
        max_seq_len: golden["max_seq_len"].as_u64().unwrap() as usize,
        truncation_side: TruncationSide::Right,
        system_message: lora_ft::config::SystemMessage::Keep,
        tool_call_tokens: Some(16),
    }
}

fn numbers(values: &[f64]) -> Tensor {
    Tensor::new(values, &Device::Cpu).unwrap()
}

/// Every dialogue's loss and the file's mean against the golden's float64 answer, within
/// `MULTIPLE` × transformers' own float32 error; the per-row bookkeeping exactly.
fn check_report(what: &str, which: &str, report: &EvalReport, golden: &Json) {
    let rows = golden["dialogues"].as_array().unwrap();
    assert_eq!(report.dialogues.len(), rows.len(), "{what}: dialogues");
    let (mut ours, mut f32s, mut exact) = (Vec::new(), Vec::new(), Vec::new());
    for (d, g) in report.dialogues.iter().zip(rows) {
        assert_eq!(d.index as u64, g["index"].as_u64().unwrap());
        assert_eq!(d.line as u64, g["line"].as_u64().unwrap());
        assert_eq!(d.tokens as u64, g["tokens"].as_u64().unwrap(), "{what}: line {} tokens", d.line);
        assert_eq!(d.length as u64, g["length"].as_u64().unwrap(), "{what}: line {} length", d.line);
        assert_eq!(d.truncated, g["truncated"].as_bool().unwrap(), "{what}: line {} cut", d.line);
        assert_eq!(d.dropped, d.tokens == 0);
        match d.loss {
            None => assert!(g.get(format!("loss_{which}_f64")).is_none(), "{what}: line {} dropped", d.line),
            Some(loss) => {
                assert!((d.ppl.unwrap() - loss.exp()).abs() <= 1e-12 * loss.exp());
                ours.push(loss);
                f32s.push(g[format!("loss_{which}_f32")].as_f64().unwrap());
                exact.push(g[format!("loss_{which}_f64")].as_f64().unwrap());
            }
        }
    }
    assert_eq!(report.tokens as u64, golden["trained_tokens"].as_u64().unwrap(), "{what}: trained tokens");
    assert!(report.dropped() == 1 && report.truncated() > 0, "{what}: the file cuts rows and drops one");
    let (ours, f32s, exact) = (numbers(&ours), numbers(&f32s), numbers(&exact));
    assert_within_reference_error(&format!("{what}: per-dialogue loss"), &ours, &f32s, &exact);
    let mean = |key: &str| numbers(&[golden[format!("mean_loss_{which}_{key}")].as_f64().unwrap()]);
    let ours_mean = numbers(&[report.mean_loss()]);
    assert_within_reference_error(&format!("{what}: mean loss"), &ours_mean, &mean("f32"), &mean("f64"));
}

/// The library path: the rows (ids and labels after the cut) are the golden's, then the losses.
fn check_case(case: &str, with_adapter: bool) {
    let golden = golden(case);
    let dir = model_dir(case);
    let adapter = with_adapter.then(|| repo(golden["adapter"].as_str().unwrap()));
    let m = EvalModel {
        source: dir.to_str().unwrap(),
        revision: "main",
        adapter: adapter.as_deref(),
        dtype: DType::F32,
        quantization: Quantization::None,
        chat_template: None,
    };
    let files = eval::resolve(&m).unwrap();
    let vocab = lora_ft::arch::ModelConfig::from_file(&files.config).unwrap().vocab_size;
    let tokenizer = ChatTokenizer::from_dir(&files.dir).unwrap();
    let data = repo(golden["data"].as_str().unwrap());
    let settings = settings(&golden);
    let rows = eval::tokenize_file(&data, &tokenizer, &settings, vocab).unwrap();
    for (row, g) in rows.iter().zip(golden["dialogues"].as_array().unwrap()) {
        let ids: Vec<u32> = serde_json::from_value(g["input_ids"].clone()).unwrap();
        let labels: Vec<i64> = serde_json::from_value(g["labels"].clone()).unwrap();
        assert_eq!(row.example.input_ids, ids, "{case}: line {} ids", row.line);
        assert_eq!(row.example.labels, labels, "{case}: line {} labels (assistant-only masking)", row.line);
    }
    let model = eval::load_model(&m, &files, &Device::Cpu).unwrap();
    let report = eval::evaluate(&model, &rows).unwrap();
    let which = if with_adapter { "adapter" } else { "base" };
    check_report(&format!("{case} ({which})"), which, &report, &golden);
}

#[test]
fn tiny_chat_with_its_adapter_matches_peft() {
    check_case("tiny-chat", true);
}

#[test]
fn tiny_chat_without_an_adapter_matches_transformers() {
    check_case("tiny-chat", false);
}

#[test]
fn smollm2_with_its_peft_adapter_matches_peft() {
    check_case("smollm2", true);
}

#[test]
fn smollm2_without_an_adapter_matches_transformers() {
    check_case("smollm2", false);
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lora-ft-eval-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lora_ft(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_LOG", "lora_ft=warn")
        .output()
        .unwrap()
}

/// `lora-ft eval --config C --adapter A --data D --out F`: the model, dense f32 storage, the CPU
/// and max_seq_len from the config; stdout's counts and the JSON lines are the golden's.
#[test]
fn the_command_takes_its_settings_from_the_config_and_writes_one_line_per_dialogue() {
    let golden = golden("tiny-chat");
    let dir = temp_dir("config");
    let config = dir.join("eval.toml");
    let toml = format!(
        "[model]\nsource = \"tests/fixtures/tiny-chat\"\nquantization = \"none\"\n[data]\ntrain = \"unused.jsonl\"\n\
         max_seq_len = {}\n[train]\ncompute_dtype = \"f32\"\ndevice = \"cpu\"\n",
        golden["max_seq_len"]
    );
    std::fs::write(&config, toml).unwrap();
    let out = dir.join("losses.jsonl");
    let run = lora_ft(&[
        "eval",
        "--config",
        config.to_str().unwrap(),
        "--adapter",
        golden["adapter"].as_str().unwrap(),
        "--data",
        golden["data"].as_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let n = golden["dialogues"].as_array().unwrap().len();
    let tokens = &golden["trained_tokens"];
    assert!(
        stdout.contains(&format!(": {n} dialogues ({} scored), {tokens} trained tokens", n - 1)),
        "{stdout}"
    );
    assert!(stdout.contains("3 dialogues cut") && stdout.contains("1 dropped"), "{stdout}");
    let lines: Vec<Json> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let dialogues = lines
        .iter()
        .map(|l| lora_ft::eval::DialogueLoss {
            index: l["index"].as_u64().unwrap() as usize,
            line: l["line"].as_u64().unwrap() as usize,
            loss: l["loss"].as_f64(),
            ppl: l["ppl"].as_f64(),
            tokens: l["tokens"].as_u64().unwrap() as usize,
            length: l["length"].as_u64().unwrap() as usize,
            truncated: l["truncated"].as_bool().unwrap(),
            dropped: l["dropped"].as_bool().unwrap(),
            tool_calls: None,
        })
        .collect::<Vec<_>>();
    // the file's mean from the lines, as a reader of --out would compute it
    let (sum, tokens) = dialogues
        .iter()
        .filter_map(|d| d.loss.map(|l| (l * d.tokens as f64, d.tokens)))
        .fold((0.0, 0), |(s, n), (l, t)| (s + l, n + t));
    let mean = sum / tokens as f64;
    assert!(stdout.contains(&format!("mean loss {mean:.6}, perplexity")), "{stdout} vs {mean}");
    check_report("eval --config", "adapter", &EvalReport { dialogues, loss_sum: sum, tokens }, &golden);
    std::fs::remove_dir_all(&dir).ok();
}

/// A missing data file, a malformed row and an adapter of another model each end the command
/// with one `error:` line naming the file (and line, or tensor), and no --out file.
#[test]
fn errors_name_the_file_the_line_and_the_tensor() {
    let dir = temp_dir("errors");
    let out = dir.join("losses.jsonl");
    let good =
        r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}"#;
    let malformed = dir.join("malformed.jsonl");
    std::fs::write(
        &malformed,
        format!("{good}\n{{\"messages\": [{{\"role\": \"bot\", \"content\": \"x\"}}]}}\n"),
    )
    .unwrap();
    let missing = dir.join("missing.jsonl");
    let smollm2_adapter = repo("tests/golden/peft_smollm2_adapter");
    let cases = [
        (missing.clone(), None, format!("{}: cannot open", missing.display())),
        (malformed.clone(), None, format!("{}:2: messages[0]: unknown role \"bot\"", malformed.display())),
        (
            repo("tests/fixtures/eval_dialogues.jsonl"),
            Some(smollm2_adapter),
            "adapter_model.safetensors: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight has shape \
             [2, 576], the model needs [2, 64]"
                .to_string(),
        ),
    ];
    for (data, adapter, expected) in cases {
        let mut args = vec!["eval", "--model", "tests/fixtures/tiny-chat", "--device", "cpu"];
        args.extend(["--data", data.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        if let Some(adapter) = &adapter {
            args.extend(["--adapter", adapter.to_str().unwrap()]);
        }
        let run = lora_ft(&args);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{stderr}");
        let error = stderr.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("{stderr}"));
        assert!(error.contains(&expected), "{error:?} does not say {expected:?}");
        assert!(run.stdout.is_empty(), "{}", String::from_utf8_lossy(&run.stdout));
        assert!(!out.exists(), "an error left {}", out.display());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--quantization nf4` (training's default) scores the model training trains: tiny-chat with its
/// adapter in NF4 gives the losses of the dense model whose projections are the NF4 round trip
/// of its weights (the same f32 products: equal to 8 ulp), and not the dense model's own.
#[test]
fn nf4_storage_scores_the_quantized_weights() {
    let golden = golden("tiny-chat");
    let dir = temp_dir("nf4-round-trip");
    let src = repo("tests/fixtures/tiny-chat");
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(file), dir.join(file)).unwrap();
    }
    let mut weights = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    for (name, w) in weights.iter_mut() {
        if name.ends_with("_proj.weight") {
            *w = lora_ft::quant::Nf4Tensor::quantize(w, true).unwrap().dequantize(DType::F32).unwrap();
        }
    }
    candle_core::safetensors::save(&weights, dir.join("model.safetensors")).unwrap();
    let adapter = repo(golden["adapter"].as_str().unwrap());
    let score = |model: &Path, quantization| {
        let m = EvalModel {
            source: model.to_str().unwrap(),
            revision: "main",
            adapter: Some(&adapter),
            dtype: DType::F32,
            quantization,
            chat_template: None,
        };
        let report = eval::run(&m, &repo(golden["data"].as_str().unwrap()), &settings(&golden), &Device::Cpu);
        let report = report.unwrap();
        numbers(&report.dialogues.iter().filter_map(|d| d.loss).collect::<Vec<_>>())
    };
    let nf4 = score(&src, Quantization::Nf4 { double_quant: true });
    let round_trip = score(&dir, Quantization::None);
    let dense = score(&src, Quantization::None);
    let bound = lora_ft::testing::FLOOR;
    let (same, moved) =
        (lora_ft::testing::rel_err(&nf4, &round_trip), lora_ft::testing::rel_err(&nf4, &dense));
    eprintln!("nf4 vs its dense round trip: {same:.2e} (bound {bound:.2e}); vs the f32 weights: {moved:.2e}");
    assert!(same <= bound, "NF4 {same:.3e} from the dense round trip");
    assert!(moved > 100.0 * bound, "NF4 storage changed nothing ({moved:.3e})");
    std::fs::remove_dir_all(&dir).ok();
}
