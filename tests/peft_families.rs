//! The adapter lora-ft exports loads in PEFT with the same logits, and what `lora-ft merge` writes
//! loads in transformers with the same logits, for the tiny random model of every family
//! (tests/fixtures/tiny-*: Llama with default, Llama 3.1, YaRN and linear RoPE, Mistral with a
//! window, Mistral Nemo, Qwen2 with q/k/v biases and tied embeddings, Qwen3 with q/k norms,
//! Gemma 2 and Gemma 3 with (1 + w) norms and tied embeddings).
//!
//! The chain, each link checked here or in the golden script:
//! 1. lora-ft builds each model with formula LoRA weights on all seven projections
//!    (`set_formula_lora`, r = 2, rsLoRA on every other family) and exports them with
//!    `save_adapter`; the committed adapters in tests/golden/peft_families/<case>/ are exactly
//!    those files (`exports_are_the_committed_adapters`; `LORA_FT_BLESS_PEFT=1` rewrites them).
//! 2. scripts/golden/peft_families_golden.py loads each committed adapter with
//!    `PeftModel.from_pretrained` (every LoRA tensor PEFT holds is the file's, none missing) and
//!    stores PEFT's logits in float64 and torch's own float32 error against them
//!    (tests/golden/peft_families_<case>.safetensors). `pefts_logits_are_ours`: our model with
//!    the committed adapter gives those logits within the f32 rule.
//! 3. The script runs `lora-ft merge --dtype f32` on each fixture and committed adapter, loads the
//!    folder with `AutoModelForCausalLM.from_pretrained` (no missing, unexpected or mismatched
//!    keys), checks its logits against PEFT's float64 ones and its merged weights against
//!    PEFT's `merge_and_unload`, and records the tensor names and shapes transformers loaded and
//!    the f32 error of its logits (tests/golden/peft_families.json).
//!    `merge_writes_what_transformers_loaded` runs the same command and checks it writes those
//!    tensors: every one the base does not adapt byte for byte the base's (Gemma's norms stay
//!    as HF stores them, w not 1 + w; Qwen2's biases; tied embeddings stay tied, no lm_head),
//!    every adapted one within the rounding bound of W + scale·B·A, config.json the base's but
//!    the dtype, and our logits of the merged folder equal PEFT's.
//! 4. The script also loads the default (f16) merge in transformers: float16, no key missing, its
//!    logits within 4 x torch's own f16 error of PEFT's. `the_default_merge_is_the_f32_merge_in_f16`:
//!    that folder is the f32 merge rounded to f16 tensor for tensor.
//!
//! The f32 rule (`lora_ft::testing`): our error against PEFT's float64 logits is at most
//! MULTIPLE × torch's own float32 error (PEFT's unmerged run for the adapter; transformers'
//! run of the merged folder for the merge), never less than MULTIPLE × FLOOR.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device, Tensor};
use lora_ft::model::{CausalLm, LoraSpec};
use lora_ft::peft_adapter::{load_adapter, save_adapter};
use lora_ft::quant::Quantization;
use lora_ft::testing::{rel_err, FLOOR, MULTIPLE};

