//! Parity with Hugging Face transformers + PEFT (scripts/golden/hf_parity.py): logits, loss,
//! every LoRA gradient and the input gradient of tiny random Llama/Mistral models, f32,
//! max |a − b| / max |b| ≤ 1e-4 per tensor.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use lora_ft::export::load_adapter;
use lora_ft::model::CausalLm;

const TOLERANCE: f32 = 1e-4;

pub fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.to_dtype(DType::F32).unwrap();
    let b = b.to_dtype(DType::F32).unwrap().reshape(a.shape()).unwrap();
    let diff = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    diff / b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-30)
}

fn golden(name: &str) -> HashMap<String, Tensor> {
    let path = format!("tests/golden/parity_{name}.safetensors");
    candle_core::safetensors::load(&path, &Device::Cpu).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn batch(g: &HashMap<String, Tensor>) -> (Tensor, Vec<i64>) {
    let ids = g["input_ids"].to_dtype(DType::U32).unwrap();
    let labels = g["labels"].flatten_all().unwrap().to_vec1::<i64>().unwrap();
    (ids, labels)
}

fn check_tiny(name: &str) {
    let dir = Path::new("tests/fixtures").join(name);
    let g = golden(name);
    let mut model =
        CausalLm::load(&dir.join("config.json"), &[dir.join("model.safetensors")], DType::F32, &Device::Cpu)
            .unwrap();
    load_adapter(&mut model, &dir.join("adapter")).unwrap();
    let (ids, labels) = batch(&g);

    let logits = model.forward(&ids, None).unwrap();
    let e = rel_err(&logits, &g["logits"]);
    assert!(e < TOLERANCE, "{name}: logits rel err {e}");

    let n = labels.len(); // normalize like HF: mean over the trained tokens.
    let (_, count) = model.loss(&ids, &labels).unwrap();
    assert!(count > 0 && count < n);
    let out = model.forward_backward(&ids, &labels, 1.0 / count as f64, None).unwrap();
    let loss = out.loss_sum / out.n_tokens as f64;
    let want = g["loss"].flatten_all().unwrap().to_vec1::<f32>().unwrap()[0] as f64;
    assert!((loss - want).abs() / want.abs() < TOLERANCE as f64, "{name}: loss {loss} vs {want}");

    let params = model.lora_params();
    assert_eq!(params.len(), out.grads.len());
    for ((key, _), grad) in params.iter().zip(&out.grads) {
        let want = g.get(&format!("grad.{key}")).unwrap_or_else(|| panic!("{name}: golden lacks grad.{key}"));
        let e = rel_err(grad, want);
        assert!(e < TOLERANCE, "{name}: {key} grad rel err {e}");
    }
    let e = rel_err(&out.d_inputs_embeds, &g["grad.inputs_embeds"]);
    assert!(e < TOLERANCE, "{name}: input gradient rel err {e}");
}

#[test]
fn tiny_llama_matches_hf_peft() {
    check_tiny("tiny-llama");
}

#[test]
fn tiny_mistral_with_sliding_window_matches_hf_peft() {
    check_tiny("tiny-mistral");
}
