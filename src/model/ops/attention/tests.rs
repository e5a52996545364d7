//! The attention op against autograd, and its CUDA kernels against the CPU.

use super::*;
use crate::testing::assert_within_reference_error;
use candle_core::{Var, D};

#[cfg(feature = "cuda")]
fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    d / b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
}

/// The unchunked formula in composed candle ops, in the inputs' dtype throughout (candle's
/// softmax keeps f64): the reference, and in f64 its exact answer.
fn unchunked(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, n_rep: usize, rule: &ScoreRule) -> Tensor {
    let (kr, vr) = (repeat_kv(k, n_rep).unwrap(), repeat_kv(v, n_rep).unwrap());
    let scores = (q.matmul(&kr.t().unwrap()).unwrap() * rule.scale).unwrap();
    let scores = match rule.softcap {
        Some(cap) => ((scores / cap).unwrap().tanh().unwrap() * cap).unwrap(),
        None => scores,
    };
    let mask = mask.to_dtype(scores.dtype()).unwrap();
    let probs = candle_nn::ops::softmax(&scores.broadcast_add(&mask).unwrap(), D::Minus1).unwrap();
    probs.matmul(&vr).unwrap()
}

/// Across several query chunks (t > QUERY_CHUNK), GQA and a sliding window: the chunked forward
/// and the recomputing backward equal candle's autograd through the unchunked formula; plain,
/// and with Gemma's own query scale and Gemma 2's soft cap (tight enough to bend the scores).
#[test]
fn chunked_attention_and_backward_match_autograd() {
    let d = 8;
    chunked_attention_case(&ScoreRule::causal(d, Some(300)));
    chunked_attention_case(&ScoreRule { scale: 0.3, softcap: Some(1.5), window: Some(300) });
}

fn chunked_attention_case(rule: &ScoreRule) {
    let (b, h, kv, t, d) = (1, 4, 2, QUERY_CHUNK + 100, 8);
    let dev = Device::Cpu;
    let q = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap()).unwrap();
    let k = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, kv, t, d), &dev).unwrap()).unwrap();
    let v = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, kv, t, d), &dev).unwrap()).unwrap();
    let mask = causal_mask(t, t, 0, Some(300), &dev).unwrap();
    let d_ctx = Tensor::randn(0f32, 1.0, (b, h, t, d), &dev).unwrap();

    let reference = unchunked(q.as_tensor(), k.as_tensor(), v.as_tensor(), &mask, 2, rule);
    let grads = (&reference * &d_ctx).unwrap().sum_all().unwrap().backward().unwrap();
    // the same in f64: the exact answer
    let f64 = |x: &Tensor| Var::from_tensor(&x.to_dtype(DType::F64).unwrap()).unwrap();
    let (q64, k64, v64) = (f64(&q), f64(&k), f64(&v));
    let exact = unchunked(q64.as_tensor(), k64.as_tensor(), v64.as_tensor(), &mask, 2, rule);
    let d_ctx64 = d_ctx.to_dtype(DType::F64).unwrap();
    let grads64 = (&exact * &d_ctx64).unwrap().sum_all().unwrap().backward().unwrap();

    let (ctx, saved) = attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), Some(&mask), rule).unwrap();
    assert_within_reference_error("attention forward", &ctx, &reference, &exact);
    let (dq, dk, dv) =
        attention_backward(q.as_tensor(), k.as_tensor(), v.as_tensor(), None, rule, &saved, &d_ctx).unwrap();
    for (name, ours, var, var64) in [("dq", &dq, &q, &q64), ("dk", &dk, &k, &k64), ("dv", &dv, &v, &v64)] {
        let want = grads.get(var.as_tensor()).unwrap();
        let exact = grads64.get(var64.as_tensor()).unwrap();
        assert_within_reference_error(&format!("attention {name} {rule:?}"), ours, want, exact);
    }
}

