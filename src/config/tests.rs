use super::*;

const MINIMAL: &str = r#"
[model]
source = "HuggingFaceTB/SmolLM2-135M-Instruct"
[data]
train = "datasets/customer-service/train.jsonl"
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml(text, Path::new("run.toml"))
}

#[test]
fn minimal_config_takes_defaults() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.lora.r, 16);
    assert_eq!(c.lora.target_modules.len(), 7);
    assert_eq!(c.train.schedule, Schedule::Cosine);
    assert_eq!(c.model.revision, "main");
    assert_eq!(c.model.quantization(), Quantization::Nf4 { double_quant: true });
    assert_eq!(c.lora.scale(), 2.0);
}

#[test]
fn unknown_key_names_file_and_path() {
    let err = parse(&format!("{MINIMAL}[train]\nlearning_rate = 1e-4\n")).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: train"), "{err}");
    assert!(err.contains("learning_rate"), "{err}");
}

#[test]
fn a_missing_config_file_is_named() {
    let err = Config::from_file(Path::new("configs/no-such.toml")).unwrap_err().to_string();
    assert!(err.starts_with("configs/no-such.toml: cannot read: No such file"), "{err}");
}

#[test]
fn wrong_type_names_key_path() {
    let err = parse(&format!("{MINIMAL}[lora]\nr = \"sixteen\"\n")).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: lora.r:"), "{err}");
}

#[test]
fn invalid_value_names_key_path() {
    let err = parse(&format!("{MINIMAL}[lora]\ntarget_modules = [\"qkv\"]\n")).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: lora.target_modules:"), "{err}");
    let err = parse(&format!("{MINIMAL}[train]\nlr = -1.0\n")).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: train.lr:"), "{err}");
}

/// Every config in configs/ (the ready ones and those `lora-ft init` wrote).
#[test]
fn shipped_configs_parse() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir("configs").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
            names.push(path.file_stem().unwrap().to_string_lossy().into_owned());
        }
    }
    names.sort();
    for name in ["quickstart", "mistral-7b-48g", "llama2-13b", "qwen3-14b-48g", "gemma2-9b", "llama3.1-8b"] {
        assert!(names.iter().any(|n| n == name), "configs/{name}.toml is missing: {names:?}");
    }
    assert_eq!(names.len(), 13, "{names:?}");
}

#[test]
fn quantization_is_nf4_or_none() {
    let model = |extra: &str| format!("[model]\nsource = \"m\"\n{extra}\n[data]\ntrain = \"t.jsonl\"\n");
    let c = parse(&model("quantization = \"nf4\"\ndouble_quant = false")).unwrap();
    assert_eq!(c.model.quantization(), Quantization::Nf4 { double_quant: false });
    let c = parse(&model("quantization = \"none\"")).unwrap();
    assert_eq!(c.model.quantization(), Quantization::None);
    let err = parse(&model("quantization = \"int4\"")).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: model.quantization:"), "{err}");
}

#[test]
fn device_defaults_to_auto_and_is_checked() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!((c.train.device.as_str(), c.train.compute_dtype), ("auto", ComputeDtype::F16));
    assert_eq!(parse(&format!("{MINIMAL}[train]\ndevice = \"cuda:1\"\n")).unwrap().train.device, "cuda:1");
    let err = parse(&format!("{MINIMAL}[train]\ndevice = \"gpu0\"\n")).unwrap_err().to_string();
    assert!(err.contains("train.device"), "{err}");
}

#[test]
fn batch_size_is_a_positive_integer_or_auto() {
    let batch = |v: &str| parse(&format!("{MINIMAL}[train]\nbatch_size = {v}\n")).map(|c| c.train.batch_size);
    assert_eq!(parse(MINIMAL).unwrap().train.batch_size, BatchSize::Fixed(4));
    assert_eq!(batch("12").unwrap(), BatchSize::Fixed(12));
    assert_eq!(batch("\"auto\"").unwrap(), BatchSize::Auto);
    for (value, message) in [
        ("\"big\"", "expected a positive integer or \"auto\""),
        ("4.5", "expected a positive integer or \"auto\""),
        ("0", "must be at least 1"),
        ("-2", "must be at least 1"),
    ] {
        let err = batch(value).unwrap_err().to_string();
        assert!(err.starts_with("run.toml: train.batch_size:") && err.contains(message), "{value}: {err}");
    }
}

#[test]
fn batch_size_is_written_back_as_it_is_read() {
    for (size, json) in [(BatchSize::Fixed(8), "8"), (BatchSize::Auto, "\"auto\"")] {
        assert_eq!(serde_json::to_string(&size).unwrap(), json);
        assert_eq!(serde_json::from_str::<BatchSize>(json).unwrap(), size);
    }
}

