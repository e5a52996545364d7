//! The decode step's kernels on the GPU: flash decoding against the attention in f64 and the
//! training attention, the fused RoPE and KV write against the composed path.

use candle_core::{DType, Device, Tensor, D};

use super::*;
use crate::model::ops::attention::{attention_packed, ScoreRule};
use crate::testing::{assert_within_reference_error, rel_err};

/// Row r's context in f64 on the CPU: its query against positions `first..len` of its slot.
fn exact(q: &Tensor, k: &Tensor, v: &Tensor, (slot, len): (usize, usize), rule: &ScoreRule) -> Tensor {
    let f64 = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap();
    let (q, k, v) = (f64(q), f64(k), f64(v));
    let (heads, d) = q.dims2().unwrap();
    let kv = k.dim(2).unwrap();
    let first = rule.window.map_or(0, |w| len.saturating_sub(w));
    let keys = |x: &Tensor| x.get(slot).unwrap().narrow(0, first, len - first).unwrap();
    let (k, v) = (keys(&k), keys(&v)); // [n, kv, d]
    let rows: Vec<Tensor> = (0..heads)
        .map(|h| {
            let g = h / (heads / kv);
            let kh = k.narrow(1, g, 1).unwrap().squeeze(1).unwrap(); // [n, d]
            let vh = v.narrow(1, g, 1).unwrap().squeeze(1).unwrap();
            let qh = q.get(h).unwrap().reshape((1, d)).unwrap();
            let mut s = (qh.matmul(&kh.t().unwrap()).unwrap() * rule.scale).unwrap();
            if let Some(cap) = rule.softcap {
                s = ((s / cap).unwrap().tanh().unwrap() * cap).unwrap();
            }
            let p = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
            p.matmul(&vh).unwrap().squeeze(0).unwrap()
        })
        .collect();
    Tensor::stack(&rows, 0).unwrap()
}

/// The launch's shape: GQA groups as the kernel's G (a power of two, at most 8, more
/// blocks a kv head past 8), splits for two blocks a multiprocessor (or the number asked), at
/// least 32 positions of the capacity each, at most 64, and none for a batch that fills the GPU.
#[test]
fn launches_group_heads_and_split_short_batches() {
    let llama = |rows, capacity| Launch::new(32, 8, rows, capacity, (132, 2));
    assert_eq!(llama(1, 768), Launch { group: 4, hsplit: 1, splits: 24 });
    assert_eq!(llama(1, 131072), Launch { group: 4, hsplit: 1, splits: 33 });
    assert_eq!(llama(8, 768), Launch { group: 4, hsplit: 1, splits: 5 });
    assert_eq!(llama(64, 768), Launch { group: 4, hsplit: 1, splits: 1 });
    // aiming at 8 blocks a multiprocessor (LORA_FT_ATTENTION_BLOCKS_PER_SM), a batch of 64 splits
    assert_eq!(Launch::new(32, 8, 64, 768, (132, 8)).splits, 3);
    assert_eq!(Launch::new(28, 4, 1, 40, (132, 2)).group, 8);
    assert_eq!(Launch::new(16, 1, 1, 40, (132, 2)), Launch { group: 8, hsplit: 2, splits: 2 });
    assert_eq!(Launch::new(8, 8, 2, 10, (132, 2)), Launch { group: 1, hsplit: 1, splits: 1 });
}

