//! Serving's plan against what the engine allocates, and the batch it chooses against its sum.

use std::path::Path;

use candle_core::{DType, Device};

use super::serving::*;
use crate::arch::ModelConfig;
use crate::model::{CausalLm, LoraSpec};
use crate::quant::Quantization;

fn bench_model(name: &str) -> ModelConfig {
    let file = format!("{}/tests/fixtures/bench-models/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
    ModelConfig::from_file(Path::new(&file)).unwrap()
}

fn gpu_shape(adapters: usize) -> ServingShape {
    ServingShape {
        dtype: DType::BF16,
        nf4: Some(true),
        adapters: vec![LoraSpec { r: 16, ..LoraSpec::default() }; adapters],
        gpu: true,
        max_prefill_tokens: PREFILL_TOKENS,
    }
}

/// The planner's KV bytes per token, and a cache's bytes from them, are exactly what the
/// engine's slot caches hold for every tiny family, in f32 and bf16.
#[test]
fn kv_bytes_equal_the_slot_caches_allocation() {
    let families =
        ["tiny-chat", "tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3", "tiny-mistral"];
    for family in families {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(family);
        let (config, weights) = crate::hub::local_weights(&dir).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let model = CausalLm::load(&config, &weights, dtype, Quantization::None, &Device::Cpu).unwrap();
            let (slots, capacity) = (3, 17);
            let caches = model.slot_caches(slots, capacity).unwrap();
            let allocated: usize = caches.iter().map(|c| c.allocated_bytes()).sum();
            let m = model.config();
            let per_token = kv_bytes_per_token(m, dtype);
            assert_eq!(per_token * (slots * capacity) as u64, allocated as u64, "{family} {dtype:?}");
            let shape = ServingShape {
                dtype,
                nf4: None,
                adapters: Vec::new(),
                gpu: false,
                max_prefill_tokens: PREFILL_TOKENS,
            };
            let plan = ServingPlan::new(m, &shape, capacity);
            assert_eq!(plan.kv_bytes_per_sequence() * slots as u64, allocated as u64, "{family} {dtype:?}");
            let d = m.head_dim() * m.num_kv_heads();
            assert_eq!(per_token as usize, m.num_hidden_layers * d * 2 * dtype.size_in_bytes());
        }
    }
}

/// Llama-3.1-8B in NF4 in bf16: 128 KiB of KV cache a token (32 layers × 8 kv heads × 128 × 2 ×
/// 2 bytes), and the chosen batch at a budget the largest whose sum fits.
#[test]
fn the_largest_batch_is_the_last_that_fits() {
    let m = bench_model("llama3.1-8b");
    let plan = ServingPlan::new(&m, &gpu_shape(1), 4096);
    assert_eq!(plan.kv_bytes_per_token, 32 * 8 * 128 * 2 * 2);
    assert_eq!(plan.kv_bytes_per_sequence(), 4096 * 131072);
    // the NF4 projections with double quantization (3.6 GB) and the bf16 head (1.05 GB); the
    // untied embedding table stays in host memory
    assert!((4.6e9..4.7e9).contains(&(plan.weights as f64)), "{}", plan.weights);
    // rank 16 on the seven projections of 32 layers, f32
    assert_eq!(plan.adapters, 32 * 16 * 4 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336)));
    for gib in [8u64, 24, 40, 80, 141] {
        let budget = gib << 30;
        let n = plan.largest_batch(budget);
        if n > 0 {
            assert!(plan.total(n) <= budget, "{gib} GiB: {n} sequences");
        }
        assert!(plan.total(n + 1) > budget, "{gib} GiB: {} sequences fit too", n + 1);
    }
    // the decode kernels' scratch on a GPU (21.3 MiB), none on the CPU, counted once whatever
    // the batch
    assert_eq!(plan.decode_scratch, DECODE_SCRATCH);
    assert_eq!(DECODE_SCRATCH, 160 * (131_072 + 8_192) + 65_536 + 4_096);
    let cpu = ServingPlan::new(&m, &ServingShape { gpu: false, ..gpu_shape(1) }, 4096);
    assert_eq!(cpu.decode_scratch, 0);
    assert_eq!(plan.total(5) - plan.total(4), plan.per_sequence() + plan.prefill(5) - plan.prefill(4));
    assert_eq!(plan.largest_batch(plan.fixed()), 0, "nothing beside the fixed parts");
    assert_eq!(plan.largest_batch(plan.total(7)), 7);
    assert_eq!(plan.largest_batch(plan.total(7) - 1), 6);
    // on a loaded GPU: what the device holds in place of the predicted weights, plus the
    // adapters still to load
    let loaded = plan.clone().with_resident(6 << 30, 1 << 28);
    assert_eq!(loaded.fixed(), (6 << 30) + (1 << 28));
    assert_eq!(loaded.total(3) - plan.total(3), loaded.fixed() - plan.fixed());
}

