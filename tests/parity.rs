//! Parity with Hugging Face transformers + PEFT (scripts/golden/hf_parity.py): logits, loss,
//! every LoRA gradient and the input gradient of tiny random Llama/Mistral models, f32,
//! max |a − b| / max |b| ≤ 1e-4 per tensor. With `LORA_FT_TEST_DEVICE=cuda` (a `cuda` build on a
//! GPU machine) the tiny models run on the GPU, in f32 (1e-4) and in f16 (1e-2).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use lora_ft::export::load_adapter;
use lora_ft::model::CausalLm;
use lora_ft::quant::Quantization;

const TOLERANCE: f32 = 1e-4;

/// The device under test: `LORA_FT_TEST_DEVICE=cuda` for the first GPU, else the CPU.
fn test_device() -> Device {
    match std::env::var("LORA_FT_TEST_DEVICE").as_deref() {
        Ok("cuda") => Device::new_cuda(0).expect("LORA_FT_TEST_DEVICE=cuda needs a cuda build and a GPU"),
        _ => Device::Cpu,
    }
}

/// Compute dtypes checked on `device`, with their tolerances.
fn dtypes(device: &Device) -> Vec<(DType, f32)> {
    if device.is_cuda() {
        vec![(DType::F32, TOLERANCE), (DType::F16, 1e-2)]
    } else {
        vec![(DType::F32, TOLERANCE)]
    }
}

pub fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
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
    let device = test_device();
    for (dtype, tolerance) in dtypes(&device) {
        check_tiny_on(name, &device, dtype, tolerance);
    }
}

fn check_tiny_on(name: &str, device: &Device, dtype: DType, tolerance: f32) {
    let dir = Path::new("tests/fixtures").join(name);
    let g = golden(name);
    let mut model = CausalLm::load(
        &dir.join("config.json"),
        &[dir.join("model.safetensors")],
        dtype,
        Quantization::None,
        device,
    )
    .unwrap();
    load_adapter(&mut model, &dir.join("adapter")).unwrap();
    let (ids, labels) = batch(&g);
    let ids = ids.to_device(device).unwrap();
    let name = format!("{name} {device:?} {dtype:?}");

    let logits = model.forward(&ids, None).unwrap();
    let e = rel_err(&logits, &g["logits"]);
    assert!(e < tolerance, "{name}: logits rel err {e}");
    eprintln!("{name}: logits rel err {e:.2e}");

    let n = labels.len(); // normalize like HF: mean over the trained tokens.
    let (_, count) = model.loss(&ids, &labels).unwrap();
    assert!(count > 0 && count < n);
    let out = model.forward_backward(&ids, &labels, 1.0 / count as f64, None).unwrap();
    let loss = out.loss_sum / out.n_tokens as f64;
    let want = g["loss"].flatten_all().unwrap().to_vec1::<f32>().unwrap()[0] as f64;
    assert!((loss - want).abs() / want.abs() < tolerance as f64, "{name}: loss {loss} vs {want}");

    let params = model.lora_params();
    assert_eq!(params.len(), out.grads.len());
    let mut worst = 0f32;
    for ((key, _), grad) in params.iter().zip(&out.grads) {
        let want = g.get(&format!("grad.{key}")).unwrap_or_else(|| panic!("{name}: golden lacks grad.{key}"));
        let e = rel_err(grad, want);
        assert!(e < tolerance, "{name}: {key} grad rel err {e}");
        worst = worst.max(e);
    }
    let e = rel_err(&out.d_inputs_embeds, &g["grad.inputs_embeds"]);
    assert!(e < tolerance, "{name}: input gradient rel err {e}");
    eprintln!(
        "{name}: loss rel err {:.2e}, worst LoRA grad {worst:.2e}, input grad {e:.2e}",
        (loss - want).abs() / want.abs()
    );
}

#[test]
fn tiny_llama_matches_hf_peft() {
    check_tiny("tiny-llama");
}

#[test]
fn tiny_mistral_with_sliding_window_matches_hf_peft() {
    check_tiny("tiny-mistral");
}