const CASES: [&str; 10] = [
    "tiny-llama",
    "tiny-llama31",
    "tiny-yarn",
    "tiny-linear",
    "tiny-mistral",
    "tiny-nemo",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-gemma2",
    "tiny-gemma3",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(case: &str) -> PathBuf {
    repo().join("tests/fixtures").join(case)
}

fn adapter_dir(case: &str) -> PathBuf {
    repo().join("tests/golden/peft_families").join(case)
}

fn golden(case: &str) -> HashMap<String, Tensor> {
    let file = repo().join(format!("tests/golden/peft_families_{case}.safetensors"));
    candle_core::safetensors::load(&file, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn golden_json() -> serde_json::Value {
    let file = repo().join("tests/golden/peft_families.json");
    serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
}

/// r = 2 on all seven projections; every other family with rsLoRA (scale alpha/sqrt(r)), so
/// PEFT reads both kinds of config.
fn spec(index: usize) -> LoraSpec {
    let targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
    LoraSpec {
        r: 2,
        alpha: if index.is_multiple_of(2) { 4.0 } else { 3.0 },
        dropout: 0.05,
        target_modules: targets.map(String::from).to_vec(),
        rslora: index % 2 == 1,
    }
}

fn load(dir: &Path) -> CausalLm {
    let (config, weights) = lora_ft::hub::local_weights(dir).unwrap();
    CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap()
}

fn logits(model: &CausalLm, g: &HashMap<String, Tensor>) -> Tensor {
    model.forward(&g["input_ids"].to_dtype(DType::U32).unwrap(), None).unwrap()
}

fn torch_err(g: &HashMap<String, Tensor>, name: &str) -> f64 {
    g[&format!("torch_f32_err.{name}")].flatten_all().unwrap().to_vec1::<f64>().unwrap()[0]
}

/// Holds `ours` to the f32 rule against the golden float64 `logits`, torch's error being
/// `torch_f32_err.<err_key>`; returns (ours, bound).
fn check_logits(
    case: &str,
    what: &str,
    ours: &Tensor,
    g: &HashMap<String, Tensor>,
    err_key: &str,
) -> (f64, f64) {
    let (err, torch) = (rel_err(ours, &g["logits"]), torch_err(g, err_key));
    let bound = MULTIPLE * torch.max(FLOOR);
    eprintln!("{case} {what}: rel err {err:.2e}, torch f32 {torch:.2e}, bound {bound:.2e}");
    assert!(err <= bound, "{case} {what}: rel err {err:.3e} > {bound:.3e}");
    (err, bound)
}

fn safetensors(file: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(file, &Device::Cpu).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn config_json(file: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

#[test]
fn exports_are_the_committed_adapters() {
    let bless = std::env::var_os("LORA_FT_BLESS_PEFT").is_some();
    for (index, case) in CASES.iter().enumerate() {
        let mut model = load(&fixture(case));
        model.add_lora(&spec(index), 0).unwrap();
        lora_ft::model::reference::set_formula_lora(&model).unwrap();
        let base_name = format!("tests/fixtures/{case}");
        if bless {
            save_adapter(&model, &spec(index), &base_name, &adapter_dir(case)).unwrap();
            continue;
        }
        let out = std::env::temp_dir().join(format!("lora-ft-peft-families-{case}-{}", std::process::id()));
        save_adapter(&model, &spec(index), &base_name, &out).unwrap();
        let file = "adapter_model.safetensors";
        let (ours, committed) = (safetensors(&out.join(file)), safetensors(&adapter_dir(case).join(file)));
        assert_eq!(ours.len(), 2 * 7 * 2, "{case}: 2 layers x 7 projections x (A, B)");
        assert_eq!(ours.len(), committed.len(), "{case}");
        for (name, t) in &committed {
            let o = ours.get(name).unwrap_or_else(|| panic!("{case}: the export lacks {name}"));
            assert_eq!(o.dims(), t.dims(), "{case} {name}");
            let (o, t) = (o.flatten_all().unwrap(), t.flatten_all().unwrap());
            assert_eq!(o.to_vec1::<f32>().unwrap(), t.to_vec1::<f32>().unwrap(), "{case} {name}");
        }
        let config = "adapter_config.json";
        assert_eq!(config_json(&out.join(config)), config_json(&adapter_dir(case).join(config)), "{case}");
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn pefts_logits_are_ours() {
    for (index, case) in CASES.iter().enumerate() {
        let g = golden(case);
        let base = logits(&load(&fixture(case)), &g);
        let mut model = load(&fixture(case));
        let loaded = load_adapter(&mut model, &adapter_dir(case)).unwrap();
        assert_eq!(
            (loaded.r, loaded.rslora, loaded.scale()),
            (2, index % 2 == 1, spec(index).scale()),
            "{case}"
        );
        let (_, bound) = check_logits(case, "adapter vs PEFT", &logits(&model, &g), &g, "logits");
        // the adapter moves the logits far more than the tolerance: a test that ignored it fails
        let moved = rel_err(&base, &g["logits"]);
        assert!(moved > 100.0 * bound, "{case}: the adapter moves the logits by only {moved:.2e}");
    }
}

/// `lora-ft merge [--dtype DTYPE]` of each fixture with its committed adapter, as users run it.
fn run_merge(case: &str, dtype: Option<&str>) -> PathBuf {
    let tag = dtype.unwrap_or("default");
    let out = std::env::temp_dir().join(format!("lora-ft-peft-families-{tag}-{case}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut merge = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    merge.arg("merge");
    if let Some(dtype) = dtype {
        merge.args(["--dtype", dtype]);
    }
    let output = merge
        .arg("--model")
        .arg(fixture(case))
        .arg("--adapter")
        .arg(adapter_dir(case))
        .arg(&out)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{case}: lora-ft merge failed: {stderr}");
    assert!(stdout.starts_with("merged 14 projections into "), "{case}: {stdout}");
    out
}

/// Every element of an adapted weight is within the rounding of W + s·B·A in f32: B·A sums r
/// products (r roundings), then the scale, its own f32 rounding and the addition to W add three
/// more, each at most u = 2^-24 of |W| + s·|B|·|A|. Returns the worst error as a fraction of
/// that bound.
fn check_merged_weight(
    case: &str,
    name: &str,
    ours: &Tensor,
    w: &Tensor,
    a: &Tensor,
    b: &Tensor,
    s: f64,
) -> f64 {
    let f64_ = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let (w, a, b) = (f64_(w), f64_(a), f64_(b));
    let exact = (&w + (b.matmul(&a).unwrap() * s).unwrap()).unwrap();
    let size =
        (w.abs().unwrap() + (b.abs().unwrap().matmul(&a.abs().unwrap()).unwrap() * s).unwrap()).unwrap();
    let r = a.dim(0).unwrap() as f64;
    let bound = (size * ((r + 3.0) * f64::from(f32::EPSILON) / 2.0)).unwrap();
    let ratio = ((f64_(ours) - &exact).unwrap().abs().unwrap() / bound).unwrap();
    let worst = ratio.max_all().unwrap().to_scalar::<f64>().unwrap();
    assert!(
        worst <= 1.0,
        "{case} {name}: merged weight off W + s·B·A by {worst:.3} x the f32 rounding bound"
    );
    let moved = rel_err(&exact, &w);
    assert!(moved > 1e-3, "{case} {name}: the adapter moves the weight by only {moved:.2e}");
    worst
}

#[test]
fn merge_writes_what_transformers_loaded() {
    let index_json = golden_json();
    for (index, case) in CASES.iter().enumerate() {
        let g = golden(case);
        let loaded = &index_json["cases"][case]["merged"];
        for key in ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"] {
            assert_eq!(loaded["loading_info"][key], serde_json::json!([]), "{case}: transformers' {key}");
        }
        let out = run_merge(case, Some("f32"));
        let merged = safetensors(&out.join("model.safetensors"));
        let base = safetensors(&fixture(case).join("model.safetensors"));
        let adapter = safetensors(&adapter_dir(case).join("adapter_model.safetensors"));
        // the tensors transformers loaded: the same names and shapes, all f32
        let want: HashMap<String, Vec<usize>> = serde_json::from_value(loaded["tensors"].clone()).unwrap();
        let got: HashMap<String, Vec<usize>> =
            merged.iter().map(|(k, v)| (k.clone(), v.dims().to_vec())).collect();
        assert_eq!(got, want, "{case}: merged tensors vs those transformers loaded");
        let (mut adapted, mut worst) = (0, 0f64);
        for (name, t) in &merged {
            assert_eq!(t.dtype(), DType::F32, "{case} {name}");
            let prefix = format!("base_model.model.{}", name.trim_end_matches(".weight"));
            match (
                adapter.get(&format!("{prefix}.lora_A.weight")),
                adapter.get(&format!("{prefix}.lora_B.weight")),
            ) {
                (Some(a), Some(b)) => {
                    let w = check_merged_weight(case, name, t, &base[name], a, b, spec(index).scale());
                    worst = worst.max(w);
                    adapted += 1;
                }
                _ => {
                    let (ours, theirs) = (t.flatten_all().unwrap(), base[name].flatten_all().unwrap());
                    let same = ours.to_vec1::<f32>().unwrap() == theirs.to_vec1::<f32>().unwrap();
                    assert!(same, "{case}: {name} is not the base's tensor");
                }
            }
        }
        assert_eq!((adapted, merged.len()), (14, base.len()), "{case}: adapted, all tensors");
        eprintln!("{case} merged weights: worst error {worst:.2} of the f32 rounding bound");
        // config.json: the base's, the dtype keys aside
        let (mut ours, mut theirs) =
            (config_json(&out.join("config.json")), config_json(&fixture(case).join("config.json")));
        for json in [&mut ours, &mut theirs] {
            let obj = json.as_object_mut().unwrap();
            obj.remove("torch_dtype");
            assert_eq!(obj.remove("dtype"), Some("float32".into()), "{case}");
        }
        assert_eq!(ours, theirs, "{case}: config.json");
        check_logits(case, "merged vs PEFT", &logits(&load(&out), &g), &g, "merged_logits");
        std::fs::remove_dir_all(&out).unwrap();
    }
}

/// The default merge (f16), which transformers loaded as float16 with no key missing (the golden
/// script checks its logits against PEFT's to 4 x torch's own f16 error), is the f32 merge
/// rounded to f16, tensor for tensor, with config.json saying float16.
#[test]
fn the_default_merge_is_the_f32_merge_in_f16() {
    let index_json = golden_json();
    for case in CASES {
        let loaded = &index_json["cases"][case]["merged_f16"];
        assert_eq!(loaded["loaded_dtype"], "float16", "{case}");
        for key in ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"] {
            assert_eq!(loaded["loading_info"][key], serde_json::json!([]), "{case}: transformers' {key}");
        }
        let (f32_dir, f16_dir) = (run_merge(case, Some("f32")), run_merge(case, None));
        let (wide, half) = (
            safetensors(&f32_dir.join("model.safetensors")),
            safetensors(&f16_dir.join("model.safetensors")),
        );
        assert_eq!(half.len(), wide.len(), "{case}");
        for (name, t) in &half {
            assert_eq!(t.dtype(), DType::F16, "{case} {name}");
            let values =
                |t: &Tensor| t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(values(t), values(&wide[name].to_dtype(DType::F16).unwrap()), "{case} {name}");
        }
        let config = config_json(&f16_dir.join("config.json"));
        assert_eq!(
            (&config["dtype"], &config["torch_dtype"]),
            (&"float16".into(), &"float16".into()),
            "{case}"
        );
        std::fs::remove_dir_all(&f32_dir).unwrap();
        std::fs::remove_dir_all(&f16_dir).unwrap();
    }
}
