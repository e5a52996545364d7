//! `lora-ft init`: the config it writes for a local folder, a GGUF file and a Hub repo id (from
//! a Hugging Face cache, offline) loads with the project's config loader and its shape's
//! predicted peak fits the card; it refuses an unknown family, a card too small and an existing
//! file without --force.

mod common;
use common::Scratch;
use std::path::Path;
use std::process::{Command, Output};

use lora_ft::arch::ModelConfig;
use lora_ft::config::{BatchSize, Config};
use lora_ft::memory::VramBudget;

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("init-{name}"))
}

fn init(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    cmd.arg("init").args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The written config loads, names `source`, and its batch x max_seq_len is predicted within
/// the budget of `gib` (the planner's prediction under the config's own run shape).
fn check_written(file: &Path, source: &str, model: &ModelConfig, gib: u64) -> Config {
    let cfg = Config::from_file(file).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.model.source, source);
    let BatchSize::Fixed(batch) = cfg.train.batch_size else { panic!("a fixed batch") };
    let run = lora_ft::plan::run::Run::resolve(&cfg, model.clone(), None);
    let peak = lora_ft::plan::estimate(model, &run.run_shape, (run.max_seq_len, batch)).peak();
    assert!(peak <= VramBudget::new(gib << 30, None).bytes(), "{}", file.display());
    let text = std::fs::read_to_string(file).unwrap();
    let header = format!("Peak GPU memory {:.2} GiB predicted", peak as f64 / (1u64 << 30) as f64);
    assert!(text.contains(&header) && text.contains(&format!("on one {gib} GB GPU")), "{text}");
    cfg
}

#[test]
fn a_local_folder_and_its_refusals() {
    let dir = scratch("folder");
    let out = dir.0.join("qwen3-14b.toml");
    let folder = "tests/fixtures/bench-models/qwen3-14b";
    let model =
        ModelConfig::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join(folder).join("config.json"))
            .unwrap();
    let run = init(&[folder, "--gpu-mem", "24GiB", "--out", out.to_str().unwrap()], &[]);
    assert!(run.status.success(), "{}", stderr(&run));
    let stdout = String::from_utf8_lossy(&run.stdout);
    // the MLP in row tiles: 16 rows of 4096 in one micro-batch (18.31 GiB predicted)
    assert!(stdout.contains("batch 16 x 4096 tokens, grad_accum 1"), "{stdout}");
    let cfg = check_written(&out, folder, &model, 24);
    assert_eq!(
        (cfg.data.max_seq_len, cfg.train.grad_accum, cfg.output.adapter_name.as_str()),
        (4096, 1, "qwen3-14b-customer-service")
    );

    // an existing file stays unless --force
    std::fs::write(&out, "mine").unwrap();
    let again = init(&[folder, "--gpu-mem", "48GiB", "--out", out.to_str().unwrap()], &[]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("exists; pass --force to overwrite it"), "{}", stderr(&again));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "mine");
    let forced = init(&[folder, "--gpu-mem", "48GiB", "--out", out.to_str().unwrap(), "--force"], &[]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert_eq!(check_written(&out, folder, &model, 48).train.batch_size, BatchSize::Fixed(16));

    // a card too small names the smallest that works
    let small = init(&[folder, "--gpu-mem", "8GiB", "--out", dir.0.join("s.toml").to_str().unwrap()], &[]);
    let err = stderr(&small);
    assert!(
        !small.status.success() && err.contains("batch 1 x 512") && err.contains("--gpu-mem 12GiB"),
        "{err}"
    );
    assert!(!dir.0.join("s.toml").exists());

    // a family lora-ft does not train is named, with the ones it does
    let phi = dir.0.join("phi");
    std::fs::create_dir_all(&phi).unwrap();
    std::fs::write(
        phi.join("config.json"),
        r#"{"architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32}"#,
    )
    .unwrap();
    let unknown = init(&[phi.to_str().unwrap(), "--out", dir.0.join("p.toml").to_str().unwrap()], &[]);
    let err = stderr(&unknown);
    assert!(err.contains("Phi3ForCausalLM") && err.contains("LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM"), "{err}");
}

