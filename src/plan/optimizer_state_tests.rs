//! The planner's count of optimizer state against the bytes each optimizer really allocates.

use candle_core::{DType, Device, Var};

use super::super::estimate::projection_dims;
use super::super::{estimate, RunShape};
use super::OptimizerState;
use crate::arch::ModelConfig;
use crate::config::{AdafactorSection, AdamwSection, OptimName, OptimSection};
use crate::optim::Optimizer;

/// A small model whose LoRA matrices fall on both sides of `min_8bit_size` (4096): at r = 16,
/// A of q [16, 256] and B of o [256, 16] have 4096 elements, k/v's B [128, 16] 2048, and the
/// MLP's 16 × 600 = 9600 is not a whole number of 256-blocks.
fn small() -> ModelConfig {
    serde_json::from_str(
        r#"{"vocab_size": 1000, "hidden_size": 256, "intermediate_size": 600, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}"#,
    )
    .unwrap()
}

/// The benchmark's recipe with `optimizer`.
fn run(optimizer: OptimizerState) -> RunShape {
    RunShape { optimizer, mlp_tiles: true, ..super::super::tests::bench_run() }
}

/// Bytes of the state `cfg`'s optimizer allocates for the LoRA matrices of `m` at r = 16.
fn allocated(m: &ModelConfig, cfg: &OptimSection) -> (u64, u64) {
    let mut vars = Vec::new();
    for _ in 0..m.num_hidden_layers {
        for (o, n) in projection_dims(m) {
            vars.push(Var::zeros((16, n), DType::F32, &Device::Cpu).unwrap());
            vars.push(Var::zeros((o, 16), DType::F32, &Device::Cpu).unwrap());
        }
    }
    let params: u64 = vars.iter().map(|v| v.elem_count() as u64 * 4).sum();
    let opt = Optimizer::new(vars, cfg, 0.0).unwrap();
    let state =
        opt.state_tensors().iter().map(|(_, t)| (t.elem_count() * t.dtype().size_in_bytes()) as u64).sum();
    (params, state)
}

#[test]
fn planned_state_is_what_each_optimizer_allocates() {
    let m = small();
    let adamw = AdamwSection::default();
    let with_beta1 = AdafactorSection { beta1: Some(0.9), ..Default::default() };
    let cases = [
        (OptimizerState::Adafactor { first_moment: false }, OptimSection::default()),
        (OptimizerState::Adafactor { first_moment: true }, OptimSection::adafactor(&with_beta1)),
        (OptimizerState::AdamW, OptimSection::adamw(OptimName::Adamw, &adamw)),
        (OptimizerState::AdamW8bit, OptimSection::adamw(OptimName::Adamw8bit, &adamw)),
    ];
    let mut states = Vec::new();
    for (planned, cfg) in cases {
        let (params, state) = allocated(&m, &cfg);
        let e = estimate(&m, &run(planned), (512, 1));
        assert_eq!(e.lora_and_optimizer, params + state, "{planned:?}");
        states.push(state);
    }
    // AdamW holds two f32 values per parameter; the 8-bit one about a quarter of that here
    // (some matrices are below min_8bit_size), Adafactor far less
    let params = allocated(&m, &OptimSection::default()).0;
    assert_eq!(states[2], 2 * params);
    assert!(states[3] < states[2] / 2 && states[3] > states[2] / 4, "{states:?}");
    assert!(states[0] < states[3] / 4, "{states:?}");
}
