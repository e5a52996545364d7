//! `data.packing`: the loss and every LoRA gradient of packed rows equal those of the same
//! dialogues one per row (issue 19), for families whose attention differs (a sliding window that
//! cuts inside a dialogue; Gemma 3's per-layer RoPE, windows and q/k norms; Qwen3's q/k norms).
//!
//! The dialogues are packed by `lora_ft::data::pack` (best-fit decreasing) and batched by
//! `Batch::from_examples`, as training does. The reference is the same model run one dialogue
//! per row in float64; the bound is that run's own f32 error (the same rows, one per row, in
//! f32): packed in f64 within 1× of it, packed in f32 within 4×. A packed row that let attention
//! or positions cross a dialogue would be off by orders of magnitude more.
//! `LORA_FT_TEST_DEVICE=cuda` runs the f32 case on the GPU (the composed path with the packed
//! mask) and adds f16 and bf16, where packed rows go through cuDNN's ragged (THD) layout.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use lora_ft::data::{pack, Batch, Example};
use lora_ft::export::load_adapter;
use lora_ft::model::CausalLm;
use lora_ft::quant::Quantization;

fn device() -> Device {
    match std::env::var("LORA_FT_TEST_DEVICE").as_deref() {
        Ok("cuda") => Device::new_cuda(0).expect("LORA_FT_TEST_DEVICE=cuda needs a GPU"),
        _ => Device::Cpu,
    }
}

fn model(name: &str, dtype: DType, device: &Device) -> CausalLm {
    let dir = Path::new("tests/fixtures").join(name);
    let files = [dir.join("model.safetensors")];
    let mut m = CausalLm::load(&dir.join("config.json"), &files, dtype, Quantization::None, device).unwrap();
    load_adapter(&mut m, &dir.join("adapter")).unwrap();
    m
}

/// Dialogues of `lens` tokens (ids below 256, the fixtures' vocabulary), the first third of each
/// a prompt (label −100), the rest trained.
fn dialogues(lens: &[usize]) -> Vec<Example> {
    lens.iter()
        .enumerate()
        .map(|(d, &len)| {
            let input_ids: Vec<u32> = (0..len).map(|i| ((d * 97 + i * 31 + 7) % 251) as u32).collect();
            let labels = input_ids
                .iter()
                .enumerate()
                .map(|(i, &id)| if i < len / 3 { -100 } else { i64::from(id) })
                .collect();
            Example { input_ids, labels, ..Default::default() }
        })
        .collect()
}

/// (loss sum, trained tokens, gradients as f64 vectors) of `batch`.
fn run(m: &CausalLm, batch: &Batch) -> (f64, usize, Vec<Vec<f64>>) {
    let ids =
        Tensor::from_vec(batch.input_ids.clone(), (batch.batch_size, batch.seq_len), m.device()).unwrap();
    let out = m.forward_backward_packed(&ids, &batch.labels, &batch.seq_lens, 1.0, None).unwrap();
    let grads = out
        .grads
        .iter()
        .map(|g| g.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap())
        .collect();
    (out.loss_sum, out.n_tokens, grads)
}

/// The largest |a − b| over every gradient, relative to the largest |b|.
fn grad_err(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    let scale = b.iter().flatten().fold(0f64, |m, x| m.max(x.abs()));
    let diff = a.iter().flatten().zip(b.iter().flatten()).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

fn check(name: &str, lens: &[usize], max_len: usize) {
    let examples = dialogues(lens);
    let one_per_row = Batch::from_examples(&examples.iter().collect::<Vec<_>>(), 0);
    let (rows, stats) = pack(examples, max_len);
    assert!(stats.rows < lens.len(), "{name}: something was packed ({stats:?})");
    let packed = Batch::from_examples(&rows.iter().collect::<Vec<_>>(), 0);
    assert_eq!(packed.trained_tokens(), one_per_row.trained_tokens(), "{name}: the same tokens train");

    let cpu = Device::Cpu;
    let exact = model(name, DType::F64, &cpu);
    let (want_loss, want_n, want) = run(&exact, &one_per_row);
    assert_eq!(want_n, one_per_row.trained_tokens());
    assert!(want.iter().flatten().any(|g| g.abs() > 1e-6), "{name}: gradients that can differ");
    let rel = |loss: f64| (loss - want_loss).abs() / want_loss.abs();

    // the reference's own error: the same rows, one per row, in f32
    let dev = device();
    let m32 = model(name, DType::F32, &dev);
    let (loss_u, _, grads_u) = run(&m32, &one_per_row);
    let floor = 8.0 * f64::from(f32::EPSILON);
    let (ref_loss, ref_grads) = (rel(loss_u).max(floor), grad_err(&grads_u, &want).max(floor));

    // packed in f64 (the LoRA weights and gradients stay f32, the loss's logits f32): packing
    // moves nothing beyond those roundings
    let (loss64, n64, grads64) = run(&exact, &packed);
    assert_eq!(n64, want_n);
    let (l64, g64) = (rel(loss64), grad_err(&grads64, &want));
    // packed in f32, on the test device
    let (loss_p, n_p, grads_p) = run(&m32, &packed);
    assert_eq!(n_p, want_n);
    let (l32, g32) = (rel(loss_p), grad_err(&grads_p, &want));
    println!(
        "{name} {dev:?}: packed f64 loss {l64:.1e} grads {g64:.1e}; packed f32 loss {l32:.1e} grads {g32:.1e}; \
         one per row f32 loss {ref_loss:.1e} grads {ref_grads:.1e}"
    );
    assert!(l64 <= ref_loss && g64 <= ref_grads, "{name} f64: loss {l64:.2e}, gradients {g64:.2e}");
    assert!(
        l32 <= 4.0 * ref_loss && g32 <= 4.0 * ref_grads,
        "{name} f32: loss {l32:.2e}, gradients {g32:.2e}"
    );
}

/// Windows of 5 tokens on every layer: a window that cuts inside each dialogue, never across.
#[test]
fn packed_rows_train_like_one_dialogue_per_row_with_a_sliding_window() {
    check("tiny-mistral", &[17, 9, 23, 6, 12, 30], 32);
}

/// Gemma 3: a local layer (window, its own RoPE base) and a global one, q/k norms.
#[test]
fn packed_rows_train_like_one_dialogue_per_row_for_gemma3() {
    check("tiny-gemma3", &[17, 9, 23, 6, 12, 30], 32);
}

/// Qwen3's q/k norms and Llama 3.1's scaled RoPE, positions restarting per dialogue.
#[test]
fn packed_rows_train_like_one_dialogue_per_row_for_qwen3_and_llama31() {
    check("tiny-qwen3", &[11, 25, 4, 19, 8], 40);
    check("tiny-llama31", &[11, 25, 4, 19, 8], 40);
}