/// The kernel against the training attention run a row at a time (its reference, the path
/// it replaces), both against the answer in f64: within the crate's multiple of the
/// reference's own error. Head sizes 64, 128 and 256; plain heads and GQA groups of 4, 7 and
/// 16 query heads a kv head; a window, a soft cap; rows of one position and of a full slot,
/// short batches whose long rows run in many splits and their merge; in f32, f16 and bf16.
#[test]
fn cuda_decode_attention_matches_the_training_attention() {
    let gpu = Device::new_cuda(0).unwrap();
    // slots, capacity, and each row's (slot, length)
    type Batch<'a> = (usize, usize, &'a [(usize, usize)]);
    let batches: [Batch; 3] = [
        (5, 40, &[(3, 1), (0, 17), (4, 40), (1, 33)]),
        (2, 1500, &[(1, 1500)]),
        (3, 800, &[(2, 777), (0, 1)]),
    ];
    let heads_of = [(64, 4, 1), (128, 8, 2), (256, 4, 4), (128, 28, 4), (64, 16, 1)];
    for ((slots, capacity, rows), (d, heads, kv)) in batches.iter().flat_map(|b| heads_of.map(|h| (*b, h))) {
        let q = Tensor::randn(0f32, 1.0, (rows.len(), heads, d), &Device::Cpu).unwrap();
        let k = Tensor::randn(0f32, 1.0, (slots, capacity, kv, d), &Device::Cpu).unwrap();
        let v = Tensor::randn(0f32, 1.0, (slots, capacity, kv, d), &Device::Cpu).unwrap();
        let slot_ids: Vec<u32> = rows.iter().map(|r| r.0 as u32).collect();
        let lens: Vec<u32> = rows.iter().map(|r| r.1 as u32).collect();
        let (slot_ids, lens) = (Tensor::new(slot_ids, &gpu).unwrap(), Tensor::new(lens, &gpu).unwrap());
        for (softcap, window) in [(None, None), (Some(20.0), Some(9))] {
            let rule = ScoreRule { scale: 1.0 / (d as f64).sqrt(), softcap, window };
            let exact: Vec<Tensor> = rows
                .iter()
                .enumerate()
                .map(|(r, &row)| exact(&q.get(r).unwrap(), &k, &v, row, &rule))
                .collect();
            let exact = Tensor::stack(&exact, 0).unwrap();
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
                let (qg, kg, vg) = (on(&q), on(&k), on(&v));
                let scores = Scores { scale: rule.scale, softcap, window };
                let ours = decode_attention(&qg, (&kg, &vg), (&slot_ids, &lens), scores).unwrap();
                let reference: Vec<Tensor> = rows
                    .iter()
                    .enumerate()
                    .map(|(r, &(slot, len))| {
                        let q = qg.get(r).unwrap().reshape((1, heads, 1, d)).unwrap();
                        let seen = |x: &Tensor| {
                            x.narrow(0, slot, 1)
                                .unwrap()
                                .narrow(1, 0, len)
                                .unwrap()
                                .transpose(1, 2)
                                .unwrap()
                                .contiguous()
                                .unwrap()
                        };
                        let (context, _) =
                            attention_packed(&q, &seen(&kg), &seen(&vg), (None, None), &rule).unwrap();
                        context.reshape((heads, d)).unwrap()
                    })
                    .collect();
                let reference = Tensor::stack(&reference, 0).unwrap();
                let what = format!(
                    "{} rows of capacity {capacity}, d {d}, {heads}/{kv} heads, cap {softcap:?}, window \
                     {window:?}, {dtype:?}",
                    rows.len()
                );
                assert_within_reference_error(&what, &ours, &reference, &exact);
            }
        }
    }
}

