//! One decoder layer's backward two ways, on the same weights and batch: lora-ft's hand-written
//! backward (recompute + LoRA-only gradients) against candle's autograd on the equivalent
//! composed forward (what a naive candle trainer would run). Prints times and the ratio.
//!
//!   cargo bench --bench layer_backward [-- HIDDEN INTER HEADS KV_HEADS SEQ]

use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var};
use lora_ft::model::layer::LayerInput;
use lora_ft::model::ops::attention::{causal_mask, ScoreRule};
use lora_ft::model::ops::Rope;
use lora_ft::model::reference::{layer_forward, random_layer};

fn time<F: FnMut()>(mut f: F, reps: usize) -> f64 {
    f();
    let t0 = Instant::now();
    for _ in 0..reps {
        f();
    }
    t0.elapsed().as_secs_f64() / reps as f64
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    // SmolLM2-135M's layer shape by default.
    let [hidden, inter, heads, kv, seq] = match args.as_slice() {
        [a, b, c, d, e] => [*a, *b, *c, *d, *e],
        _ => [576, 1536, 9, 3, 256],
    };
    let dev = Device::Cpu;
    let layer = random_layer(hidden, inter, heads, kv, 8, 1);
    let rope = Rope::new(hidden / heads, 10000.0, seq, DType::F32, &dev).unwrap();
    let x = Tensor::randn(0f32, 1.0, (2, seq, hidden), &dev).unwrap();
    let dy = Tensor::randn(0f32, 1.0, (2, seq, hidden), &dev).unwrap();
    let mask = causal_mask(seq, seq, 0, None, &dev).unwrap();
    let input = LayerInput {
        rope: &rope,
        mask: Some(&mask),
        offset: 0,
        scores: ScoreRule::causal(hidden / heads, None),
        dropout_seed: None,
        packed: None,
        mlp_tile_values: lora_ft::model::layer::tiles::MLP_TILE_VALUES,
    };

    let hand = time(
        || {
            let saved = layer.recompute(&x, &input).unwrap();
            layer.backward(saved, &dy, &input).unwrap();
        },
        5,
    );
    let autograd = time(
        || {
            let xv = Var::from_tensor(&x).unwrap();
            let y = layer_forward(&layer, xv.as_tensor(), &rope, &ScoreRule::causal(hidden / heads, None))
                .unwrap();
            (y * &dy).unwrap().sum_all().unwrap().backward().unwrap();
        },
        5,
    );
    println!(
        "layer {hidden}x{inter}, {heads}/{kv} heads, batch 2 x {seq}, LoRA r=8 on 7 projections (CPU, f32)"
    );
    println!("hand-written recompute+backward: {:.1} ms", hand * 1e3);
    println!("candle autograd forward+backward: {:.1} ms", autograd * 1e3);
    println!("ratio autograd / hand-written: {:.2}x", autograd / hand);
}
