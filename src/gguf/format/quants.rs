//! A tensor's bytes in each ggml type the export writes, as gguf-py and llama.cpp write them:
//! the K-quants and Q5_0 by llama.cpp's reference quantizers (`kquants.rs`), F32, F16, BF16 and
//! Q8_0 by candle.

use super::kquants;
use anyhow::{bail, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Tensor;

/// The quantized blocks of `values` in `dtype` (for the golden tests against gguf-py).
pub fn quantize(values: &[f32], dtype: GgmlDType) -> Result<Vec<u8>> {
    quantize_rows(values, &[values.len()], dtype)
}

/// The bytes of a row-major tensor of `shape` in `dtype`: the K-quants and Q5_0 by llama.cpp's
/// reference quantizers (`kquants.rs`), the rest by candle (F32/F16/BF16/Q8_0, equal to gguf-py).
pub(crate) fn quantize_rows(values: &[f32], shape: &[usize], dtype: GgmlDType) -> Result<Vec<u8>> {
    let cols = *shape.last().unwrap_or(&0);
    if !cols.is_multiple_of(dtype.block_size()) {
        bail!("rows of {cols} values do not split into {dtype:?} blocks of {}", dtype.block_size());
    }
    Ok(match dtype {
        GgmlDType::Q4K => kquants::quantize_q4_k(values),
        GgmlDType::Q5K => kquants::quantize_q5_k(values),
        GgmlDType::Q6K => kquants::quantize_q6_k(values),
        GgmlDType::Q5_0 => kquants::quantize_q5_0(values),
        _ => {
            let tensor = Tensor::from_slice(values, shape, &candle_core::Device::Cpu)?;
            QTensor::quantize(&tensor, dtype)?.data()?.into_owned()
        }
    })
}
