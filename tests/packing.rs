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
//! mask) and adds f16 and bf16, where packed rows go through cuDNN's ragged (THD) layout, and,
//! for a tiny Mistral widened to the flash kernels' head_dim 64, through the flash kernels too.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use lora_ft::data::{pack, Batch, Example, PadTo};
use lora_ft::model::{CausalLm, TrainingPolicy};
use lora_ft::peft_adapter::load_adapter;
use lora_ft::quant::Quantization;

fn device() -> Device {
    match std::env::var("LORA_FT_TEST_DEVICE").as_deref() {
        Ok("cuda") => Device::new_cuda(0).expect("LORA_FT_TEST_DEVICE=cuda needs a GPU"),
        _ => Device::Cpu,
    }
}

fn model(dir: &Path, dtype: DType, device: &Device) -> CausalLm {
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

/// The attention kernels the CUDA half of `check_model` holds to the unpacked run's error.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernels {
    /// cuDNN's ragged layout (LORA_FT_ATTENTION=cudnn: a refused graph fails the test).
    Cudnn,
    /// The flash kernels with the spans (LORA_FT_ATTENTION=flash; every layer's forward and
    /// backward of a packed batch must have launched them).
    Flash,
}

fn check(name: &str, lens: &[usize], max_len: usize) {
    check_model(&Path::new("tests/fixtures").join(name), name, lens, max_len, &[Kernels::Cudnn]);
}

fn check_model(dir: &Path, name: &str, lens: &[usize], max_len: usize, kernels: &[Kernels]) {
    let examples = dialogues(lens);
    let one_per_row = Batch::from_examples(&examples.iter().collect::<Vec<_>>(), 0);
    let (rows, stats) = pack(examples, max_len);
    assert!(stats.rows < lens.len(), "{name}: something was packed ({stats:?})");
    let packed = Batch::from_examples(&rows.iter().collect::<Vec<_>>(), 0);
    assert_eq!(packed.trained_tokens(), one_per_row.trained_tokens(), "{name}: the same tokens train");

    let cpu = Device::Cpu;
    let exact = model(dir, DType::F64, &cpu);
    let (want_loss, want_n, want) = run(&exact, &one_per_row);
    assert_eq!(want_n, one_per_row.trained_tokens());
    assert!(want.iter().flatten().any(|g| g.abs() > 1e-6), "{name}: gradients that can differ");
    let rel = |loss: f64| (loss - want_loss).abs() / want_loss.abs();

    // the reference's own error: the same rows, one per row, in f32
    let dev = device();
    let m32 = model(dir, DType::F32, &dev);
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
    // and padded past its longest row (`data.pad_to_multiple_of`): the padding trains nothing and
    // moves nothing beyond roundings
    let to = PadTo { multiple: packed.seq_len + 5, most: usize::MAX };
    let padded = Batch::padded(&rows.iter().collect::<Vec<_>>(), 0, to);
    assert_eq!(padded.seq_len, packed.seq_len + 5);
    let (loss_pad, n_pad, grads_pad) = run(&m32, &padded);
    assert_eq!(n_pad, want_n);
    let (lp, gp) = (rel(loss_pad), grad_err(&grads_pad, &want));
    println!("{name} {dev:?}: packed f32 padded by 5: loss {lp:.1e} grads {gp:.1e}");
    assert!(
        lp <= 4.0 * ref_loss && gp <= 4.0 * ref_grads,
        "{name} padded f32: loss {lp:.2e}, gradients {gp:.2e}"
    );
    // and with the MLP in row tiles of 3 tokens (layer/tiles.rs)
    let (lt, gt) = tiled_error(m32, &packed, |loss, grads| (rel(loss), grad_err(grads, &want)));
    println!("{name} {dev:?}: packed f32, MLP in 3-row tiles: loss {lt:.1e} grads {gt:.1e}");
    assert!(
        lt <= 4.0 * ref_loss && gt <= 4.0 * ref_grads,
        "{name} tiled f32: loss {lt:.2e}, gradients {gt:.2e}"
    );

    // on CUDA in f16 and bf16: one dialogue per row through cuDNN's dense SDPA or the flash
    // kernels, packed rows through cuDNN's ragged layout or the flash kernels' spans, each held
    // to 4x the unpacked run's own error in that dtype
    #[cfg(feature = "cuda")]
    for &kernels in kernels.iter().filter(|_| dev.is_cuda()) {
        use lora_ft::cuda::cudnn_sdpa::{set_mode, Mode};
        use lora_ft::cuda::flash::packed_launches;
        set_mode(if kernels == Kernels::Cudnn { Mode::Cudnn } else { Mode::Flash });
        for (dtype, eps) in [(DType::F16, 2f64.powi(-11)), (DType::BF16, 2f64.powi(-8))] {
            let m = model(dir, dtype, &dev);
            let (loss_u, _, grads_u) = run(&m, &one_per_row);
            let before = packed_launches();
            let (loss_p, n_p, grads_p) = run(&m, &packed);
            let (forwards, backwards) = (packed_launches().0 - before.0, packed_launches().1 - before.1);
            if kernels == Kernels::Flash {
                let layers = m.layers.len();
                assert!(
                    forwards >= layers && backwards == layers,
                    "{name} {dtype:?}: the flash kernels took {forwards} forwards and {backwards} backwards \
                     of packed rows over {layers} layers"
                );
            }
            assert_eq!(n_p, want_n);
            let (ref_loss, ref_grads) =
                (rel(loss_u).max(8.0 * eps), grad_err(&grads_u, &want).max(8.0 * eps));
            let (lp, gp) = (rel(loss_p), grad_err(&grads_p, &want));
            println!(
                "{name} {dtype:?}: packed ({kernels:?}) loss {lp:.1e} grads {gp:.1e}; one per row loss \
                 {ref_loss:.1e} grads {ref_grads:.1e}"
            );
            assert!(
                lp <= 4.0 * ref_loss && gp <= 4.0 * ref_grads,
                "{name} {dtype:?}: loss {lp:.2e}, grads {gp:.2e}"
            );
            let (lt, gt) = tiled_error(m, &packed, |loss, grads| (rel(loss), grad_err(grads, &want)));
            println!(
                "{name} {dtype:?}: packed ({kernels:?}), MLP in 3-row tiles: loss {lt:.1e} grads {gt:.1e}"
            );
            assert!(
                lt <= 4.0 * ref_loss && gt <= 4.0 * ref_grads,
                "{name} {dtype:?} tiled: loss {lt:.2e}, grads {gt:.2e}"
            );
        }
        set_mode(Mode::Auto);
    }
    #[cfg(not(feature = "cuda"))]
    let _ = kernels;
}

