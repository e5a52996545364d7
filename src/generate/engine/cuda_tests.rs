//! The engine's decode steps on a GPU against the CPU: a step through the slots against the
//! whole sequence's forward, and a step replayed from its CUDA graph against the same step run
//! eagerly, on the tiny chat model widened to the decode kernel's head size.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::tests::{fixture, tempdir};
use crate::model::CausalLm;
use crate::quant::Quantization;

/// The tiny chat model's weights with 64-wide heads (the decode kernel's smallest), random where
/// the shapes change, written into `dir`.
fn wide_head_model(dir: &Path) -> PathBuf {
    let (_, weights) = crate::hub::local_weights(&fixture()).unwrap();
    let mut tensors = candle_core::safetensors::load(&weights[0], &Device::Cpu).unwrap();
    let text = std::fs::read_to_string(fixture().join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["head_dim"] = 64.into();
    let (hidden, heads, kv) = (64usize, 4usize, 2usize);
    for (name, t) in tensors.iter_mut() {
        let rows = |n: usize| Tensor::randn(0f32, 0.05, (n * 64, hidden), &Device::Cpu).unwrap();
        if name.ends_with("q_proj.weight") {
            *t = rows(heads);
        } else if name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight") {
            *t = rows(kv);
        } else if name.ends_with("o_proj.weight") {
            *t = Tensor::randn(0f32, 0.05, (hidden, heads * 64), &Device::Cpu).unwrap();
        }
    }
    let out = dir.join("wide-heads");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("config.json"), serde_json::to_string(&config).unwrap()).unwrap();
    candle_core::safetensors::save(&tensors, out.join("model.safetensors")).unwrap();
    out
}

/// `wide_head_model` with a random rank-4 adapter on every projection (the same values on
/// every device), in `dtype` on `device`, its base as `quantization` stores it.
fn wide_head_lora_model(dir: &Path, dtype: DType, quantization: Quantization, device: &Device) -> CausalLm {
    use rand::{Rng, SeedableRng};
    let (config, weights) = crate::hub::local_weights(dir).unwrap();
    let spec = crate::model::LoraSpec {
        r: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: crate::model::PROJECTIONS.iter().map(|p| p.to_string()).collect(),
        rslora: false,
    };
    let mut model = CausalLm::load(&config, &weights, dtype, quantization, device).unwrap();
    model.add_lora(&spec, 3).unwrap();
    // the same values on every device: drawn from a seeded generator
    for (i, (_, var)) in model.lora_params().into_iter().enumerate() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(40 + i as u64);
        let values: Vec<f32> = (0..var.elem_count()).map(|_| rng.random_range(-0.08f32..0.08)).collect();
        let values = Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap();
        var.set(&values.to_device(device).unwrap().to_dtype(var.dtype()).unwrap()).unwrap();
    }
    model
}

/// A decode step replayed from its recorded CUDA graph gives the logits of the step launched
/// kernel by kernel: over several steps (new positions at every replay, so a replay reading
/// stale inputs fails), with rows leaving and coming back (a second recording, then the first
/// replayed again), each row within the crate's multiple of the eager step's own error against
/// the CPU's f32 forward of the whole sequence, in f32 and bf16.
#[test]
fn cuda_graph_steps_match_eager_steps() {
    use super::step_graphs::{StepGraphs, StepRows};
    use crate::model::{DecodeRows, KvCache};
    use crate::testing::assert_within_reference_error;
    let gpu = Device::new_cuda(0).unwrap();
    // as every command's device: a graph cannot record cudarc's cross-stream events
    crate::cuda::order_by_stream(&gpu);
    let scratch = tempdir("engine-graphs");
    let dir = wide_head_model(&scratch);
    let cpu_model = wide_head_lora_model(&dir, DType::F32, Quantization::None, &Device::Cpu);
    let exact_next = |ids: &[u32]| {
        let t = Tensor::new(ids, &Device::Cpu).unwrap().unsqueeze(0).unwrap();
        cpu_model.forward(&t, None).unwrap().squeeze(0).unwrap().get(ids.len() - 1).unwrap()
    };
    for dtype in [DType::F32, DType::BF16] {
        let model = wide_head_lora_model(&dir, dtype, Quantization::None, &gpu);
        let caches = model.slot_caches(4, 64).unwrap();
        let mut seqs: Vec<Vec<u32>> = vec![(3..30).collect(), (9..20).collect(), (3..30).collect()];
        let slots = [2usize, 0, 3];
        for r in 0..2 {
            let mut prompt_caches: Vec<KvCache> =
                (0..model.layers.len()).map(|_| KvCache::default()).collect();
            let ids = Tensor::new(seqs[r].as_slice(), &gpu).unwrap().unsqueeze(0).unwrap();
            model.forward_last_of(&model.layers, &ids, Some(&mut prompt_caches)).unwrap();
            for (cache, prompt) in caches.iter().zip(&prompt_caches) {
                cache.fill(slots[r], (prompt, 0)).unwrap();
            }
        }
        for cache in &caches {
            cache.copy_slot(slots[0], slots[2], seqs[2].len()).unwrap();
        }
        for seq in seqs.iter_mut() {
            let next = exact_next(seq).argmax(0).unwrap().to_scalar::<u32>().unwrap();
            seq.push(next);
        }
        let mut graphs = StepGraphs::new(&model, 4, true);
        let schedule: [&[usize]; 7] =
            [&[0, 1, 2], &[0, 1, 2], &[0, 1, 2], &[0, 2], &[0, 2], &[0, 1, 2], &[0, 1, 2]];
        for (step, active) in schedule.into_iter().enumerate() {
            let ids: Vec<u32> = active.iter().map(|&r| *seqs[r].last().unwrap()).collect();
            let at: Vec<usize> = active.iter().map(|&r| slots[r]).collect();
            let positions: Vec<usize> = active.iter().map(|&r| seqs[r].len() - 1).collect();
            let rows = StepRows { ids: &ids, slots: &at, positions: &positions };
            let replayed = graphs
                .decode(&model, (&None, &model.layers), &caches, rows)
                .unwrap()
                .expect("graphs on CUDA");
            // the eager step writes the same keys and values to the same places again
            let places = DecodeRows::new(at.clone(), positions.clone(), &caches[0]).unwrap();
            let ids_t = Tensor::new(ids.as_slice(), &gpu).unwrap().unsqueeze(1).unwrap();
            let eager = model.forward_slots_of(&model.layers, &ids_t, &caches, &places).unwrap();
            for (i, &r) in active.iter().enumerate() {
                let exact = exact_next(&seqs[r]);
                let what = format!("{dtype:?} step {step} row {r}");
                assert_within_reference_error(
                    &what,
                    &replayed.get(i).unwrap(),
                    &eager.get(i).unwrap(),
                    &exact,
                );
                seqs[r].push(exact.argmax(0).unwrap().to_scalar::<u32>().unwrap());
            }
        }
        assert!(graphs.on(), "a recording failed: the steps ran eagerly");
    }
}

