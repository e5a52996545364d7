use super::*;

fn bench_model(name: &str) -> ModelConfig {
    let file = format!("{}/tests/fixtures/bench-models/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
    ModelConfig::from_file(Path::new(&file)).unwrap()
}

fn customer_service() -> DataFiles {
    DataFiles::of(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/datasets/customer-service"))).unwrap()
}

fn request<'a>(model: &'a ModelConfig, source: &'a str, gib: u64, data: &'a DataFiles) -> InitRequest<'a> {
    InitRequest {
        source,
        revision: "main",
        model,
        chat_template: None,
        gpu_mem: gib << 30,
        data,
        name: "run",
        command: "lora-ft init",
        out: Path::new("run.toml"),
    }
}

/// The written text parses with the config loader, says what it chose, and its shape's
/// prediction (under the loader's run shape: dropout, accumulation) fits the card's budget
/// while 2 × the batch (or the next sequence length) would not be chosen over it.
#[test]
fn the_config_parses_and_its_shape_fits_the_card() {
    let data = customer_service();
    for (name, source, gib) in [
        ("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 24),
        ("qwen3-14b", "Qwen/Qwen3-14B", 24),
        ("gemma2-9b", "google/gemma-2-9b-it", 48),
        ("qwen3-8b", "Qwen/Qwen3-8B", 12),
    ] {
        let model = bench_model(name);
        let w = write_config(&request(&model, source, gib, &data)).unwrap();
        let cfg = Config::from_toml(&w.toml, Path::new("init.toml")).unwrap();
        assert_eq!((cfg.data.max_seq_len, cfg.train.grad_accum), (w.seq, w.grad_accum), "{name}");
        assert_eq!(cfg.train.batch_size, crate::config::BatchSize::Fixed(w.batch), "{name}");
        assert_eq!(w.batch * w.grad_accum, ROWS_PER_STEP, "{name}");
        let run = Run::resolve(&cfg, model.clone(), None);
        let shape = &run.run_shape;
        assert!(shape.lora.dropout > 0.0 && shape.accumulates_gradients == (w.grad_accum > 1));
        let peak = estimate(&model, shape, (w.seq, w.batch)).peak();
        assert_eq!(peak, w.peak);
        assert!(peak <= VramBudget::new(gib << 30, None).bytes(), "{name} on {gib} GiB");
        assert!(
            w.toml.contains(&format!("Peak GPU memory {:.2} GiB predicted", peak as f64 / GIB)),
            "{}",
            w.toml
        );
        assert!(w.toml.contains(&format!("on one {gib} GB GPU")) && w.toml.contains(source), "{}", w.toml);
        let gemma = name.starts_with("gemma");
        assert_eq!(cfg.train.compute_dtype == crate::config::ComputeDtype::Bf16, gemma, "{name}");
        assert_eq!(cfg.data.system_message == crate::config::SystemMessage::Fold, gemma, "{name}");
        assert!(cfg.data.eval.as_ref().is_some_and(|e| e.ends_with("customer-service/eval.jsonl")));
        assert_eq!(cfg.output.adapter_name, "run-customer-service");
    }
}

/// The shapes chosen: the longest sequence at which 4 rows or more fit within 0.95 of the
/// budget, all 16 rows of a step where they fit (Llama-3.1-8B at 4096 x 16 on 48 GB: 21.97 GiB),
/// else a power of two with accumulation (8 x 4096 on 24 GB: 21.97 GiB is over 0.95 x 21.60);
/// shorter sequences on small cards, and one row where no 4 fit at all (Gemma-2-9B on 8 GB: its
/// weights alone take 5.7 GiB of the 6.84 init leaves itself).
#[test]
fn the_longest_sequence_with_enough_rows_wins() {
    let data = customer_service();
    let shape = |name: &str, gib: u64| {
        let model = bench_model(name);
        let w = write_config(&request(&model, "m", gib, &data)).unwrap();
        (w.seq, w.batch, w.grad_accum)
    };
    let got = [
        shape("llama3.1-8b", 48),
        shape("llama3.1-8b", 24),
        shape("qwen3-14b", 12),
        shape("llama3.1-8b", 8),
        shape("mistral-nemo-12b", 8),
        shape("gemma2-9b", 8),
        // Llama 2's 4096 positions bound the sequence
        shape("llama2-13b", 48),
    ];
    // the MLP in row tiles: 16 rows of 4096 fit 24 GiB in one micro-batch, 4 of 4096 fit 8 GiB
    let want =
        [(4096, 16, 1), (4096, 16, 1), (2048, 4, 4), (4096, 4, 4), (512, 4, 4), (512, 1, 16), (4096, 16, 1)];
    assert_eq!(got, want);
}

/// A card too small for batch 1 x 512 is refused naming the smallest that takes it; and that
/// card's budget does take it.
#[test]
fn a_card_too_small_names_the_smallest_that_works() {
    let (model, data) = (bench_model("qwen3-14b"), customer_service());
    let err = write_config(&request(&model, "Qwen/Qwen3-14B", 8, &data)).unwrap_err().to_string();
    assert!(err.starts_with("Qwen/Qwen3-14B needs 7.18 GiB"), "{err}");
    assert!(err.contains("at batch 1 x 512") && err.contains("--gpu-mem 12GiB"), "{err}");
    assert!(write_config(&request(&model, "Qwen/Qwen3-14B", 12, &data)).is_ok());
    // Gemma-2-9B: 6.67 GiB at 1 x 512 (its final-logit cap in the loss kernel; 8.87 composed)
    let err = write_config(&request(&bench_model("gemma2-9b"), "g", 7, &data)).unwrap_err().to_string();
    assert!(err.starts_with("g needs 6.67 GiB") && err.contains("--gpu-mem 8GiB"), "{err}");
}

/// A template that refuses a system role folds it, whatever the family; one file as --data has
/// no eval set, its stem names the adapter; a missing one is refused.
#[test]
fn template_and_data_settings() {
    let model = bench_model("llama3.1-8b");
    let train = DataFiles::of(Path::new("datasets/customer-service/train.jsonl")).unwrap();
    assert_eq!((train.eval.as_ref(), train.name.as_str()), (None, "train"));
    let mut req = request(&model, "m", 24, &train);
    req.chat_template = Some("{{ raise_exception('System role not supported') }}");
    let cfg = Config::from_toml(&write_config(&req).unwrap().toml, Path::new("t.toml")).unwrap();
    assert_eq!(cfg.data.system_message, crate::config::SystemMessage::Fold);
    assert_eq!((cfg.data.eval, cfg.output.adapter_name.as_str()), (None, "run-train"));
    let err = DataFiles::of(Path::new("datasets/no-such")).unwrap_err().to_string();
    assert!(err.contains("no such file or folder"), "{err}");
    assert_eq!(model_name("meta-llama/Llama-3.1-8B-Instruct"), "Llama-3.1-8B-Instruct");
    assert_eq!(model_name("/models/qwen3-8b-q4_0.gguf"), "qwen3-8b-q4_0");
}