#[test]
fn smollm2_matches_hf_peft() {
    let dir = lora_ft::fixtures::smollm2_dir();
    let g = golden("smollm2");
    let mut model = CausalLm::load(
        &dir.join("config.json"),
        &[dir.join("model.safetensors")],
        DType::F32,
        Quantization::None,
        &Device::Cpu,
    )
    .unwrap();
    let spec = lora_ft::model::LoraSpec {
        r: 8,
        alpha: 16.0,
        dropout: 0.0,
        target_modules: lora_ft::model::PROJECTIONS.iter().map(|s| s.to_string()).collect(),
        rslora: false,
    };
    model.add_lora(&spec, 0).unwrap();
    lora_ft::model::reference::set_formula_lora(&model).unwrap();
    let (ids, labels) = batch(&g);

    let logits = model.forward(&ids, None).unwrap();
    let e = rel_err(&logits.narrow(2, 0, 1024).unwrap(), &g["logits_head"]);
    assert!(e < TOLERANCE, "smollm2: logits[..1024] rel err {e}");
    eprintln!("smollm2: logits rel err {e:.2e}");
    let last = g["last_positions"].to_vec1::<i64>().unwrap();
    for (row, &pos) in last.iter().enumerate() {
        let got = logits.get(row).unwrap().get(pos as usize).unwrap();
        let e = rel_err(&got, &g["logits_last"].get(row).unwrap());
        assert!(e < TOLERANCE, "smollm2: row {row} last logits rel err {e}");
    }

    let (_, count) = model.loss(&ids, &labels).unwrap();
    let out = model.forward_backward(&ids, &labels, 1.0 / count as f64, None).unwrap();
    let loss = out.loss_sum / out.n_tokens as f64;
    let want = g["loss"].to_vec1::<f32>().unwrap()[0] as f64;
    assert!((loss - want).abs() / want < TOLERANCE as f64, "smollm2: loss {loss} vs {want}");
    let (mut checked, mut worst) = (0, 0f32);
    for ((key, _), grad) in model.lora_params().iter().zip(&out.grads) {
        if let Some(want) = g.get(&format!("grad.{key}")) {
            let e = rel_err(grad, want);
            assert!(e < TOLERANCE, "smollm2: {key} grad rel err {e}");
            (checked, worst) = (checked + 1, worst.max(e));
        }
    }
    eprintln!("smollm2: loss rel err {:.2e}, worst LoRA grad {worst:.2e}", (loss - want).abs() / want);
    assert_eq!(checked, 42, "layers 0, 15 and 29: 7 modules × A, B");
}

/// Quantize-while-loading: every projection of the NF4-loaded model is the NF4 form of the dense
/// weight, and the model computes exactly what the dense model does on the dequantized weights.
#[test]
fn nf4_load_equals_the_dense_model_on_dequantized_projections() {
    use lora_ft::model::linear::BaseWeight;
    use lora_ft::quant::Nf4Tensor;
    let dir = Path::new("tests/fixtures/tiny-llama");
    let load = |q| {
        CausalLm::load(
            &dir.join("config.json"),
            &[dir.join("model.safetensors")],
            DType::F32,
            q,
            &Device::Cpu,
        )
        .unwrap()
    };
    let nf4 = load(Quantization::Nf4 { double_quant: true });
    let mut dense = load(Quantization::None);
    for (lq, ld) in nf4.layers.iter().zip(dense.layers.iter_mut()) {
        for (pq, pd) in lq.proj.iter().zip(ld.proj.iter_mut()) {
            let BaseWeight::Nf4(q) = &pq.base else { panic!("projection not quantized") };
            let w = pd.base.dense().unwrap();
            let expect = Nf4Tensor::quantize(&w, true).unwrap();
            assert_eq!(q.packed().to_vec1::<u8>().unwrap(), expect.packed().to_vec1::<u8>().unwrap());
            assert_eq!(q.absmax_f32().unwrap(), expect.absmax_f32().unwrap());
            assert!(q.size_in_bytes() * 7 < w.elem_count() * 4, "NF4 should be ~1/7.5 of f32");
            pd.base = BaseWeight::Dense(q.dequantize(DType::F32).unwrap());
        }
    }
    let ids = Tensor::new(&[[1u32, 5, 9, 2, 7, 3]], &Device::Cpu).unwrap();
    let a = nf4.forward(&ids, None).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = dense.forward(&ids, None).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a, b);
    let orig = load(Quantization::None)
        .forward(&ids, None)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_ne!(a, orig, "quantization changed nothing");
}
