//! RMSNorm, the SiLU-gated activation and LoRA dropout on the CPU, each one pass over its rows
//! with threads over row groups, in place of the composed ops' five to ten passes (and their
//! temporaries) per call. Same formulas, same f32 arithmetic up to summation order.

use candle_core::{bail, Result, Tensor};
use rayon::prelude::*;

use super::{tensor, vector, with_rows};

/// Elements per thread task: big enough to amortize the task, small enough to balance.
const TASK_VALUES: usize = 1 << 15;

/// Rows per task for rows of `width` values.
fn rows_per_task(width: usize) -> usize {
    (TASK_VALUES / width.max(1)).max(1)
}

/// The weight as a contiguous vector of `width` values.
fn weight_values(weight: &Tensor, width: usize) -> Result<Vec<f32>> {
    let w = weight.flatten_all()?.to_vec1::<f32>()?;
    if w.len() != width {
        bail!("a norm weight of {} values over rows of {width}", w.len());
    }
    Ok(w)
}

/// rsqrt(mean(x²) + eps) of one row.
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    1.0 / (vector::sum_squares(x) / x.len() as f32 + eps).sqrt()
}

/// y = w ⊙ (x · rsqrt(mean(x²) + eps)) over the last dimension.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let width = x.dim(candle_core::D::Minus1)?;
    let w = weight_values(weight, width)?;
    let eps = eps as f32;
    let out = with_rows(x, |xs| {
        let mut out = vec![0f32; xs.len()];
        let chunk = rows_per_task(width) * width;
        out.par_chunks_mut(chunk).zip(xs.par_chunks(chunk)).for_each(|(out, xs)| {
            for (y, x) in out.chunks_mut(width).zip(xs.chunks(width)) {
                let r = inv_rms(x, eps);
                for ((y, &x), &w) in y.iter_mut().zip(x).zip(&w) {
                    *y = (x * r) * w;
                }
            }
        });
        Ok(out)
    })?;
    tensor(out, x.shape())
}

/// dx = r ⊙ g − x ⊙ r³ ⊙ mean(g ⊙ x), g = dy ⊙ w, r = rsqrt(mean(x²) + eps); plus `residual`
/// where given (the pre-norm block's input gradient in the same pass).
pub fn rms_norm_backward(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    dy: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    let width = x.dim(candle_core::D::Minus1)?;
    if dy.shape() != x.shape() || residual.is_some_and(|r| r.shape() != x.shape()) {
        bail!("rms_norm_backward of x {:?} and dy {:?}", x.shape(), dy.shape());
    }
    let w = weight_values(weight, width)?;
    let eps = eps as f32;
    let chunk = rows_per_task(width) * width;
    let out = with_rows(x, |xs| {
        with_rows(dy, |dys| {
            let mut out = match residual {
                Some(r) => with_rows(r, |r| Ok(r.to_vec()))?,
                None => vec![0f32; xs.len()],
            };
            let add = residual.is_some();
            out.par_chunks_mut(chunk).zip(xs.par_chunks(chunk)).zip(dys.par_chunks(chunk)).for_each(
                |((out, xs), dys)| {
                    let mut g = vec![0f32; width];
                    for ((dx, x), dy) in out.chunks_mut(width).zip(xs.chunks(width)).zip(dys.chunks(width)) {
                        let r = inv_rms(x, eps);
                        for ((g, &dy), &w) in g.iter_mut().zip(dy).zip(&w) {
                            *g = dy * w;
                        }
                        let mean_gx = vector::dot(&g, x) / width as f32;
                        let c = r * r * r * mean_gx;
                        for ((dx, &g), &x) in dx.iter_mut().zip(&g).zip(x) {
                            let v = g * r - x * c;
                            *dx = if add { *dx + v } else { v };
                        }
                    }
                },
            );
            Ok(out)
        })
    })?;
    tensor(out, x.shape())
}

/// a = silu(g) ⊙ u.
pub fn silu_gated(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if gate.shape() != up.shape() {
        bail!("gated activation of {:?} and {:?}", gate.shape(), up.shape());
    }
    let out = with_rows(gate, |g| {
        with_rows(up, |u| {
            let mut out = vec![0f32; g.len()];
            out.par_chunks_mut(TASK_VALUES)
                .zip(g.par_chunks(TASK_VALUES))
                .zip(u.par_chunks(TASK_VALUES))
                .for_each(|((a, g), u)| vector::silu_gated(g, u, a));
            Ok(out)
        })
    })?;
    tensor(out, gate.shape())
}

