//! `train.checkpointing`: a step that keeps some or all of its last layers' activations from the
//! forward (no recompute, n1/n2/act rebuilt in the backward) computes the same loss and the same
//! LoRA gradients as full checkpointing, bit for bit: the same kernels run on the same inputs,
//! only at another time. Checked on families whose layers keep different things (Gemma 3's
//! output norms and q/k norms, Qwen3's q/k norms, a sliding window), with packed rows and with
//! LoRA dropout, whose masks the recompute must reproduce.
//! Layers whose activations wait in host memory instead (`LayerKind::Offloaded`: copied out
//! and back as whole buffers, each tensor rebuilt as the same view) give the same bits too.
//! `LORA_FT_TEST_DEVICE=cuda` runs it on the GPU in f32, f16 and bf16, the offloaded layers
//! through page-locked host memory.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use lora_ft::data::{pack, Batch, Example};
use lora_ft::model::activations::{KeptLayers, LayerPlan};
use lora_ft::model::{CausalLm, TrainingPolicy};
use lora_ft::peft_adapter::load_adapter;
use lora_ft::quant::Quantization;

fn device() -> Device {
    match std::env::var("LORA_FT_TEST_DEVICE").as_deref() {
        Ok("cuda") => Device::new_cuda(0).expect("LORA_FT_TEST_DEVICE=cuda needs a GPU"),
        _ => Device::Cpu,
    }
}

/// The fixture with its adapter, LoRA dropout 0.25 on every projection.
fn model(name: &str, dtype: DType, device: &Device) -> CausalLm {
    let dir = Path::new("tests/fixtures").join(name);
    let files = [dir.join("model.safetensors")];
    let mut m = CausalLm::load(&dir.join("config.json"), &files, dtype, Quantization::None, device).unwrap();
    load_adapter(&mut m, &dir.join("adapter")).unwrap();
    for layer in &mut m.layers {
        for p in layer.proj.iter_mut() {
            if let Some(lora) = p.lora.as_mut() {
                lora.dropout = 0.25;
            }
        }
    }
    m
}

/// Packed rows of dialogues of `lens` tokens (ids below 256), the first third of each a prompt.
fn packed_batch(lens: &[usize], max_len: usize) -> Batch {
    let examples = lens
        .iter()
        .enumerate()
        .map(|(d, &len)| {
            let input_ids: Vec<u32> = (0..len).map(|i| ((d * 89 + i * 37 + 3) % 251) as u32).collect();
            let labels = input_ids
                .iter()
                .enumerate()
                .map(|(i, &id)| if i < len / 3 { -100 } else { i64::from(id) })
                .collect();
            Example { input_ids, labels, ..Default::default() }
        })
        .collect();
    let (rows, _) = pack(examples, max_len);
    Batch::from_examples(&rows.iter().collect::<Vec<_>>(), 0)
}

/// (loss sum, the input gradient and every LoRA gradient, flattened as f64) with `kept`.
fn run(m: &mut CausalLm, batch: &Batch, kept: KeptLayers, dropout_seed: Option<u64>) -> (f64, Vec<Vec<f64>>) {
    m.set_training_policy(TrainingPolicy { kept_layers: kept, ..m.training_policy().clone() });
    let shape = (batch.batch_size, batch.seq_len);
    let ids = Tensor::from_vec(batch.input_ids.clone(), shape, m.device()).unwrap();
    let out = m.forward_backward_packed(&ids, &batch.labels, &batch.seq_lens, 1.0, dropout_seed).unwrap();
    let flat = |g: &Tensor| g.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let mut grads: Vec<Vec<f64>> = out.grads.iter().map(flat).collect();
    grads.push(flat(&out.d_inputs_embeds));
    (out.loss_sum, grads)
}