/// On the GPU, a decode step through the slots (the decode attention kernel, the scatter into
/// the cache) gives the logits the whole sequence's forward gives at its last position: against
/// the CPU's f32 forward, within the crate's multiple of that forward's own error on the GPU, in
/// f32 and bf16, for three sequences of different lengths decoded together, two of them in slots
/// filled by a prefill and one in a slot copied from another, with a random adapter on; and with
/// an NF4 base (double-quantized) in f16 and bf16, where the step's projections are the fused
/// NF4 GEMV launches with their LoRA terms (`lora::decode`) and the whole sequence's forward
/// dequantizes, against the CPU's f32 forward of the same NF4 weights.
#[test]
fn cuda_decode_steps_match_the_uncached_forward() {
    use crate::model::{DecodeRows, KvCache};
    use crate::testing::assert_within_reference_error;
    let gpu = Device::new_cuda(0).unwrap();
    let scratch = tempdir("engine-wide-heads");
    let dir = wide_head_model(&scratch);
    let nf4 = Quantization::Nf4 { double_quant: true };
    let prompts: Vec<Vec<u32>> = vec![(3..40).collect(), (9..20).collect(), (3..40).collect()];
    let next = [17u32, 200, 5];
    let full = |model: &CausalLm, r: usize| {
        let ids: Vec<u32> = prompts[r].iter().copied().chain([next[r]]).collect();
        let ids = Tensor::new(ids.as_slice(), model.device()).unwrap().unsqueeze(0).unwrap();
        model.forward(&ids, None).unwrap().squeeze(0).unwrap().get(prompts[r].len()).unwrap()
    };
    let cases = [
        (DType::F32, Quantization::None),
        (DType::BF16, Quantization::None),
        (DType::F16, nf4),
        (DType::BF16, nf4),
    ];
    for (dtype, quantization) in cases {
        let cpu_model = wide_head_lora_model(&dir, DType::F32, quantization, &Device::Cpu);
        let exact: Vec<Tensor> = (0..3).map(|r| full(&cpu_model, r)).collect();
        let model = wide_head_lora_model(&dir, dtype, quantization, &gpu);
        let caches = model.slot_caches(4, 64).unwrap();
        for (slot, r) in [(2usize, 0usize), (0, 1)] {
            let mut prompt_caches: Vec<KvCache> =
                (0..model.layers.len()).map(|_| KvCache::default()).collect();
            let ids = Tensor::new(prompts[r].as_slice(), &gpu).unwrap().unsqueeze(0).unwrap();
            model.forward_last_of(&model.layers, &ids, Some(&mut prompt_caches)).unwrap();
            for (cache, prompt) in caches.iter().zip(&prompt_caches) {
                cache.fill(slot, (prompt, 0)).unwrap();
            }
        }
        for cache in &caches {
            cache.copy_slot(2, 3, prompts[2].len()).unwrap();
        }
        let rows =
            DecodeRows::new(vec![2, 0, 3], prompts.iter().map(Vec::len).collect(), &caches[0]).unwrap();
        let ids = Tensor::new(next.as_slice(), &gpu).unwrap().unsqueeze(1).unwrap();
        let ours = model.forward_slots_of(&model.layers, &ids, &caches, &rows).unwrap();
        for (r, exact) in exact.iter().enumerate() {
            let reference = full(&model, r);
            let what = format!("row {r}, {dtype:?}, {quantization:?}");
            assert_within_reference_error(&what, &ours.get(r).unwrap(), &reference, exact);
        }
    }
}