/// The errors `err` gives for the packed batch run with the MLP in row tiles of 3 tokens.
fn tiled_error(mut m: CausalLm, batch: &Batch, err: impl Fn(f64, &[Vec<f64>]) -> (f64, f64)) -> (f64, f64) {
    let mlp_tile_values = 3 * m.config().intermediate_size;
    m.set_training_policy(TrainingPolicy { mlp_tile_values, ..m.training_policy().clone() });
    let (loss, _, grads) = run(&m, batch);
    err(loss, &grads)
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

/// Deterministic values of standard deviation `std` (a hash of the index, uniform).
fn values(n: usize, seed: u64, std: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut x =
                (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 31;
            x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^= x >> 29;
            let u = (x >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0; // uniform in [-1, 1)
            u * std * 3f32.sqrt()
        })
        .collect()
}

/// tiny-mistral with its attention widened to the flash kernels' head_dim: 2 query heads and 1
/// kv head of 64 (q/k/v/o projections and their LoRA factors remade, everything else kept),
/// `window` its sliding window; written under the temp folder.
fn tiny_mistral_d64(window: Option<usize>) -> PathBuf {
    let src = Path::new("tests/fixtures/tiny-mistral");
    let tag = window.map_or("full".to_string(), |w| format!("w{w}"));
    let dir = std::env::temp_dir().join(format!("lora-ft-packing-mistral-d64-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("adapter")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["head_dim"] = 64.into();
    config["num_attention_heads"] = 2.into();
    config["num_key_value_heads"] = 1.into();
    config["max_position_embeddings"] = 1024.into();
    config["sliding_window"] = window.map_or(serde_json::Value::Null, |w| w.into());
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(src.join("adapter/adapter_config.json"), dir.join("adapter/adapter_config.json")).unwrap();
    // the widened shapes: q 128 rows, k and v 64, o 128 columns (hidden 64, LoRA rank 4)
    let shape = |proj: &str, factor: Option<&str>| -> (usize, usize) {
        let out = if proj == "q_proj" { 128 } else { 64 };
        let inp = if proj == "o_proj" { 128 } else { 64 };
        match factor {
            None => (out, inp),
            Some("lora_A") => (4, inp),
            Some(_) => (out, 4),
        }
    };
    for (file, out) in [
        ("model.safetensors", "model.safetensors"),
        ("adapter/adapter_model.safetensors", "adapter/adapter_model.safetensors"),
    ] {
        let mut tensors = candle_core::safetensors::load(src.join(file), &Device::Cpu).unwrap();
        for (key, t) in tensors.iter_mut() {
            let Some(proj) = ["q_proj", "k_proj", "v_proj", "o_proj"].into_iter().find(|p| key.contains(p))
            else {
                continue;
            };
            let factor = ["lora_A", "lora_B"].into_iter().find(|f| key.contains(f));
            // peaked scores (q and k at 0.1), so that attention that crossed a dialogue shows
            let std = match (factor, proj) {
                (Some(_), _) => 0.1,
                (None, "q_proj" | "k_proj") => 0.1,
                (None, _) => 0.02,
            };
            let (rows, cols) = shape(proj, factor);
            // seeded by the tensor's name (FNV-1a): the same values in every run
            let seed = key
                .bytes()
                .fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3));
            *t = Tensor::from_vec(values(rows * cols, seed, std), (rows, cols), &Device::Cpu).unwrap();
        }
        candle_core::safetensors::save(&tensors, dir.join(out)).unwrap();
    }
    dir
}

/// The flash kernels' spans (head_dim 64): dialogues of 1, 7, 33 and 100 tokens and others,
/// none a multiple of the kernels' blocks, packed into rows of 256 that cross their 128-row and
/// 32/64/128-key blocks; with a 5-token window that cuts inside each dialogue, and without one.
/// On the CPU this checks the widened model like the others; with `LORA_FT_TEST_DEVICE=cuda`
/// f16 and bf16 also run through cuDNN's ragged layout and through the flash kernels.
#[test]
fn packed_rows_train_like_one_dialogue_per_row_through_the_flash_kernels() {
    let lens = [1, 7, 33, 100, 17, 61, 3, 90, 29, 120, 5];
    for window in [Some(5), None] {
        let dir = tiny_mistral_d64(window);
        let kernels = [Kernels::Cudnn, Kernels::Flash];
        check_model(&dir, &format!("tiny-mistral d64 window {window:?}"), &lens, 256, &kernels);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
