//! The test oracle: the same decoder layer written only with differentiable candle ops
//! (unfused norm, softmax and rotate-half RoPE), so candle's autograd can check the
//! hand-written backward.

use candle_core::{Result, Tensor, Var, D};
use rand::{Rng, SeedableRng};

use super::decoder::CausalLm;
use super::layer::DecoderLayer;
use super::lora::linear::{BaseWeight, LoraLinear};
use super::lora::LoraAdapter;
use super::ops::attention::{causal_mask, repeat_kv, ScoreRule};
use super::ops::Rope;
use super::PROJECTIONS;
use crate::arch::Activation;

fn linear(x: &Tensor, l: &LoraLinear) -> Result<Tensor> {
    let y = x.matmul(&l.base.dense()?.t()?)?;
    let y = match &l.bias {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    match &l.lora {
        None => Ok(y),
        Some(a) => y + (x.matmul(&a.lora_a.as_tensor().t()?)?.matmul(&a.lora_b.as_tensor().t()?)? * a.scale)?,
    }
}

fn rope_rotate_half(x: &Tensor, rope: &Rope) -> Result<Tensor> {
    // Read the fused tables back by rotating unit vectors: cos = rope(e0), sin = rope(e_half).
    let (b, h, t, d) = x.dims4()?;
    let half = d / 2;
    let ones = Tensor::ones((1, 1, t, half), x.dtype(), x.device())?;
    let zeros = ones.zeros_like()?;
    let rotated = rope.apply(&Tensor::cat(&[&ones, &zeros], 3)?, 0)?;
    let cos = rotated.narrow(3, 0, half)?;
    let sin = rotated.narrow(3, half, half)?;
    let cos = Tensor::cat(&[&cos, &cos], 3)?.broadcast_as((b, h, t, d))?;
    let sin = Tensor::cat(&[&sin, &sin], 3)?.broadcast_as((b, h, t, d))?;
    let x_rot = Tensor::cat(&[&x.narrow(3, half, half)?.neg()?, &x.narrow(3, 0, half)?], 3)?;
    (x.mul(&cos)? + x_rot.mul(&sin)?)?.contiguous()
}

/// Layer forward for x `[b, t, hidden]`, differentiable end to end.
pub fn layer_forward(layer: &DecoderLayer, x: &Tensor, rope: &Rope, rule: &ScoreRule) -> Result<Tensor> {
    let (b, t, hidden) = x.dims3()?;
    let hd = layer.head_dim;
    let x2 = x.reshape((b * t, hidden))?;
    let eps = layer.rms_norm_eps as f32;
    let n1 = candle_nn::ops::rms_norm_slow(&x2, &layer.input_layernorm, eps)?;
    let heads = |y: Tensor, n: usize| y.reshape((b, t, n, hd))?.transpose(1, 2)?.contiguous();
    // Qwen3's per-head norms of q and k, before RoPE
    let head_norm = |y: Tensor, w: &Option<Tensor>| match w {
        Some(w) => candle_nn::ops::rms_norm_slow(&y.reshape((b * t, (), hd))?, w, eps)?.reshape((b * t, ())),
        None => Ok(y),
    };
    let q = head_norm(linear(&n1, &layer.proj[0])?, &layer.q_norm)?;
    let k = head_norm(linear(&n1, &layer.proj[1])?, &layer.k_norm)?;
    let q = rope_rotate_half(&heads(q, layer.n_heads)?, rope)?;
    let k = rope_rotate_half(&heads(k, layer.n_kv_heads)?, rope)?;
    let v = heads(linear(&n1, &layer.proj[2])?, layer.n_kv_heads)?;
    let n_rep = layer.n_heads / layer.n_kv_heads;
    let (k, v) = (repeat_kv(&k, n_rep)?, repeat_kv(&v, n_rep)?);
    let scores = (q.matmul(&k.t()?)? * rule.scale)?;
    let scores = match rule.softcap {
        Some(cap) => ((scores / cap)?.tanh()? * cap)?,
        None => scores,
    };
    let mask = causal_mask(t, t, 0, rule.window, x.device())?.to_dtype(x.dtype())?;
    let probs = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
    let ctx = probs.matmul(&v)?.transpose(1, 2)?.reshape((b * t, layer.n_heads * hd))?;
    // Gemma's norms of each sublayer's output
    let out_norm = |y: Tensor, w: &Option<Tensor>| match w {
        Some(w) => candle_nn::ops::rms_norm_slow(&y, w, eps),
        None => Ok(y),
    };
    let h1 = (&x2 + out_norm(linear(&ctx, &layer.proj[3])?, &layer.attn_out_norm)?)?;
    let n2 = candle_nn::ops::rms_norm_slow(&h1, &layer.post_attention_layernorm, eps)?;
    let g = linear(&n2, &layer.proj[4])?;
    let gate = match layer.activation {
        Activation::Silu => (&g * candle_nn::ops::sigmoid(&g)?)?,
        Activation::GeluTanh => {
            let inner = ((&g + (g.powf(3.0)? * 0.044715)?)? * (2.0 / std::f64::consts::PI).sqrt())?;
            ((&g * (inner.tanh()? + 1.0)?)? * 0.5)?
        }
    };
    let act = (gate * linear(&n2, &layer.proj[5])?)?;
    (h1 + out_norm(linear(&act, &layer.proj[6])?, &layer.mlp_out_norm)?)?.reshape((b, t, hidden))
}

/// A random layer with LoRA (non-zero B) on every projection.
pub fn random_layer(
    hidden: usize,
    inter: usize,
    heads: usize,
    kv_heads: usize,
    r: usize,
    seed: u64,
) -> DecoderLayer {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dev = candle_core::Device::Cpu;
    let mut rand_t = |shape: (usize, usize), std: f32| {
        let v: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.random_range(-std..std)).collect();
        Tensor::from_vec(v, shape, &dev).unwrap()
    };
    let hd = hidden / heads;
    let dims = [
        (heads * hd, hidden),
        (kv_heads * hd, hidden),
        (kv_heads * hd, hidden),
        (hidden, heads * hd),
        (inter, hidden),
        (inter, hidden),
        (hidden, inter),
    ];
    // q, k and v biased (Qwen2's layout), so the oracle checks the bias path too
    let proj: Vec<LoraLinear> = dims
        .iter()
        .enumerate()
        .map(|(p, &(o, i))| LoraLinear {
            base: BaseWeight::Dense(rand_t((o, i), 0.2)),
            bias: (p < 3).then(|| rand_t((o, 1), 0.2).flatten_all().unwrap()),
            lora: Some(LoraAdapter {
                lora_a: Var::from_tensor(&rand_t((r, i), 0.3)).unwrap(),
                lora_b: Var::from_tensor(&rand_t((o, r), 0.3)).unwrap(),
                scale: 2.0,
                dropout: 0.0,
            }),
        })
        .collect();
    let norm = |t: Tensor| (t + 1.0).unwrap().flatten_all().unwrap();
    DecoderLayer {
        input_layernorm: norm(rand_t((1, hidden), 0.3)),
        post_attention_layernorm: norm(rand_t((1, hidden), 0.3)),
        attn_out_norm: None,
        mlp_out_norm: None,
        activation: Activation::Silu,
        q_norm: None,
        k_norm: None,
        proj: proj.try_into().unwrap(),
        n_heads: heads,
        n_kv_heads: kv_heads,
        head_dim: hd,
        rms_norm_eps: 1e-5,
    }
}