fn check(name: &str) {
    let dev = device();
    let batch = packed_batch(&[17, 9, 23, 6, 12, 30], 32);
    let dtypes: &[DType] = if dev.is_cuda() { &[DType::F32, DType::F16, DType::BF16] } else { &[DType::F32] };
    for &dtype in dtypes {
        let mut m = model(name, dtype, &dev);
        let layers = m.layers.len();
        assert!(layers >= 2, "{name}: a kept layer beside a recomputed one");
        let offloaded = |kept, offloaded, stride| {
            KeptLayers::by(move |_| LayerPlan { kept, offloaded, stride, ..LayerPlan::NONE })
        };
        for seed in [None, Some(7)] {
            let (loss, grads) = run(&mut m, &batch, KeptLayers::none(), seed);
            assert!(grads.iter().flatten().any(|g| g.abs() > 1e-6), "{name}: gradients that can differ");
            for (what, kept) in [
                ("the last layer kept", KeptLayers::last(1)),
                ("every layer kept", KeptLayers::all()),
                // the last layer also keeps n1, n2 and act
                (
                    "every layer kept, the last whole",
                    KeptLayers::by(|_| LayerPlan { kept: usize::MAX, complete: 1, ..LayerPlan::NONE }),
                ),
                // on CUDA in page-locked host memory, each fetched one layer ahead of its backward
                ("one layer offloaded, one kept", offloaded(1, 1, 1)),
                ("every layer offloaded", offloaded(0, usize::MAX, 1)),
                ("the last layer offloaded, the first recomputed", offloaded(0, 1, 1)),
            ] {
                let (kept_loss, kept_grads) = run(&mut m, &batch, kept, seed);
                let differing =
                    grads.iter().flatten().zip(kept_grads.iter().flatten()).filter(|(a, b)| a != b).count();
                println!("{name} {dtype:?} dropout {seed:?}, {what}: loss {kept_loss} vs {loss}, {differing} gradient values differ");
                assert_eq!(kept_loss, loss, "{name} {dtype:?} {seed:?} {what}: the loss");
                assert_eq!(differing, 0, "{name} {dtype:?} {seed:?} {what}: gradients");
            }
        }
        // lm_head streamed from host memory over the link the offloaded layers come back on, one
        // of them fetched while the loss streams (the streamed loss rounds its own way, so
        // against full checkpointing with the head streamed too)
        let mut m = model(name, dtype, &dev);
        if dev.is_cuda() && m.stream_lm_head().unwrap() {
            let (loss, grads) = run(&mut m, &batch, KeptLayers::none(), None);
            let (kept_loss, kept_grads) = run(&mut m, &batch, offloaded(1, usize::MAX, 1), None);
            let differing =
                grads.iter().flatten().zip(kept_grads.iter().flatten()).filter(|(a, b)| a != b).count();
            println!("{name} {dtype:?} lm_head streamed, layers offloaded: loss {kept_loss} vs {loss}, {differing} gradient values differ");
            assert_eq!((kept_loss, differing), (loss, 0), "{name} {dtype:?}: lm_head streamed");
            // its first chunks prefetched during the forward's last layer, or from the first
            // layer on (then the offloaded layer the backward reaches first comes in after the
            // loss): the same chunks in the same order, the same bits
            for lead in [1, usize::MAX] {
                let prefetched = KeptLayers::by(move |_| LayerPlan {
                    kept: 1,
                    offloaded: usize::MAX,
                    stride: 1,
                    lm_head_prefetch: 2,
                    lm_head_prefetch_lead: lead,
                    ..LayerPlan::NONE
                });
                let (pre_loss, pre_grads) = run(&mut m, &batch, prefetched, None);
                let differing =
                    grads.iter().flatten().zip(pre_grads.iter().flatten()).filter(|(a, b)| a != b).count();
                println!("{name} {dtype:?} lm_head prefetched from {lead} layers before the end: loss {pre_loss} vs {loss}, {differing} gradient values differ");
                assert_eq!(
                    (pre_loss, differing),
                    (loss, 0),
                    "{name} {dtype:?}: lm_head prefetched, lead {lead}"
                );
            }
        }
    }
}

#[test]
fn kept_layers_give_the_gradients_of_full_checkpointing_mistral_with_a_window() {
    check("tiny-mistral");
}

#[test]
fn kept_layers_give_the_gradients_of_full_checkpointing_gemma3() {
    check("tiny-gemma3");
}

#[test]
fn kept_layers_give_the_gradients_of_full_checkpointing_qwen3() {
    check("tiny-qwen3");
}