/// The CPU's fused path against autograd through the unchunked formula with the mask, in f32
/// (the reference) and in f64 (the exact answer), forward and backward: GQA, fewer queries than
/// keys (a KV cache), windows that cut and one that does not, blocks that straddle the spans,
/// packed rows with their padding span, and q, k, v and d(context) as views of `[b, t, h, d]`
/// memory, as a layer hands them over.
#[test]
fn cpu_fused_attention_matches_autograd() {
    let dev = Device::Cpu;
    let d = 16;
    let rand = |shape: (usize, usize, usize, usize), seed: u64| {
        let (b, n, t, d) = shape;
        let values = crate::model::ops::test_util::randn(&[b, t, n, d], seed);
        values.transpose(1, 2).unwrap() // a [b, n, t, d] view, as the projections lay heads out
    };
    // (packed rows' dialogue lengths, or none: plain causal rows; t; s)
    type Rows<'a> = (Option<&'a [&'a [usize]]>, usize, usize);
    let rows: [Rows; 5] = [
        (None, 150, 150),
        (None, 37, 200),
        (None, 1, 90),
        (Some(&[&[1, 7, 33, 70, 19], &[130]]), 130, 130),
        (Some(&[&[100, 9], &[64, 64, 2]]), 130, 130),
    ];
    for (lens, t, s) in rows {
        for window in [None, Some(20), Some(1000)] {
            let rule = ScoreRule::causal(d, window);
            let b = lens.map_or(2, |l| l.len());
            let (h, kv) = (6, 2);
            let (q, k, v) = (rand((b, h, t, d), 1), rand((b, kv, s, d), 2), rand((b, kv, s, d), 3));
            let dc = rand((b, h, t, d), 4);
            let lens: Option<Vec<Vec<usize>>> = lens.map(|l| l.iter().map(|r| r.to_vec()).collect());
            let packed = lens.as_ref().map(|l| PackedRows::new(l, t, &dev).unwrap());
            let mask = match &packed {
                Some(p) => p.mask(window, &dev).unwrap(),
                None => causal_mask(t, s, s - t, window, &dev).unwrap(),
            };
            let visible = (Some(&mask), packed.as_ref());
            let (ctx, saved) = attention_packed(&q, &k, &v, visible, &rule).unwrap();
            assert_eq!(saved.kernel_name(), "cpu");
            let grads = attention_backward_packed((&q, &k, &v), visible, &rule, &saved, &dc).unwrap();
            // the formula and its autograd, in f32 and in f64
            let reference = |dtype: DType| {
                let var =
                    |x: &Tensor| Var::from_tensor(&x.to_dtype(dtype).unwrap().contiguous().unwrap()).unwrap();
                let (q, k, v) = (var(&q), var(&k), var(&v));
                let out = unchunked(q.as_tensor(), k.as_tensor(), v.as_tensor(), &mask, h / kv, &rule);
                let dc = dc.to_dtype(dtype).unwrap().contiguous().unwrap();
                let g = (&out * &dc).unwrap().sum_all().unwrap().backward().unwrap();
                let grad = |x: &Var| g.get(x.as_tensor()).unwrap().clone();
                (out, [grad(&q), grad(&k), grad(&v)])
            };
            let ((want, want_grads), (exact, exact_grads)) = (reference(DType::F32), reference(DType::F64));
            let what = |name: &str| format!("{name}: t {t} s {s} {window:?} packed {}", packed.is_some());
            assert_within_reference_error(&what("context"), &ctx, &want, &exact);
            let ours = [&grads.0, &grads.1, &grads.2];
            for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
                assert_eq!(ours[i].dims(), want_grads[i].dims(), "{name}");
                assert_within_reference_error(&what(name), ours[i], &want_grads[i], &exact_grads[i]);
            }
        }
    }
}