/// A lower prefill bound (`--max-prefill-tokens`) plans the prefill at it: 64 sequences of 768
/// positions prefill 16,384 tokens at most by default and one prompt (768) a forward under a
/// bound of 512 (a longer prompt alone); the transients shrink by the tokens' bytes at least,
/// and more sequences fit the same budget.
#[test]
fn a_lower_prefill_bound_plans_smaller_prefills() {
    let m = bench_model("llama3.1-8b");
    let whole = ServingPlan::new(&m, &gpu_shape(1), 768);
    let bounded = ServingPlan::new(&m, &ServingShape { max_prefill_tokens: 512, ..gpu_shape(1) }, 768);
    assert_eq!((whole.prefill_tokens(64), bounded.prefill_tokens(64)), (16384, 768));
    assert_eq!((whole.prefill_tokens(1), bounded.prefill_tokens(1)), (768, 768));
    assert!(whole.prefill(64) - bounded.prefill(64) >= (16384 - 768) * whole.prefill_per_token);
    let budget = 12u64 << 30;
    assert!(bounded.largest_batch(budget) > whole.largest_batch(budget));
}

/// Serving's choice where the flags leave it: the longest context at which 16 sequences fit,
/// the most sequences of it that fit (256 at most); a given length or batch is kept; an error
/// where not one sequence fits.
#[test]
fn serving_chooses_the_longest_context_and_the_largest_batch() {
    let m = bench_model("llama3.1-8b");
    let shape = gpu_shape(1);
    let plan = |n: usize| ServingPlan::new(&m, &shape, n);
    let budget = (0.92 * 80.0 * (1u64 << 30) as f64) as u64;
    let c = choose(m.max_position_embeddings, plan, budget, (None, None)).unwrap();
    // 16 sequences of 32768 positions are 64 GiB of KV cache: past the room beside the weights
    assert_eq!(c.max_seq_len, 16384);
    let fits = plan(16384).largest_batch(budget);
    assert!((16..=40).contains(&fits), "{fits}");
    assert_eq!(c.max_batch, fits);
    assert!(plan(32768).largest_batch(budget) < 16);
    assert!(c.reason.contains(&format!("{fits} sequences of 16384 positions")), "{}", c.reason);

    let given = choose(m.max_position_embeddings, plan, budget, (Some(2048), None)).unwrap();
    assert_eq!((given.max_seq_len, given.max_batch), (2048, MAX_PLANNED_BATCH), "capped");
    let given = choose(m.max_position_embeddings, plan, budget, (Some(2048), Some(9))).unwrap();
    assert_eq!(given.max_batch, 9);

    let err = choose(m.max_position_embeddings, plan, 4 << 30, (None, None)).unwrap_err();
    assert!(err.starts_with("not even one sequence of 4096 positions fits"), "{err}");
}

/// `lora-ft estimate`'s serving section names the parts and a row per context length.
#[test]
fn the_serving_report_has_a_row_per_context() {
    let m = bench_model("llama3.1-8b");
    let budget = 40u64 << 30;
    let text = report(&m, &gpu_shape(1), budget);
    assert!(text.contains("KV cache per token"), "{text}");
    assert!(text.contains("128.0 KiB   (32 layers x 8 kv heads x 128 x 2 x 2 bytes)"), "{text}");
    for n in [2048, 4096, 8192, 131072] {
        let fits = ServingPlan::new(&m, &gpu_shape(1), n).largest_batch(budget);
        assert!(text.contains(&format!("context {n:>6}: {fits:>5} sequences")), "{n}: {text}");
    }
    assert!(text.contains("context 131072:     0 sequences"), "{text}");
}