#[test]
fn rslora_scale_is_alpha_over_sqrt_r() {
    let c = parse(&format!("{MINIMAL}[lora]\nr = 16\nalpha = 8\nrslora = true\n")).unwrap();
    assert_eq!(c.lora.scale(), 2.0);
}

#[test]
fn system_message_policy_is_keep_fold_or_an_error_naming_the_key() {
    assert_eq!(parse(MINIMAL).unwrap().data.system_message, SystemMessage::Keep);
    let fold = MINIMAL.replace("[data]\n", "[data]\nsystem_message = \"fold\"\n");
    assert_eq!(parse(&fold).unwrap().data.system_message, SystemMessage::Fold);
    let drop = MINIMAL.replace("[data]\n", "[data]\nsystem_message = \"drop\"\n");
    let err = parse(&drop).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: data.system_message:"), "{err}");
    assert!(err.contains("`keep`") && err.contains("`fold`"), "{err}");
}

#[test]
fn data_formats_are_spelled_as_documented() {
    let format = |v: &str| parse(&format!("{MINIMAL}format = \"{v}\"\n")).map(|c| c.data.format);
    assert_eq!(parse(MINIMAL).unwrap().data.format, DataFormat::Messages);
    assert_eq!(format("sharegpt").unwrap(), DataFormat::ShareGpt);
    assert_eq!(format("alpaca").unwrap(), DataFormat::Alpaca);
    assert_eq!(format("prompt_completion").unwrap(), DataFormat::PromptCompletion);
    assert_eq!(format("auto").unwrap(), DataFormat::Auto);
    let err = format("ShareGPT").unwrap_err().to_string();
    assert!(err.starts_with("run.toml: data.format: unknown variant `ShareGPT`, expected one of"), "{err}");
    assert_eq!("prompt_completion".parse::<DataFormat>(), Ok(DataFormat::PromptCompletion));
    assert!("chatml".parse::<DataFormat>().unwrap_err().starts_with("unknown variant `chatml`"));
}

#[test]
fn eval_prompts_and_chat_template_are_read_and_checked() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!((c.data.eval_prompts, c.data.eval_max_new_tokens, c.model.chat_template), (None, 128, None));
    let text = MINIMAL.replace(
        "[data]\n",
        "chat_template = \"configs/templates/chatml-tools.jinja\"\n[data]\neval_prompts = \"p.jsonl\"\neval_max_new_tokens = 32\n",
    );
    let c = parse(&text).unwrap();
    assert_eq!(c.model.chat_template.as_deref(), Some(Path::new("configs/templates/chatml-tools.jinja")));
    assert_eq!(
        (c.data.eval_prompts.as_deref(), c.data.eval_max_new_tokens),
        (Some(Path::new("p.jsonl")), 32)
    );
    let err = parse(&text.replace("= 32", "= 0")).unwrap_err().to_string();
    assert_eq!(err, "run.toml: data.eval_max_new_tokens: must be at least 1");
}

#[test]
fn pad_to_multiple_of_defaults_to_64_and_refuses_0() {
    assert_eq!(parse(MINIMAL).unwrap().data.pad_to_multiple_of, 64);
    let text = MINIMAL.replace("[data]\n", "[data]\npad_to_multiple_of = 1\n");
    assert_eq!(parse(&text).unwrap().data.pad_to_multiple_of, 1);
    let err = parse(&text.replace("= 1\n", "= 0\n")).unwrap_err().to_string();
    assert_eq!(err, "run.toml: data.pad_to_multiple_of: must be at least 1 (1: no rounding)");
    let err = parse(&text.replace("= 1\n", "= -8\n")).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: data.pad_to_multiple_of: "), "{err}");
}

#[test]
fn optim_name_picks_the_optimizer_and_its_keys() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.optim.name, OptimName::Adafactor);
    assert_eq!(c.optim.adafactor_section().flavor, AdafactorFlavor::Hf);
    let c = parse(&format!("{MINIMAL}[optim]\nname = \"adamw\"\n")).unwrap();
    assert_eq!(c.optim.adamw_section(), AdamwSection { beta1: 0.9, beta2: 0.999, eps: 1e-8 });
    let c =
        parse(&format!("{MINIMAL}[optim]\nname = \"adamw8bit\"\nbetas = [0.8, 0.95]\neps = 1e-6\n")).unwrap();
    assert_eq!(c.optim.name, OptimName::Adamw8bit);
    assert_eq!(c.optim.adamw_section(), AdamwSection { beta1: 0.8, beta2: 0.95, eps: 1e-6 });
    let c = parse(&format!("{MINIMAL}[optim]\nname = \"adamw\"\nbeta1 = 0.85\n")).unwrap();
    assert_eq!(c.optim.adamw_section().beta1, 0.85);
    assert_eq!(c.optim.adamw_section().beta2, 0.999);
    let c = parse(&format!("{MINIMAL}[optim]\nflavor = \"torch\"\n")).unwrap();
    assert_eq!(c.optim.adafactor_section().flavor, AdafactorFlavor::Torch);
}