#[test]
fn sliding_window_mask_matches_hf_rule() {
    let m = causal_mask(4, 4, 0, Some(2), &Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
    let visible: Vec<Vec<bool>> = m.iter().map(|r| r.iter().map(|v| v.is_finite()).collect()).collect();
    assert_eq!(
        visible,
        vec![
            vec![true, false, false, false],
            vec![true, true, false, false],
            vec![false, true, true, false],
            vec![false, false, true, true],
        ]
    );
    // With a cache: query at position 5 sees keys 4 and 5 only.
    let m = causal_mask(1, 6, 5, Some(2), &Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
    let seen: Vec<usize> = (0..6).filter(|&j| m[0][j].is_finite()).collect();
    assert_eq!(seen, vec![4, 5]);
}

/// The CUDA paths against the composed ops on the CPU: the flash kernels and cuDNN's SDPA
/// (f16, bf16; head_dim 64, 128 and 256, soft caps) and the fused softmax (f32), forward and
/// backward, over rows that are not a multiple of the tiles, GQA, a sliding window that cuts and
/// one that does not, and fewer queries than keys (a KV cache). With `LORA_FT_TEST_NEEDS_CUDNN=1` (the
/// device scripts) cuDNN must have loaded and taken the training-shaped cases.
#[cfg(feature = "cuda")]
#[test]
fn cuda_attention_matches_the_composed_cpu_path() {
    use crate::cuda::cudnn_sdpa::{self, Mode};
    let needs_cudnn = std::env::var("LORA_FT_TEST_NEEDS_CUDNN").is_ok_and(|v| v == "1");
    for mode in [Mode::Flash, Mode::Auto] {
        cudnn_sdpa::set_mode(mode);
        cuda_attention_cases(mode == Mode::Auto && needs_cudnn);
    }
    cudnn_sdpa::set_mode(Mode::Auto);
}

#[cfg(feature = "cuda")]
fn cuda_attention_cases(needs_cudnn: bool) {
    let gpu = Device::new_cuda(0).unwrap();
    let cpu = Device::Cpu;
    let rand = |shape: (usize, usize, usize, usize)| Tensor::randn(0f32, 1.0, shape, &cpu).unwrap();
    // Gemma's head_dim 256 with its query scale, windows that cut, and Gemma 2's soft cap (at 50,
    // as Gemma 2 has it, and at 1, where it bends the scores hard): cuDNN takes them all in
    // `auto` mode; in `flash` mode d = 256 and the soft caps take the composed path
    let gemma = |window, softcap| ScoreRule { scale: 1.0 / 144f64.sqrt(), softcap, window };
    let cases = [
        (64, QUERY_CHUNK + 300, QUERY_CHUNK + 300, ScoreRule::causal(64, Some(400))),
        (128, 300, 300, ScoreRule::causal(128, None)),
        (64, 200, 200, ScoreRule::causal(64, Some(1000))),
        (128, 37, 300, ScoreRule::causal(128, Some(100))),
        (256, 300, 300, gemma(Some(100), None)),
        (256, 300, 300, gemma(None, None)),
        (128, 300, 300, gemma(None, None)),
        (128, 300, 300, gemma(Some(200), Some(50.0))),
        (256, 300, 300, gemma(None, Some(1.0))),
        (64, 300, 300, gemma(Some(100), Some(1.0))),
    ];
    for (d, t, s, rule) in cases {
        let window = rule.window;
        let (b, h, kv) = (2, 8, 2);
        let (q, k, v, dc) =
            (rand((b, h, t, d)), rand((b, kv, s, d)), rand((b, kv, s, d)), rand((b, h, t, d)));
        let (want, saved) = attention(&q, &k, &v, None, &rule).unwrap();
        let (wq, wk, wv) = attention_backward(&q, &k, &v, None, &rule, &saved, &dc).unwrap();
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-2), (DType::BF16, 5e-2)] {
            let on_gpu = |x: &Tensor| x.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
            let (gq, gk, gv) = (on_gpu(&q), on_gpu(&k), on_gpu(&v));
            let (ctx, saved) = attention(&gq, &gk, &gv, None, &rule).unwrap();
            let on_cudnn = matches!(saved.kernel, Some(KernelSaved::Cudnn { .. }));
            let training_shape = t == s;
            if dtype != DType::F32 && needs_cudnn {
                assert_eq!(on_cudnn, training_shape, "d {d} t {t} s {s} {window:?}: cuDNN taken {on_cudnn}");
            }
            let (dq, dk, dv) = attention_backward(&gq, &gk, &gv, None, &rule, &saved, &on_gpu(&dc)).unwrap();
            if on_cudnn {
                // this shape's forward and backward graphs at least were built, and timed
                let (graphs, seconds) = super::graph_builds();
                assert!(graphs >= 2 && seconds > 0.0, "cuDNN graph builds counted: {graphs} in {seconds} s");
            }
            let check = |name: &str, ours: &Tensor, reference: &Tensor| {
                let ours = ours.to_dtype(DType::F32).unwrap().to_device(&cpu).unwrap();
                let err = max_rel(&ours, reference);
                println!("d {d} t {t} s {s} {dtype:?} cudnn {on_cudnn} {name}: {err:.2e}");
                assert!(err < tol, "d {d} t {t} s {s} {dtype:?} {name}: {err}");
            };
            for (name, ours, reference) in
                [("context", ctx, &want), ("dq", dq, &wq), ("dk", dk, &wk), ("dv", dv, &wv)]
            {
                check(name, &ours, reference);
            }
            // both shapes of the backward kernel, whichever this GPU picks by default (called
            // directly, so only where q needs no factor)
            let plain_scale = rule == ScoreRule { window, ..ScoreRule::causal(d, None) };
            if let (Some(KernelSaved::Flash { context, lse }), true) = (&saved.kernel, plain_scale) {
                let dc = on_gpu(&dc);
                for shape in crate::cuda::flash::BackwardShape::ALL {
                    let (dq, dk, dv) = crate::cuda::flash::backward(
                        &gq,
                        &gk,
                        &gv,
                        context,
                        lse,
                        &dc,
                        (window, None),
                        Some(shape),
                    )
                    .unwrap();
                    for (name, ours, reference) in [("dq", dq, &wq), ("dk", dk, &wk), ("dv", dv, &wv)] {
                        check(&format!("{shape:?} {name}"), &ours, reference);
                    }
                }
            }
        }
    }
}