/// A GGUF file: its metadata alone (no import into the cache), Gemma 2 in bf16 with the system
/// message folded.
#[test]
fn a_gguf_file() {
    let dir = scratch("gguf");
    let out = dir.0.join("g.toml");
    let gguf = "tests/fixtures/gguf/tiny-gemma2.gguf";
    let run = init(&[gguf, "--out", out.to_str().unwrap()], &[("LORA_FT_CACHE", &dir.0.join("cache"))]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(!dir.0.join("cache").exists(), "nothing imported");
    let (config, _) = lora_ft::gguf::read_configs(&Path::new(env!("CARGO_MANIFEST_DIR")).join(gguf)).unwrap();
    let model = ModelConfig::from_value(config, gguf).unwrap();
    let cfg = check_written(&out, gguf, &model, 24);
    assert_eq!(cfg.train.compute_dtype, lora_ft::config::ComputeDtype::Bf16);
    assert_eq!(cfg.data.system_message, lora_ft::config::SystemMessage::Fold);
}

/// A Hub repo id read from the Hugging Face cache offline (refs/main and the snapshot's
/// config.json, as hf-hub lays them out), with a data file of its own.
#[test]
fn a_hub_repo_id_from_the_cache() {
    let dir = scratch("hub");
    let repo = dir.0.join("hub/models--Qwen--Qwen3-8B");
    let snapshot = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bench-models/qwen3-8b/config.json");
    std::fs::copy(&fixture, snapshot.join("config.json")).unwrap();
    let data = dir.0.join("chats.jsonl");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/customer-service/eval.jsonl"), &data)
        .unwrap();
    let out = dir.0.join("q.toml");
    let envs = [
        ("HF_HUB_CACHE", dir.0.join("hub")),
        ("HF_HUB_OFFLINE", "1".into()),
        ("HF_ENDPOINT", "http://127.0.0.1:9".into()),
    ];
    let envs: Vec<(&str, &Path)> = envs.iter().map(|(k, v)| (*k, v.as_path())).collect();
    let args = [
        "Qwen/Qwen3-8B",
        "--gpu-mem",
        "48GB",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    let run = init(&args, &envs);
    assert!(run.status.success(), "{}", stderr(&run));
    let cfg = check_written(&out, "Qwen/Qwen3-8B", &ModelConfig::from_file(&fixture).unwrap(), 48);
    assert_eq!((cfg.data.train.as_path(), cfg.data.eval.as_deref()), (data.as_path(), None));
    assert_eq!(cfg.output.adapter_name, "q-chats");
}

/// The ready configs `lora-ft init` wrote (scripts/ready_configs.py) say the planner's
/// prediction for their shape today, on the published config.json of their model, and fit
/// their card.
#[test]
fn the_ready_configs_headers_are_the_planners_predictions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for name in ["llama3.1-8b", "qwen3-8b", "qwen3-14b", "gemma2-9b"] {
        let model =
            ModelConfig::from_file(&root.join(format!("tests/fixtures/bench-models/{name}/config.json")))
                .unwrap();
        for (file, gib) in [(format!("configs/{name}.toml"), 24), (format!("configs/{name}-48g.toml"), 48)] {
            let cfg = check_written(
                &root.join(&file),
                &Config::from_file(&root.join(&file)).unwrap().model.source,
                &model,
                gib,
            );
            let text = std::fs::read_to_string(root.join(&file)).unwrap();
            assert!(text.contains("\n# measured peak: "), "{file}");
            // Gemma 2's configs name the tool-free data (`--data`, scripts/ready_configs.py)
            let data = match cfg.data.train.parent().and_then(|d| d.to_str()) {
                Some(d) if d != "datasets/customer-service" => format!(" --data {d}"),
                _ => String::new(),
            };
            assert!(
                text.contains(&format!(
                    "`lora-ft init {} --gpu-mem {gib}GiB{data} --out {file}`",
                    cfg.model.source
                )),
                "{file}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 8);
}

/// `lora-ft estimate --host-mem`: the plan for the training machine's memory, not this one's.
/// Llama-2-13B at 8 x 512 on 24 GB offloads 9 layers of 0.45 GiB: 64 GiB of host memory (32
/// allowed) holds them all, 8 GiB (4 allowed) 8 of them, and one more layer is recomputed.
#[test]
fn estimate_plans_for_the_host_memory_it_is_given() {
    let dir = scratch("estimate");
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(Path::new(root).join("configs/mistral-7b.toml")).unwrap();
    let text = text
        .replace(
            "\"mistralai/Mistral-7B-v0.1\"",
            &format!("\"{root}/tests/fixtures/bench-models/llama2-13b\""),
        )
        .replace("max_seq_len = 1024", "max_seq_len = 512")
        .replace("batch_size = 4", "batch_size = 8")
        .replace("grad_accum = 4", "grad_accum = 1")
        .replace("dropout = 0.05", "dropout = 0.0");
    let config = dir.0.join("l13.toml");
    std::fs::write(&config, text).unwrap();
    let estimate = |host: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
            .args(["estimate", config.to_str().unwrap(), "--gpu-mem", "24", "--host-mem", host])
            .current_dir(root)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), stderr(&out))
    };
    let (ok, big, err) = estimate("64GiB");
    assert!(ok, "{err}");
    assert!(
        big.contains("31 layers keep their activations on the GPU and 9 in page-locked host memory"),
        "{big}"
    );
    assert!(big.contains("of the 32.00 GiB allowed") && big.contains("0 are recomputed"), "{big}");
    // serving on the same card: 800 KiB of KV cache a token (Llama-2-13B has no GQA), two
    // sequences of its 4096 positions beside the 6.4 GiB of NF4 weights
    assert!(big.contains("KV cache per token                                      800.0 KiB   (40 layers x 40 kv heads x 128 x 2 x 2 bytes)"), "{big}");
    assert!(big.contains("context   4096:     2 sequences"), "{big}");
    assert!(big.contains("lora-ft serve on this budget: --max-model-len 4096 --max-batch 2"), "{big}");
    let (ok, small, err) = estimate("8GB");
    assert!(ok, "{err}");
    assert!(
        small.contains("and 8 in page-locked host memory") && small.contains("of the 4.00 GiB allowed"),
        "{small}"
    );
    assert!(small.contains("1 are recomputed"), "{small}");
    let (ok, _, err) = estimate("lots");
    assert!(!ok && err.contains("--host-mem \"lots\""), "{err}");
}
