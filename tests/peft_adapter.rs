//! PEFT loads what lora-ft exports and computes the same logits. The adapter (formula weights,
//! r=2, rslora, q/v/down projections) is committed in tests/golden/peft_smollm2_adapter/ and the
//! logits PEFT computes with it in tests/golden/peft_smollm2_logits.safetensors
//! (scripts/golden/peft_adapter_golden.py). This test checks both links of the chain: our export
//! writes exactly those files, and our model with those files gives PEFT's logits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, D};
use lora_ft::model::{CausalLm, LoraSpec};
use lora_ft::peft_adapter::{load_adapter, save_adapter};
use lora_ft::quant::Quantization;

const BASE_NAME: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/peft_smollm2_adapter")
}

fn smollm2() -> CausalLm {
    let dir = lora_ft::fixtures::smollm2_dir();
    CausalLm::load(
        &dir.join("config.json"),
        &[dir.join("model.safetensors")],
        DType::F32,
        Quantization::None,
        &Device::Cpu,
    )
    .unwrap()
}

fn spec() -> LoraSpec {
    LoraSpec {
        r: 2,
        alpha: 4.0,
        dropout: 0.1,
        target_modules: ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec(),
        rslora: true,
    }
}

fn tensors(dir: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(dir.join("adapter_model.safetensors"), &Device::Cpu).unwrap()
}

fn config_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("adapter_config.json")).unwrap()).unwrap()
}

#[test]
fn export_writes_the_committed_adapter() {
    let mut model = smollm2();
    model.add_lora(&spec(), 0).unwrap();
    lora_ft::model::reference::set_formula_lora(&model).unwrap();
    if std::env::var_os("LORA_FT_BLESS_PEFT").is_some() {
        save_adapter(&model, &spec(), BASE_NAME, &golden_dir()).unwrap();
        return;
    }
    let out = std::env::temp_dir().join(format!("lora-ft-peft-export-{}", std::process::id()));
    save_adapter(&model, &spec(), BASE_NAME, &out).unwrap();
    let (ours, golden) = (tensors(&out), tensors(&golden_dir()));
    assert_eq!(ours.len(), golden.len());
    assert_eq!(ours.len(), 30 * 3 * 2, "30 layers x 3 modules x (A, B)");
    for (name, t) in &golden {
        let o = ours.get(name).unwrap_or_else(|| panic!("export lacks {name}"));
        assert_eq!(o.dims(), t.dims(), "{name}");
        let diff = (o - t).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(diff, 0.0, "{name}");
    }
    assert_eq!(config_json(&out), config_json(&golden_dir()));
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn committed_adapter_gives_pefts_logits() {
    let golden_file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/peft_smollm2_logits.safetensors");
    let g = candle_core::safetensors::load(golden_file, &Device::Cpu).unwrap();
    let mut model = smollm2();
    let spec = load_adapter(&mut model, &golden_dir()).unwrap();
    assert!(spec.rslora && spec.r == 2 && (spec.scale() - 4.0 / 2f64.sqrt()).abs() < 1e-12);
    let logits =
        model.forward(&g["input_ids"].to_dtype(DType::U32).unwrap(), None).unwrap().squeeze(0).unwrap();

    let head = logits.narrow(1, 0, 2048).unwrap();
    let diff =
        (&head - &g["logits_head"]).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    let scale = g["logits_head"].abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    eprintln!("logits vs PEFT: max abs err {diff:.3e}, rel {:.3e}", diff / scale);
    assert!(diff / scale < 1e-4, "logits differ from PEFT's: {diff} of {scale}");

    let lse = logits.to_dtype(DType::F64).unwrap().exp().unwrap().sum(D::Minus1).unwrap().log().unwrap();
    let lse_err = (lse.to_dtype(DType::F32).unwrap() - &g["logsumexp"]).unwrap().abs().unwrap();
    assert!(lse_err.max_all().unwrap().to_scalar::<f32>().unwrap() < 1e-4);
    let argmax = logits.argmax(D::Minus1).unwrap().to_dtype(DType::I64).unwrap().to_vec1::<i64>().unwrap();
    assert_eq!(argmax, g["argmax"].to_vec1::<i64>().unwrap());
}
