//! The greedy choice against the CPU: ids exactly the first index of the largest logit (as
//! `generate::sampling` takes it), log-probs held to the error of candle's f32 composed ops
//! against the exact f64 answer (`crate::testing`'s rule).

use candle_core::{DType, Device, Result, Tensor};

use super::{greedy, greedy_to_host};
use crate::generate::sampling::log_sum_exp;
use crate::model::ops::test_util::randn;
use crate::testing::assert_within_reference_error;

/// The first index of the largest value and logit[id] − logsumexp, in f64 (rows without NaN).
fn exact_row(x: &[f64]) -> (u32, f64) {
    let id = (0..x.len()).fold(0, |best, i| if x[i] > x[best] { i } else { best });
    let sum: f64 = x.iter().map(|&v| (v - x[id]).exp()).sum();
    (id as u32, -sum.ln())
}

/// The rows' log-probs by candle's composed ops on the CPU in f32 (the path the kernel
/// replaces), −log Σ exp(x − max), the formula the kernel computes.
fn composed_f32(logits: &Tensor) -> Result<Tensor> {
    let x = logits.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let max = x.max_keepdim(1)?;
    x.broadcast_sub(&max)?.exp()?.sum_keepdim(1)?.log()?.neg()?.squeeze(1)
}

/// Logits `[n, vocab]`, uniform in (−6, 6), with every third row from row 0 holding a planted tie
/// of 7.5 (at ids in one 16-byte load, in one block's threads out of id order — 513 is thread 0's
/// second load, below it thread 5's first — in other chunks and at the last id), every third from
/// row 1 one outlier of 10⁴, the others a -inf at every 7th id; with the planted ties' lowest id.
fn planted(n: usize, vocab: usize, seed: u64) -> (Vec<f32>, Vec<Option<u32>>) {
    let mut x = (randn(&[n, vocab], seed) * 6.0).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut lowest = Vec::new();
    for r in 0..n {
        let row = &mut x[r * vocab..(r + 1) * vocab];
        match r % 3 {
            0 => {
                let lo = (20 + r % 4).min(vocab - 3);
                let ids: Vec<usize> =
                    [vocab - 1, vocab / 2 + 1, 513, lo + 2, lo].into_iter().filter(|&i| i < vocab).collect();
                ids.iter().for_each(|&i| row[i] = 7.5);
                lowest.push(ids.iter().min().map(|&i| i as u32));
            }
            1 => {
                row[(vocab / 3 + r) % vocab] = 1e4;
                lowest.push(None);
            }
            _ => {
                row.iter_mut().step_by(7).for_each(|v| *v = f32::NEG_INFINITY);
                lowest.push(None);
            }
        }
    }
    (x, lowest)
}

/// Rows n = 1, 3, 64 of Llama-3's and Qwen2's vocabularies and two small ones (1000: whole
/// vectors; 33: the scalar loads), f32, f16 and bf16: the ids equal the exact argmax (the planted
/// ties' lowest id), the log-probs within the composed f32 ops' error.
#[test]
fn cuda_greedy_matches_the_exact_argmax_and_log_prob() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    for (v, &vocab) in [128_256, 151_936, 1000, 33].iter().enumerate() {
        for &n in &[1, 3, 64] {
            let (x, lowest) = planted(n, vocab, 100 * v as u64 + n as u64);
            let x = Tensor::from_vec(x, (n, vocab), &Device::Cpu)?;
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let x = x.to_dtype(dtype)?;
                let what = format!("[{n}, {vocab}] {dtype:?}");
                let rows = x.to_dtype(DType::F64)?.to_vec2::<f64>()?;
                let (ids, exact): (Vec<u32>, Vec<f64>) =
                    rows.iter().map(Vec::as_slice).map(exact_row).unzip();
                for (r, low) in lowest.iter().enumerate() {
                    if let Some(low) = low {
                        assert_eq!(ids[r], *low, "{what}: the reference missed row {r}'s planted tie");
                    }
                }
                let chosen = greedy_to_host(&x.to_device(&gpu)?)?;
                assert_eq!(chosen.len(), n);
                let got: Vec<u32> = chosen.iter().map(|c| c.0).collect();
                assert_eq!(got, ids, "{what}: ids");
                let ours = Tensor::new(chosen.iter().map(|c| c.1).collect::<Vec<f32>>(), &Device::Cpu)?;
                let exact = Tensor::new(exact, &Device::Cpu)?;
                assert_within_reference_error(&what, &ours, &composed_f32(&x)?, &exact);
            }
        }
    }
    Ok(())
}

/// The rows `sampling::log_sum_exp` refuses get a NaN log-prob (a NaN, a +inf, all -inf, -inf
/// and a NaN), the argmax skipping NaNs and 0 for a row with nothing above -inf; a row of -inf
/// but one logit is valid, with log-prob 0. Whole vectors (1000, 1024) and scalar loads (33).
#[test]
fn cuda_greedy_marks_the_rows_sampling_refuses() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    for vocab in [1000, 1024, 33] {
        let mut x = (randn(&[5, vocab], vocab as u64) * 6.0)?.to_vec2::<f32>()?;
        x[0][5] = f32::NAN;
        x[0][9] = 7.5;
        x[1][3] = f32::INFINITY;
        x[2].fill(f32::NEG_INFINITY);
        x[3].fill(f32::NEG_INFINITY);
        x[3][2] = f32::NAN;
        x[4].fill(f32::NEG_INFINITY);
        x[4][vocab - 2] = -3.0;
        for (r, row) in x.iter().enumerate() {
            assert_eq!(log_sum_exp(row).is_err(), r < 4, "row {r}: the rule the kernel mirrors");
        }
        let x = Tensor::new(x, &Device::Cpu)?;
        for dtype in [DType::F32, DType::BF16] {
            let chosen = greedy_to_host(&x.to_dtype(dtype)?.to_device(&gpu)?)?;
            let ids: Vec<u32> = chosen.iter().map(|c| c.0).collect();
            assert_eq!(ids, [9, 3, 0, 0, vocab as u32 - 2], "{vocab} {dtype:?}");
            for (r, (_, logprob)) in chosen.iter().enumerate() {
                assert_eq!(logprob.is_nan(), r < 4, "{vocab} {dtype:?} row {r}: {logprob}");
            }
            assert_eq!(chosen[4].1, 0.0);
        }
    }
    Ok(())
}

/// The device tensor holds the ids and the log-probs' bits, `[2, n]`, and a view of rows (not
/// contiguous, offset) gives what its copy gives.
#[test]
fn cuda_greedy_takes_views() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let x = randn(&[6, 1001], 7).to_device(&gpu)?;
    let view = x.narrow(1, 1, 1000)?.narrow(0, 2, 3)?;
    let out = greedy(&view)?;
    assert_eq!(out.dims(), [2, 3]);
    assert_eq!(out.dtype(), DType::U32);
    let copy = greedy_to_host(&view.contiguous()?)?;
    let words = out.to_vec2::<u32>()?;
    for (r, (id, logprob)) in copy.iter().enumerate() {
        assert_eq!((words[0][r], words[1][r]), (*id, logprob.to_bits()));
        let row = view.get(r)?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        assert_eq!(*id, exact_row(&row).0);
    }
    Ok(())
}
