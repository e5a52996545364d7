//! Greedy decoding's choice on the GPU (`greedy.cu`): every row's argmax (ties to the lowest id)
//! and its raw log-prob, from many blocks per row and a combine, in place of candle's one-block-
//! per-row argmax, max and sum. The engine's CPU path (`generate::sampling`) is its reference.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, Result, Tensor, WithDType};

use super::{blocks, by_dtype, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("greedy");
/// The block size of both kernels (`THREADS` in greedy.cu).
const THREADS: usize = 128;
/// Blocks per multiprocessor the partial pass aims for when the rows alone are too few.
const BLOCKS_PER_SM: usize = 2;
/// u32 words of one chunk's partial (`State` in greedy.cu: max, sum, id).
const PARTIAL_WORDS: usize = 3;

/// For logits `[n, vocab]` (f32, f16 or bf16), a u32 tensor `[2, n]`: row 0 each row's argmax
/// (the lowest id among equal maxima; NaNs skipped; 0 for a row with nothing above -inf), row 1
/// the bits of its raw log-prob as f32, logit[id] − logsumexp(row) (NaN for a row holding a NaN
/// or +inf, or nothing above -inf: the rows `sampling::log_sum_exp` refuses). The launches
/// depend on the shape alone.
pub fn greedy(logits: &Tensor) -> Result<Tensor> {
    by_dtype!(logits.dtype(), typed(logits))
}

/// `greedy`'s ids and log-probs on the host, one copy of 2·n words: `(id, log-prob)` per row.
pub fn greedy_to_host(logits: &Tensor) -> Result<Vec<(u32, f32)>> {
    let words = greedy(logits)?.to_vec2::<u32>()?;
    Ok(words[0].iter().zip(&words[1]).map(|(&id, &bits)| (id, f32::from_bits(bits))).collect())
}

/// How a row of `vocab` logits is split for `blocks_wanted` blocks over `n` rows with loads of
/// `vec` elements: (chunks per row, elements per chunk, a multiple of `vec`). A chunk holds at
/// least one load per thread.
fn split(n: usize, vocab: usize, vec: usize, blocks_wanted: usize) -> (usize, usize) {
    let most = vocab.div_ceil(THREADS * vec);
    let chunks = blocks_wanted.div_ceil(n.max(1)).clamp(1, most.max(1));
    let chunk = vocab.div_ceil(chunks).div_ceil(vec) * vec;
    (vocab.div_ceil(chunk), chunk)
}

fn typed<T: CudaDType + WithDType + DeviceRepr>(logits: &Tensor) -> Result<Tensor> {
    let (n, vocab) = logits.dims2()?;
    if n == 0 || vocab == 0 || n > u16::MAX as usize || vocab > i32::MAX as usize {
        bail!("greedy choice: logits {:?} (1 to 65535 rows of 1 to 2³¹ − 1 logits)", logits.dims());
    }
    let logits = logits.contiguous()?;
    let dev = cuda_device(&logits)?;
    let sms = super::multiprocessors(&dev)?;
    let (chunks, chunk) = split(n, vocab, 16 / T::DTYPE.size_in_bytes(), BLOCKS_PER_SM * sms);
    // every partial and every output word is written by the launches
    let partial = unsafe { dev.alloc::<u32>(PARTIAL_WORDS * n * chunks)? };
    let out = unsafe { dev.alloc::<u32>(2 * n)? };
    let (n_i, vocab_i, chunk_i, chunks_i) = (n as i32, vocab as i32, chunk as i32, chunks as i32);
    {
        let (storage, _) = logits.storage_and_layout();
        let x = view::<T>(&storage, &logits)?;
        let func = KERNELS.function(&dev, &format!("greedy_partial_{}", suffix(T::DTYPE)?))?;
        let mut l = func.builder();
        l.arg(&x).arg(&partial).arg(&vocab_i).arg(&chunk_i);
        let config = LaunchConfig {
            grid_dim: (chunks as u32, n as u32, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { l.launch(config) }.w()?;
    }
    let func = KERNELS.function(&dev, "greedy_combine")?;
    let mut l = func.builder();
    l.arg(&partial).arg(&out).arg(&n_i).arg(&chunks_i);
    unsafe { l.launch(blocks(n, THREADS as u32)) }.w()?;
    Ok(wrap(out, &dev, &[2, n]))
}

#[cfg(test)]
mod split_tests {
    use super::split;

    /// One row of Llama-3's vocab on an H200 (132 multiprocessors): a block of 128 threads per
    /// 512 logits, one 16-byte load each; 64 rows: five chunks a row; a small row: one chunk.
    #[test]
    fn rows_split_into_chunks_that_cover_them() {
        assert_eq!(split(1, 128_256, 4, 264), (251, 512));
        assert_eq!(split(64, 128_256, 4, 264), (5, 25_652));
        assert_eq!(split(1, 33, 4, 264), (1, 36));
        assert_eq!(split(3, 151_936, 8, 264), (88, 1_728));
        for (n, vocab, vec) in [(1, 128_256, 4), (3, 1000, 8), (64, 151_936, 8), (300, 33, 4)] {
            let (chunks, chunk) = split(n, vocab, vec, 264);
            assert_eq!(chunk % vec, 0);
            assert!(
                chunks * chunk >= vocab && (chunks - 1) * chunk < vocab,
                "{n} {vocab}: {chunks} × {chunk}"
            );
        }
    }
}

#[cfg(all(test, feature = "cuda"))]
#[path = "greedy_tests.rs"]
mod tests;