/// The projection with its weights in f64 (fresh `Var`s for the adapter): what the oracle runs
/// on for the exact answer of a test (`crate::testing`).
#[cfg(test)]
pub(crate) fn linear_f64(l: &LoraLinear) -> LoraLinear {
    let f64 = |t: &Tensor| t.to_dtype(candle_core::DType::F64).unwrap();
    LoraLinear {
        base: BaseWeight::Dense(f64(&l.base.dense().unwrap())),
        bias: l.bias.as_ref().map(f64),
        lora: l.lora.as_ref().map(|a| LoraAdapter {
            lora_a: Var::from_tensor(&f64(a.lora_a.as_tensor())).unwrap(),
            lora_b: Var::from_tensor(&f64(a.lora_b.as_tensor())).unwrap(),
            ..a.clone()
        }),
    }
}

/// The layer with every weight in f64 (see `linear_f64`).
#[cfg(test)]
pub(crate) fn layer_f64(layer: &DecoderLayer) -> DecoderLayer {
    let f64 = |t: &Tensor| t.to_dtype(candle_core::DType::F64).unwrap();
    DecoderLayer {
        input_layernorm: f64(&layer.input_layernorm),
        post_attention_layernorm: f64(&layer.post_attention_layernorm),
        q_norm: layer.q_norm.as_ref().map(f64),
        k_norm: layer.k_norm.as_ref().map(f64),
        attn_out_norm: layer.attn_out_norm.as_ref().map(f64),
        mlp_out_norm: layer.mlp_out_norm.as_ref().map(f64),
        proj: layer.proj.clone().map(|p| linear_f64(&p)),
        ..layer.clone()
    }
}