/// Packed rows through the flash kernels (`LORA_FT_ATTENTION=flash`) against the composed ops
/// on the CPU with `PackedRows`' mask: spans of 1, 7, 33 and 100 tokens and longer ones across
/// the kernels' 128-row and 32/64/128-key blocks, the padding span at a row's end, a row of one
/// sequence, GQA, no window, a window that cuts inside the spans and one that does not; forward
/// and both shapes of the backward. The kernels must have taken every packed call.
#[cfg(feature = "cuda")]
#[test]
fn cuda_flash_takes_packed_rows_like_the_composed_cpu_path() {
    use crate::cuda::cudnn_sdpa::{self, Mode};
    use crate::cuda::flash::{self, BackwardShape};
    let gpu = Device::new_cuda(0).unwrap();
    let cpu = Device::Cpu;
    let rand = |shape: (usize, usize, usize, usize)| Tensor::randn(0f32, 1.0, shape, &cpu).unwrap();
    cudnn_sdpa::set_mode(Mode::Flash);
    let rows: [(&[&[usize]], usize); 3] = [
        // a row of short spans and padding, a row of one sequence
        (&[&[1, 7, 33, 100, 17], &[200]], 200),
        // spans that straddle every block boundary; 3 tokens of padding
        (&[&[150, 1, 7, 33, 100], &[33, 7, 1, 250]], 294),
        // a long span after many short ones: whole key blocks skipped both ways
        (&[&[7, 7, 7, 7, 7, 7, 33, 33, 1, 1, 400]], 520),
    ];
    for (lens, t) in rows {
        let lens: Vec<Vec<usize>> = lens.iter().map(|l| l.to_vec()).collect();
        let (on_cpu, on_gpu_rows) =
            (PackedRows::new(&lens, t, &cpu).unwrap(), PackedRows::new(&lens, t, &gpu).unwrap());
        for (d, window) in [(64, None), (128, Some(20)), (64, Some(1000)), (128, None), (64, Some(5))] {
            let rule = ScoreRule::causal(d, window);
            let (b, h, kv) = (lens.len(), 8, 2);
            let (q, k, v, dc) =
                (rand((b, h, t, d)), rand((b, kv, t, d)), rand((b, kv, t, d)), rand((b, h, t, d)));
            let mask = on_cpu.mask(window, &cpu).unwrap();
            let packed = (Some(&mask), Some(&on_cpu));
            let (want, saved) = attention_packed(&q, &k, &v, packed, &rule).unwrap();
            let (wq, wk, wv) = attention_backward_packed((&q, &k, &v), packed, &rule, &saved, &dc).unwrap();
            for (dtype, tol) in [(DType::F16, 2e-2), (DType::BF16, 5e-2)] {
                let on_gpu = |x: &Tensor| x.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
                let (gq, gk, gv, gdc) = (on_gpu(&q), on_gpu(&k), on_gpu(&v), on_gpu(&dc));
                let launches = flash::packed_launches();
                let packed = (None, Some(&on_gpu_rows));
                let (ctx, saved) = attention_packed(&gq, &gk, &gv, packed, &rule).unwrap();
                assert_eq!(saved.kernel_name(), "flash", "t {t} d {d} {window:?}");
                let (dq, dk, dv) =
                    attention_backward_packed((&gq, &gk, &gv), packed, &rule, &saved, &gdc).unwrap();
                assert_eq!(flash::packed_launches(), (launches.0 + 1, launches.1 + 1), "both took the spans");
                let check = |name: &str, ours: &Tensor, reference: &Tensor| {
                    let ours = ours.to_dtype(DType::F32).unwrap().to_device(&cpu).unwrap();
                    let err = max_rel(&ours, reference);
                    println!("packed t {t} d {d} {window:?} {dtype:?} {name}: {err:.2e}");
                    assert!(err < tol, "packed t {t} d {d} {window:?} {dtype:?} {name}: {err}");
                };
                for (name, ours, reference) in
                    [("context", ctx, &want), ("dq", dq, &wq), ("dk", dk, &wk), ("dv", dv, &wv)]
                {
                    check(name, &ours, reference);
                }
                let Some(KernelSaved::Flash { context, lse }) = &saved.kernel else { unreachable!() };
                let spans = on_gpu_rows.token_spans(&gpu).unwrap();
                for shape in BackwardShape::ALL {
                    let (dq, dk, dv) = flash::backward(
                        &gq,
                        &gk,
                        &gv,
                        context,
                        lse,
                        &gdc,
                        (window, Some(&spans)),
                        Some(shape),
                    )
                    .unwrap();
                    for (name, ours, reference) in [("dq", dq, &wq), ("dk", dk, &wk), ("dv", dv, &wv)] {
                        check(&format!("{shape:?} {name}"), &ours, reference);
                    }
                }
            }
        }
    }
    cudnn_sdpa::set_mode(Mode::Auto);
}