/// The fused RoPE and cache write against the composed path it replaces (the rope's
/// `apply_rows`, then `write_slots`), both against the rotation in f64 of the same rounded
/// inputs and tables: the rotated q, and the whole caches (each row's k rotated and v copied
/// at its place, every other position untouched). Llama-3.1's scaled tables and plain ones,
/// head sizes 64 and 128, grouped heads, a row's heads in one block and in several (the last
/// part-filled), f32, f16 and bf16.
#[test]
fn cuda_rope_write_slots_matches_the_composed_path() {
    use crate::arch::{RopeScaling, RopeSpec};
    use crate::model::ops::rope::Rope;
    let gpu = Device::new_cuda(0).unwrap();
    let (n_slots, capacity) = (6, 300);
    let rows = [(4usize, 0usize), (1, 299), (5, 17), (0, 150)];
    let llama3 = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 8192,
    };
    // (5 + 2 · 1 heads of 128: two blocks a row, the second part-filled)
    for (d, heads, kv, scaling) in
        [(64, 4, 2, RopeScaling::None), (128, 8, 2, llama3), (128, 5, 1, RopeScaling::None)]
    {
        let b = rows.len();
        let q = Tensor::randn(0f32, 1.0, (b, heads, d), &Device::Cpu).unwrap();
        let k = Tensor::randn(0f32, 1.0, (b, kv, d), &Device::Cpu).unwrap();
        let v = Tensor::randn(0f32, 1.0, (b, kv, d), &Device::Cpu).unwrap();
        let slot_ids = Tensor::new(rows.map(|r| r.0 as u32).as_slice(), &gpu).unwrap();
        let positions = Tensor::new(rows.map(|r| r.1 as u32).as_slice(), &gpu).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let spec = RopeSpec { theta: 500000.0, scaling: scaling.clone(), max_positions: 131072 };
            let rope = Rope::from_spec(d, &spec, dtype, &gpu).unwrap();
            let (cos, sin) = rope.tables_to(capacity).unwrap();
            let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
            let (qg, kg, vg) = (on(&q), on(&k), on(&v));
            let caches = || {
                let zeros = || Tensor::zeros((n_slots, capacity, kv, d), dtype, &gpu).unwrap();
                (zeros(), zeros())
            };
            // the composed path, on the attention's [b, heads, 1, d] views
            let (ka, va) = caches();
            let view = |x: &Tensor| x.unsqueeze(2).unwrap();
            let (qr, kr) = rope.apply_rows((&view(&qg), &view(&kg)), &positions, capacity).unwrap();
            let flat = |x: &Tensor| x.contiguous().unwrap().reshape((b, kv * d)).unwrap();
            write_slots((&flat(&kr), &flat(&vg)), (&ka, &va), (&slot_ids, &positions)).unwrap();
            let q_composed = qr.contiguous().unwrap().reshape((b, heads, d)).unwrap();
            // the fused kernel
            let (kf, vf) = caches();
            let q_fused =
                rope_write_slots((&qg, &kg, &vg), (&cos, &sin), (&kf, &vf), (&slot_ids, &positions)).unwrap();
            // the rotation in f64 on the CPU of the rounded inputs and tables
            let f64 = |t: &Tensor| {
                t.to_dtype(dtype).unwrap().to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap()
            };
            let (cos, sin) = (f64(&cos), f64(&sin));
            let rotate = |x: &Tensor| {
                let x = f64(x);
                let rotated: Vec<Tensor> = rows
                    .iter()
                    .enumerate()
                    .map(|(r, &(_, pos))| {
                        let (c, s) = (cos.get(pos).unwrap(), sin.get(pos).unwrap());
                        let xr = x.get(r).unwrap();
                        let (x1, x2) = (xr.narrow(1, 0, d / 2).unwrap(), xr.narrow(1, d / 2, d / 2).unwrap());
                        let y1 = (x1.broadcast_mul(&c).unwrap() - x2.broadcast_mul(&s).unwrap()).unwrap();
                        let y2 = (x1.broadcast_mul(&s).unwrap() + x2.broadcast_mul(&c).unwrap()).unwrap();
                        Tensor::cat(&[y1, y2], 1).unwrap()
                    })
                    .collect();
                Tensor::stack(&rotated, 0).unwrap()
            };
            let into_cache = |new: &Tensor| {
                let mut all = vec![0f64; n_slots * capacity * kv * d];
                for (r, &(slot, pos)) in rows.iter().enumerate() {
                    let at = (slot * capacity + pos) * kv * d;
                    all[at..at + kv * d].copy_from_slice(
                        &new.get(r).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap(),
                    );
                }
                Tensor::from_vec(all, (n_slots, capacity, kv, d), &Device::Cpu).unwrap()
            };
            let what = |part: &str| format!("{part}: d {d}, {heads}/{kv} heads, {scaling:?}, {dtype:?}");
            assert_within_reference_error(&what("q"), &q_fused, &q_composed, &rotate(&qg));
            assert_within_reference_error(&what("k cache"), &kf, &ka, &into_cache(&rotate(&kg)));
            let exact_v = into_cache(&f64(&vg));
            assert_eq!(rel_err(&vf, &exact_v), 0.0, "{}", what("v cache"));
            assert_eq!(rel_err(&va, &exact_v), 0.0, "{}", what("v cache (composed)"));
        }
    }
}
