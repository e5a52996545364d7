//! The loss's gradient rows put back among all of a batch's rows: `d_rows[j]` is the gradient of
//! row `rows[j]` (the trained rows, ascending), every other row's is zero. Trained rows come in
//! runs (each assistant turn), so the result is the runs and the gaps between them concatenated:
//! a copy per piece. candle's `index_add` gives one thread per column and loops over every index,
//! slow on a large model's step (benches/code_notes.md); it stays the path for rows in many short
//! runs.

use candle_core::{Result, Tensor};

/// Pieces above which `index_add` runs instead of the concatenation.
const MAX_PIECES: usize = 512;

/// `[n, hidden]` with `d_rows` (`[rows.len(), hidden]`) at `rows` (ascending, distinct) and zero
/// elsewhere, like `hidden` (`[n, hidden]`).
pub fn rows_among(hidden: &Tensor, rows: &[u32], d_rows: &Tensor) -> Result<Tensor> {
    let n = hidden.dim(0)?;
    let mut runs: Vec<(usize, usize)> = Vec::new(); // (first row, length)
    for &r in rows {
        match runs.last_mut() {
            Some((first, len)) if *first + *len == r as usize => *len += 1,
            _ => runs.push((r as usize, 1)),
        }
    }
    if runs.len() * 2 + 1 > MAX_PIECES || rows.windows(2).any(|w| w[0] >= w[1]) {
        let idx = Tensor::new(rows, hidden.device())?;
        return hidden.zeros_like()?.index_add(&idx, &d_rows.to_dtype(hidden.dtype())?, 0);
    }
    let d_rows = d_rows.to_dtype(hidden.dtype())?;
    let hidden_size = hidden.dim(1)?;
    let zeros = |len: usize| Tensor::zeros((len, hidden_size), hidden.dtype(), hidden.device());
    let mut pieces = Vec::with_capacity(runs.len() * 2 + 1);
    let (mut row, mut taken) = (0, 0);
    for (first, len) in runs {
        if first > row {
            pieces.push(zeros(first - row)?);
        }
        pieces.push(d_rows.narrow(0, taken, len)?);
        (row, taken) = (first + len, taken + len);
    }
    if row < n {
        pieces.push(zeros(n - row)?);
    }
    match pieces.len() {
        0 => hidden.zeros_like(),
        1 => pieces.pop().expect("one piece").contiguous(),
        _ => Tensor::cat(&pieces, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// Equal to index_add onto zeros, bit for bit, for runs at the start, the end, the middle,
    /// single rows, every row and none.
    #[test]
    fn rows_among_equals_index_add_onto_zeros() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = Tensor::zeros((12, 5), DType::F32, &dev)?;
        for rows in [
            vec![0u32, 1, 2, 5, 6, 11],
            vec![3, 4, 5],
            vec![0],
            vec![11],
            (0..12).collect(),
            vec![1, 3, 5, 7, 9],
            vec![],
        ] {
            let d_rows = Tensor::randn(0f32, 1.0, (rows.len(), 5), &dev)?;
            let got = rows_among(&hidden, &rows, &d_rows)?;
            let want = match rows.is_empty() {
                true => hidden.zeros_like()?,
                false => hidden.zeros_like()?.index_add(&Tensor::new(rows.as_slice(), &dev)?, &d_rows, 0)?,
            };
            assert_eq!(got.dims(), [12, 5]);
            assert_eq!(got.to_vec2::<f32>()?, want.to_vec2::<f32>()?, "{rows:?}");
        }
        Ok(())
    }
}