/// (d_gate, d_up) = (da ⊙ u ⊙ silu'(g), da ⊙ silu(g)) with silu'(g) = σ(g)(1 + g(1 − σ(g))),
/// and a = silu(g) ⊙ u too where `with_act`.
pub fn silu_gated_backward(
    gate: &Tensor,
    up: &Tensor,
    da: &Tensor,
    with_act: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    if gate.shape() != up.shape() || da.shape() != up.shape() {
        bail!("gated backward of {:?}, {:?} and {:?}", gate.shape(), up.shape(), da.shape());
    }
    let n = gate.elem_count();
    let (mut d_gate, mut d_up) = (vec![0f32; n], vec![0f32; n]);
    let mut act = if with_act { vec![0f32; n] } else { Vec::new() };
    with_rows(gate, |g| {
        with_rows(up, |u| {
            with_rows(da, |da| {
                let grads = d_gate.par_chunks_mut(TASK_VALUES).zip(d_up.par_chunks_mut(TASK_VALUES));
                let inputs =
                    g.par_chunks(TASK_VALUES).zip(u.par_chunks(TASK_VALUES)).zip(da.par_chunks(TASK_VALUES));
                if with_act {
                    grads.zip(act.par_chunks_mut(TASK_VALUES)).zip(inputs).for_each(
                        |(((dg, du), a), ((g, u), da))| vector::silu_gated_backward_act(g, u, da, dg, du, a),
                    );
                } else {
                    grads
                        .zip(inputs)
                        .for_each(|((dg, du), ((g, u), da))| vector::silu_gated_backward(g, u, da, dg, du));
                }
                Ok(())
            })
        })
    })?;
    let act = with_act.then(|| tensor(act, gate.shape())).transpose()?;
    Ok((tensor(d_gate, gate.shape())?, tensor(d_up, gate.shape())?, act))
}

/// x ⊙ m, m_i = 0 where element i's draw from `seed` falls under `below`, else `keep_scale`: the
/// dropout mask of lora/dropout.rs drawn and applied in the same pass.
pub fn dropout(x: &Tensor, seed: u64, below: u32, keep_scale: f32) -> Result<Tensor> {
    let out = with_rows(x, |xs| {
        let mut out = vec![0f32; xs.len()];
        out.par_chunks_mut(TASK_VALUES).zip(xs.par_chunks(TASK_VALUES)).enumerate().for_each(
            |(c, (out, xs))| vector::dropout(xs, out, seed, (c * TASK_VALUES) as u64, below, keep_scale),
        );
        Ok(out)
    })?;
    tensor(out, x.shape())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::test_util::randn;

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The residual added inside the norm's backward gives the bits of the separate add; the
    /// activation written by the gated backward, those of the forward.
    #[test]
    fn fused_extras_equal_the_separate_ops() {
        let (x, dy, res) = (randn(&[9, 40], 1), randn(&[9, 40], 2), randn(&[9, 40], 3));
        let w = (randn(&[40], 4) + 1.0).unwrap();
        let fused = rms_norm_backward(&x, &w, 1e-5, &dy, Some(&res)).unwrap();
        let separate = (&res + rms_norm_backward(&x, &w, 1e-5, &dy, None).unwrap()).unwrap();
        assert_eq!(bits(&fused), bits(&separate));
        // more values than one task holds, so that the tasks' pieces line up
        let n = TASK_VALUES + 123;
        let (g, u, da) = ((randn(&[n], 5) * 4.0).unwrap(), randn(&[n], 6), randn(&[n], 7));
        let (dg, du, a) = silu_gated_backward(&g, &u, &da, true).unwrap();
        let (dg2, du2, none) = silu_gated_backward(&g, &u, &da, false).unwrap();
        assert!(none.is_none());
        assert_eq!(bits(&a.unwrap()), bits(&silu_gated(&g, &u).unwrap()));
        assert_eq!((bits(&dg), bits(&du)), (bits(&dg2), bits(&du2)));
    }

    /// A strided input (a transpose) is read in its logical order.
    #[test]
    fn a_strided_input_is_read_in_order() {
        let x = randn(&[40, 9], 8).t().unwrap();
        let w = randn(&[40], 9);
        let want = rms_norm(&x.contiguous().unwrap(), &w, 1e-5).unwrap();
        assert_eq!(bits(&rms_norm(&x, &w, 1e-5).unwrap()), bits(&want));
    }
}
