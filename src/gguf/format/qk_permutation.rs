//! llama.cpp's row order of Q and K weights for the llama graph (convert_hf_to_gguf.py's
//! `LlamaModel.permute`) and its inverse: which families it applies to, their declarations say
//! (`permutes_qk`).

/// Undo llama.cpp's `permute` of Q/K rows, as transformers' `_reverse_permute_weights` does:
/// within each of `n_head` groups, HF row `(j, d)` (j < 2, d < half) is GGUF row `(d, j)`.
pub(crate) fn unpermute_rows(values: &[f32], rows: usize, n_head: usize) -> Vec<f32> {
    reorder_rows(values, rows, |row| gguf_row_of(row, rows, n_head))
}

/// llama.cpp's `LlamaModel.permute` of Q/K rows (convert_hf_to_gguf.py): `reshape(n_head, 2,
/// half, cols).swapaxes(1, 2)`, GGUF row `(d, j)` is HF row `(j, d)`; the inverse of
/// `unpermute_rows`. `rows` must split into `n_head` groups of even size.
pub(crate) fn permute_rows(values: &[f32], rows: usize, n_head: usize) -> Vec<f32> {
    let mut hf_row = vec![0; rows];
    for row in 0..rows {
        hf_row[gguf_row_of(row, rows, n_head)] = row;
    }
    reorder_rows(values, rows, |row| hf_row[row])
}

/// The GGUF row holding HF row `row` of a permuted Q/K weight.
fn gguf_row_of(row: usize, rows: usize, n_head: usize) -> usize {
    let half = rows / n_head / 2;
    let (head, within) = (row / (2 * half), row % (2 * half));
    let (j, d) = (within / half, within % half);
    head * 2 * half + d * 2 + j
}

/// Row `r` of the result is row `source(r)` of `values`.
fn reorder_rows(values: &[f32], rows: usize, source: impl Fn(usize) -> usize) -> Vec<f32> {
    let cols = values.len() / rows;
    let mut out = Vec::with_capacity(values.len());
    for row in 0..rows {
        let from = source(row);
        out.extend_from_slice(&values[from * cols..(from + 1) * cols]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's permute (convert_hf_to_gguf.py): reshape(n_head, 2, half, cols)
    /// .swapaxes(1, 2); unpermute must be its exact inverse.
    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (n_head, half, cols) = (3, 4, 2);
        let rows = n_head * 2 * half;
        let hf: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let mut gguf = vec![0.0; hf.len()];
        for h in 0..n_head {
            for j in 0..2 {
                for d in 0..half {
                    let hf_row = h * 2 * half + j * half + d;
                    let gguf_row = h * 2 * half + d * 2 + j;
                    gguf[gguf_row * cols..(gguf_row + 1) * cols]
                        .copy_from_slice(&hf[hf_row * cols..(hf_row + 1) * cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, rows, n_head), hf);
        assert_eq!(permute_rows(&hf, rows, n_head), gguf);
        // HF row 1 (first half, d=1) comes from GGUF row 2; HF row 4 (second half, d=0) from row 1
        assert_eq!(unpermute_rows(&gguf, rows, n_head)[cols], gguf[2 * cols]);
        assert_eq!(unpermute_rows(&gguf, rows, n_head)[4 * cols], gguf[cols]);
    }
}
