//! One chunk of the cross-entropy on the CPU: the logits of the chunk's rows in one buffer,
//! each row's log-sum-exp and loss in one pass that turns the row into its gradient in place
//! (threads over rows), and the gradient's product with lm_head. The composed path makes the
//! f32 copy, the log-softmax, its exp, the one-hot scatter and the scale as separate tensors.

use candle_core::{bail, Result, Tensor};
use rayon::prelude::*;

use super::gemm::{product, Threads, View};
use super::{tensor, vector, Read};

/// The summed loss of rows `hs` `[n, hidden]` against `targets` (one per row) under lm_head
/// `[vocab, hidden]`, and with `grad_scale` the gradient of scale · loss w.r.t. `hs`.
pub fn chunk(
    hs: &Tensor,
    lm_head: &Tensor,
    targets: &[u32],
    grad_scale: Option<f64>,
) -> Result<(f64, Option<Tensor>)> {
    let (rh, rw) = (Read::new(hs)?, Read::new(lm_head)?);
    let (vh, vw) = (View::of(&rh)?, View::of(&rw)?);
    let (n, vocab, hidden) = (vh.rows, vw.rows, vh.cols);
    if targets.len() != n || targets.iter().any(|&t| t as usize >= vocab) {
        bail!("{} targets for {n} rows of a {vocab}-word vocabulary", targets.len());
    }
    let mut logits = vec![0f32; n * vocab];
    let rows = View::rows(0, n, vocab, vocab);
    product(&mut logits, rows, (rh.buffer(), vh), (rw.buffer(), vw.t()), 1.0, false, Threads::Pool)?;
    let losses: Vec<f64> = logits
        .par_chunks_mut(vocab)
        .zip(targets.par_iter())
        .map(|(row, &t)| {
            let max = vector::max(row);
            let target = row[t as usize];
            let Some(scale) = grad_scale else {
                let sum = vector::exp_shifted_sum(row, max);
                return -((target - max) - sum.ln()) as f64;
            };
            let sum = vector::exp_shifted(row, max);
            // d(−log p_t)/d logits = softmax − onehot(t), times the scale
            let scale = scale as f32;
            vector::scale(row, scale / sum);
            row[t as usize] -= scale;
            -((target - max) - sum.ln()) as f64
        })
        .collect();
    let loss = losses.iter().sum();
    let Some(_) = grad_scale else { return Ok((loss, None)) };
    let mut d_rows = vec![0f32; n * hidden];
    let dst = View::rows(0, n, hidden, hidden);
    product(&mut d_rows, dst, (&logits, rows), (rw.buffer(), vw), 1.0, false, Threads::Pool)?;
    Ok((loss, Some(tensor(d_rows, (n, hidden))?)))
}