/// Spans that do not fit the call are an error, not a read past the tensor.
#[cfg(feature = "cuda")]
#[test]
fn cuda_flash_refuses_spans_of_another_shape() {
    let gpu = Device::new_cuda(0).unwrap();
    let x = Tensor::zeros((1, 2, 16, 64), DType::F16, &gpu).unwrap();
    let rows = PackedRows::new(&[vec![8, 8]], 16, &gpu).unwrap();
    let short = PackedRows::new(&[vec![8]], 8, &gpu).unwrap();
    assert!(crate::cuda::flash::forward(&x, &x, &x, None, Some(&rows.token_spans(&gpu).unwrap())).is_ok());
    let err = crate::cuda::flash::forward(&x, &x, &x, None, Some(&short.token_spans(&gpu).unwrap()));
    assert!(err.unwrap_err().to_string().contains("spans"));
    let fewer_queries = x.narrow(2, 8, 8).unwrap();
    let err =
        crate::cuda::flash::forward(&fewer_queries, &x, &x, None, Some(&rows.token_spans(&gpu).unwrap()));
    assert!(err.is_err(), "packed rows have as many queries as keys");
}

/// The speed packed rows buy (`--ignored`, on the GPU): rows of 4096 tokens, 32 query heads of
/// 128 over 8 kv heads in bf16, forward and backward through the flash kernels, once as one
/// sequence a row and once packed with dialogues of 200 tokens. Causal attention over a whole row
/// costs ~t²/2 per row, over its dialogues ~t·200/2: the kernels skip the blocks between
/// dialogues, so the packed rows must take well under a third of the time.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "timing, on the GPU"]
fn cuda_flash_packed_rows_skip_the_blocks_between_dialogues() {
    use crate::cuda::cudnn_sdpa::{self, Mode};
    use std::time::Instant;
    let gpu = Device::new_cuda(0).unwrap();
    let (b, h, kv, t, d) = (4, 32, 8, 4096, 128);
    let rand = |shape: (usize, usize, usize, usize)| {
        Tensor::randn(0f32, 1.0, shape, &gpu).unwrap().to_dtype(DType::BF16).unwrap()
    };
    let (q, k, v, dc) = (rand((b, h, t, d)), rand((b, kv, t, d)), rand((b, kv, t, d)), rand((b, h, t, d)));
    let rule = ScoreRule::causal(d, None);
    let dialogues = vec![vec![200; t / 200]; b];
    let rows = PackedRows::new(&dialogues, t, &gpu).unwrap();
    cudnn_sdpa::set_mode(Mode::Flash);
    let time = |packed: Option<&PackedRows>| {
        let step = || {
            let (_, saved) = attention_packed(&q, &k, &v, (None, packed), &rule).unwrap();
            assert_eq!(saved.kernel_name(), "flash");
            attention_backward_packed((&q, &k, &v), (None, packed), &rule, &saved, &dc).unwrap();
        };
        step();
        gpu.synchronize().unwrap();
        let start = Instant::now();
        for _ in 0..10 {
            step();
        }
        gpu.synchronize().unwrap();
        start.elapsed().as_secs_f64() / 10.0
    };
    let (whole, packed) = (time(None), time(Some(&rows)));
    cudnn_sdpa::set_mode(Mode::Auto);
    println!(
        "forward + backward, {b} x {t} tokens: one sequence a row {:.2} ms, packed {:.2} ms",
        whole * 1e3,
        packed * 1e3
    );
    assert!(packed < whole / 3.0, "packed rows {packed:.4} s, whole rows {whole:.4} s");
}