#[test]
fn optim_refuses_keys_of_another_optimizer() {
    let err = |extra: &str| parse(&format!("{MINIMAL}[optim]\n{extra}\n")).unwrap_err().to_string();
    let e = err("name = \"adamw\"\nflavor = \"hf\"");
    assert!(e.starts_with("run.toml: optim.flavor: is an Adafactor setting"), "{e}");
    let e = err("name = \"adamw8bit\"\ndecay_rate = -0.8");
    assert!(e.starts_with("run.toml: optim.decay_rate: is an Adafactor setting"), "{e}");
    let e = err("eps = 1e-8");
    assert!(e.starts_with("run.toml: optim.eps: is an AdamW setting, and optim.name = \"adafactor\""), "{e}");
    let e = err("name = \"adafactor\"\nbetas = [0.9, 0.99]");
    assert!(e.starts_with("run.toml: optim.betas: is an AdamW setting"), "{e}");
    let e = err("name = \"adamw\"\nweight_decay = 0.1");
    assert!(e.starts_with("run.toml: optim.weight_decay: weight decay is train.weight_decay"), "{e}");
    let e = err("name = \"adamw\"\nbetas = [0.9, 0.99]\nbeta2 = 0.9");
    assert!(e.starts_with("run.toml: optim.betas: give betas or beta1/beta2"), "{e}");
    let e = err("name = \"adamw\"\nbeta2 = 1.0");
    assert!(e.starts_with("run.toml: optim.beta2: beta2 must be in [0, 1)"), "{e}");
    let e = err("name = \"adamw\"\neps = 0.0");
    assert!(e.starts_with("run.toml: optim.eps: must be a positive number"), "{e}");
    let e = err("name = \"sgd\"");
    assert!(e.starts_with("run.toml: optim.name:"), "{e}");
    let e = err("name = \"adamw\"\nbeta = 0.9");
    assert!(e.starts_with("run.toml: optim") && e.contains("beta"), "{e}");
}

/// Every key of one optimizer given with another's name is refused, naming the key. The keys
/// are read off the settings types themselves (their serde fields), not listed again here, so a
/// key added to one optimizer and forgotten in `foreign_key` fails this test.
#[test]
fn optim_refuses_every_key_of_the_other_optimizers() {
    fn keys_of(section: impl serde::Serialize) -> Vec<(String, String)> {
        let serde_json::Value::Object(map) = serde_json::to_value(section).unwrap() else { panic!() };
        map.into_iter()
            .map(|(k, v)| {
                let toml = match v {
                    serde_json::Value::String(s) => format!("\"{s}\""),
                    serde_json::Value::Null => "1e-30".into(), // eps1: absent by default
                    v => v.to_string(),
                };
                (k, toml)
            })
            .collect()
    }
    let adafactor = keys_of(AdafactorSection::default());
    let mut adamw = keys_of(AdamwSection::default());
    adamw.push(("betas".into(), "[0.9, 0.99]".into()));
    // beta1 is both Adafactor's optional first moment and AdamW's beta1
    let shared = |k: &str| adafactor.iter().any(|(a, _)| a == k) && adamw.iter().any(|(a, _)| a == k);
    assert!(adafactor.len() >= 9 && adamw.len() >= 4, "{adafactor:?} {adamw:?}");
    for (name, foreign) in [("adafactor", &adamw), ("adamw", &adafactor), ("adamw8bit", &adafactor)] {
        for (key, value) in foreign.iter().filter(|(k, _)| !shared(k)) {
            let text = format!("{MINIMAL}[optim]\nname = \"{name}\"\n{key} = {value}\n");
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.starts_with(&format!("run.toml: optim.{key}: is an ")), "{name} with {key}: {e}");
        }
    }
}

/// `train.report_to`: empty by default; "tensorboard" the one tracker; another name is an error
/// naming the key and the names there are.
#[test]
fn report_to_lists_tensorboard_or_nothing() {
    assert!(parse(MINIMAL).unwrap().train.report_to.is_empty());
    let c = parse(&format!("{MINIMAL}[train]\nreport_to = [\"tensorboard\"]\n")).unwrap();
    assert_eq!(c.train.report_to, [ReportTo::Tensorboard]);
    let err = parse(&format!("{MINIMAL}[train]\nreport_to = [\"wandb\"]\n")).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: train.report_to[0]: unknown variant `wandb`"), "{err}");
    assert!(err.ends_with("expected `tensorboard`"), "{err}");
    let err = parse(&format!("{MINIMAL}[train]\nreport_to = \"tensorboard\"\n")).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: train.report_to: invalid type: string"), "{err}");
}