/// The formula LoRA weights of the SmolLM2 golden case (parity_cases.json): for layer l and
/// module m, A[i, j] = 0.02 sin(0.37i + 0.11j + 1.3l + m + 1), B[i, j] = 0.02 cos(0.23i + 0.17j
/// + 0.7l + m + 2), in f64 then rounded to f32. Also the adapter of the PEFT loading test.
pub fn set_formula_lora(model: &CausalLm) -> Result<()> {
    for (key, var) in model.lora_params() {
        let l: f64 = layer_of(&key);
        let m = PROJECTIONS.iter().position(|p| key.contains(&format!(".{p}."))).unwrap_or(0) as f64;
        let (rows, cols) = var.dims2()?;
        let is_a = key.contains("lora_A");
        let values: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let (i, j) = ((k / cols) as f64, (k % cols) as f64);
                let v = if is_a {
                    0.02 * (0.37 * i + 0.11 * j + 1.3 * l + m + 1.0).sin()
                } else {
                    0.02 * (0.23 * i + 0.17 * j + 0.7 * l + m + 2.0).cos()
                };
                v as f32
            })
            .collect();
        var.set(&Tensor::from_vec(values, (rows, cols), var.device())?)?;
    }
    Ok(())
}

fn layer_of(key: &str) -> f64 {
    let n = key.split("layers.").nth(1).and_then(|s| s.split('.').next());
    n.and_then(|n| n.parse().ok()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layer::LayerInput;
    use crate::model::lora::linear::LoraGrad;
    use crate::testing::assert_within_reference_error;
    use candle_core::{DType, Device};

    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        d / b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-12)
    }

    fn check_layer(window: Option<usize>, kv_heads: usize) {
        check_layer_of(random_layer(32, 48, 4, kv_heads, 3, 7), &ScoreRule::causal(8, window))
    }

    fn check_layer_of(layer: DecoderLayer, rule: &ScoreRule) {
        let window = rule.window;
        let dev = Device::Cpu;
        let rope = Rope::new(8, 10000.0, 64, DType::F32, &dev).unwrap();
        let (b, t) = (2, 9);
        let x = Tensor::randn(0f32, 1.0, (b, t, 32), &dev).unwrap();
        let d_out = Tensor::randn(0f32, 1.0, (b, t, 32), &dev).unwrap();
        let mask = causal_mask(t, t, 0, window, &dev).unwrap();
        let input = LayerInput {
            rope: &rope,
            mask: Some(&mask),
            offset: 0,
            scores: *rule,
            dropout_seed: None,
            packed: None,
            mlp_tile_values: crate::model::layer::tiles::MLP_TILE_VALUES,
        };

        let (out, saved) = layer.forward_saving(&x, &input).unwrap();
        // the cheap forward gives the same output
        assert_eq!(max_rel(&layer.forward(&x, &input, None).unwrap(), &out), 0.0);
        let (dx, grads) = layer.backward(saved, &d_out, &input).unwrap();
        // a layer that keeps n1, n2 and act too gives the lean one's gradients
        let (out_all, saved_all) = layer.forward_saving_all(&x, &input).unwrap();
        assert_eq!(max_rel(&out_all, &out), 0.0);
        let (dx_all, grads_all) = layer.backward(saved_all, &d_out, &input).unwrap();
        assert_eq!(max_rel(&dx_all, &dx), 0.0);
        for (all, g) in grads_all.iter().zip(grads.iter()) {
            let (all, g) = (all.as_ref().unwrap(), g.as_ref().unwrap());
            assert_eq!(max_rel(&all.lora_a, &g.lora_a), 0.0);
            assert_eq!(max_rel(&all.lora_b, &g.lora_b), 0.0);
        }
        // the training recompute skips the output but keeps the same activations
        let (dx_re, grads_re) = layer.backward(layer.recompute(&x, &input).unwrap(), &d_out, &input).unwrap();
        assert_eq!(max_rel(&dx_re, &dx), 0.0);
        for (re, g) in grads_re.iter().zip(grads.iter()) {
            let (re, g) = (re.as_ref().unwrap(), g.as_ref().unwrap());
            assert_eq!(max_rel(&re.lora_a, &g.lora_a), 0.0);
            assert_eq!(max_rel(&re.lora_b, &g.lora_b), 0.0);
        }

        let xv = Var::from_tensor(&x).unwrap();
        let out_ref = layer_forward(&layer, xv.as_tensor(), &rope, rule).unwrap();
        // The oracle again in f64 on the same values: the exact answer. The f64 rope's tables are
        // the f32 ones (computed in f32, then cast); everything else keeps the inputs' dtype.
        let layer64 = layer_f64(&layer);
        let rope64 = Rope::new(8, 10000.0, 64, DType::F64, &dev).unwrap();
        let xv64 = Var::from_tensor(&x.to_dtype(DType::F64).unwrap()).unwrap();
        let out_exact = layer_forward(&layer64, xv64.as_tensor(), &rope64, rule).unwrap();
        assert_within_reference_error("layer forward", &out, &out_ref, &out_exact);
        let g = (&out_ref * &d_out).unwrap().sum_all().unwrap().backward().unwrap();
        let d_out64 = d_out.to_dtype(DType::F64).unwrap();
        let g64 = (&out_exact * &d_out64).unwrap().sum_all().unwrap().backward().unwrap();
        let dx_ref = g.get(xv.as_tensor()).unwrap();
        let dx_exact = g64.get(xv64.as_tensor()).unwrap();
        let check_grads = |how: &str, dx: &Tensor, grads: &[Option<LoraGrad>; 7]| {
            assert_within_reference_error(&format!("{how} layer dx"), dx, dx_ref, dx_exact);
            for (p, grad) in grads.iter().enumerate() {
                let (lora, lora64) =
                    (layer.proj[p].lora.as_ref().unwrap(), layer64.proj[p].lora.as_ref().unwrap());
                let grad = grad.as_ref().unwrap();
                let ga = g.get(lora.lora_a.as_tensor()).unwrap();
                let gb = g.get(lora.lora_b.as_tensor()).unwrap();
                let ga64 = g64.get(lora64.lora_a.as_tensor()).unwrap();
                let gb64 = g64.get(lora64.lora_b.as_tensor()).unwrap();
                assert_within_reference_error(&format!("{how} proj {p} A"), &grad.lora_a, ga, ga64);
                assert_within_reference_error(&format!("{how} proj {p} B"), &grad.lora_b, gb, gb64);
            }
        };
        check_grads("untiled", &dx, &grads);

        // the MLP in row tiles (4, 4, 4, 4 and 2 of the 18 rows): the forward and, from a
        // recompute that stops at n2, the backward give the same answers up to rounding
        let tiled = LayerInput { mlp_tile_values: 4 * 48, ..input };
        assert_eq!(layer.mlp_tile_rows(b * t, &tiled), Some(4));
        let out_tiled = layer.forward(&x, &tiled, None).unwrap();
        assert_within_reference_error("tiled layer forward", &out_tiled, &out_ref, &out_exact);
        let (dx_tiled, grads_tiled) =
            layer.backward(layer.recompute(&x, &tiled).unwrap(), &d_out, &tiled).unwrap();
        check_grads("tiled", &dx_tiled, &grads_tiled);
    }

    #[test]
    fn layer_backward_matches_autograd_mha() {
        check_layer(None, 4);
    }

    #[test]
    fn layer_backward_matches_autograd_gqa_sliding_window() {
        check_layer(Some(4), 2);
    }

    /// Qwen3's per-head RMSNorm of q and k (weights away from 1) in the forward and backward.
    #[test]
    fn layer_backward_matches_autograd_with_q_and_k_norms() {
        let mut layer = random_layer(32, 48, 4, 2, 3, 11);
        let hd = layer.head_dim;
        let ramp = Tensor::arange(0u32, hd as u32, &Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
        layer.q_norm = Some(((&ramp * 0.05).unwrap() + 0.8).unwrap());
        layer.k_norm = Some(((&ramp * -0.04).unwrap() + 1.1).unwrap());
        check_layer_of(layer, &ScoreRule::causal(hd, None));
    }

    /// Gemma's layer: norms of the attention and MLP outputs, GeGLU, q/k norms, a query scale
    /// of its own, soft-capped scores (tight enough to bend them) and a window.
    #[test]
    fn layer_backward_matches_autograd_gemma() {
        let mut layer = random_layer(32, 48, 4, 2, 3, 13);
        let hd = layer.head_dim;
        let ramp = |n: usize, slope: f64, at: f64| {
            let r = Tensor::arange(0u32, n as u32, &Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
            ((r * slope).unwrap() + at).unwrap()
        };
        layer.attn_out_norm = Some(ramp(32, 0.02, 0.7));
        layer.mlp_out_norm = Some(ramp(32, -0.015, 1.2));
        layer.q_norm = Some(ramp(hd, 0.05, 0.8));
        layer.k_norm = Some(ramp(hd, -0.04, 1.1));
        layer.activation = Activation::GeluTanh;
        check_layer_of(layer, &ScoreRule { scale: 0.45, softcap: Some(1.0), window: Some(5) });
    }

    #[test]
    fn dropout_masks_are_reproduced_in_the_recompute() {
        // The backward regenerates each mask from its seed: the checkpointed forward and the
        // saving forward must agree exactly.
        let dev = Device::Cpu;
        let mut layer = random_layer(32, 48, 4, 2, 3, 9);
        for p in layer.proj.iter_mut() {
            p.lora.as_mut().unwrap().dropout = 0.3;
        }
        let rope = Rope::new(8, 10000.0, 64, DType::F32, &dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (1, 6, 32), &dev).unwrap();
        let mask = causal_mask(6, 6, 0, None, &dev).unwrap();
        let scores = ScoreRule::causal(8, None);
        let input = LayerInput {
            rope: &rope,
            mask: Some(&mask),
            offset: 0,
            scores,
            dropout_seed: Some(11),
            packed: None,
            mlp_tile_values: crate::model::layer::tiles::MLP_TILE_VALUES,
        };
        let eval = LayerInput { dropout_seed: None, ..input };
        let a = layer.forward(&x, &input, None).unwrap();
        let (b, _) = layer.forward_saving(&x, &input).unwrap();
        let c = layer.forward(&x, &eval, None).unwrap();
        assert_eq!(max_rel(&a, &b), 0.0);
        assert!(max_rel(&a, &c) > 1e-3, "dropout changed nothing");

        // the MLP in tiles of 3 rows draws the whole rows' masks: the same output and gradients
        // up to rounding (the exact answer: the untiled layer in f64, its softmax in f32 as our
        // attention computes it)
        let tiled = LayerInput { mlp_tile_values: 3 * 48, ..input };
        let (layer64, rope64) = (layer_f64(&layer), Rope::new(8, 10000.0, 64, DType::F64, &dev).unwrap());
        let input64 = LayerInput { rope: &rope64, ..input };
        let (x64, d_out) =
            (x.to_dtype(DType::F64).unwrap(), Tensor::randn(0f32, 1.0, (1, 6, 32), &dev).unwrap());
        let exact = layer64.forward(&x64, &input64, None).unwrap();
        assert_within_reference_error(
            "tiled dropout forward",
            &layer.forward(&x, &tiled, None).unwrap(),
            &a,
            &exact,
        );
        let backward = |l: &DecoderLayer, x: &Tensor, d: &Tensor, input: &LayerInput| {
            l.backward(l.recompute(x, input).unwrap(), d, input).unwrap()
        };
        let (dx, grads) = backward(&layer, &x, &d_out, &input);
        let (dx_tiled, grads_tiled) = backward(&layer, &x, &d_out, &tiled);
        let (dx64, grads64) = backward(&layer64, &x64, &d_out.to_dtype(DType::F64).unwrap(), &input64);
        assert_within_reference_error("tiled dropout dx", &dx_tiled, &dx, &dx64);
        for p in 0..7 {
            let (t, u, e) = (grads_tiled[p].as_ref(), grads[p].as_ref(), grads64[p].as_ref());
            let (t, u, e) = (t.unwrap(), u.unwrap(), e.unwrap());
            assert_within_reference_error(&format!("tiled dropout {p} A"), &t.lora_a, &u.lora_a, &e.lora_a);
            assert_within_reference_error(&format!("tiled dropout {p} B"), &t.lora_b, &u.lora_b, &e.lora_b);
        }
    }
}
