//! Each tensor's type in a `Q4_K_M` file, as `llama-quantize MODEL.gguf OUT.gguf Q4_K_M` picks
//! it (no importance matrix, no overrides) for the Llama family: llama.cpp's
//! `llama_tensor_get_type_impl` and `tensor_type_fallback` (src/llama-quant.cpp, ggml-org
//! llama.cpp as of commit 007dbbf, the rules llama-cpp-python 0.3.36's build applies; checked on
//! SmolLM2 and a synthetic 80-layer Llama, tests/golden/gguf_q4km_*.json). Q4_K by default; Q6_K
//! for `output.weight` (or `token_embd.weight` when the file has no `output.weight`: tied
//! embeddings), and for `attn_v` and `ffn_down` on the layers `use_more_bits` picks; Q8_0 for the
//! output/tied
//! embedding when a row does not split into blocks of 256; a 70B-shaped Llama (80 layers,
//! grouped KV heads) gets Q5_K for its other `attn_v`. Then the fallbacks where a row does not
//! split into the type's blocks: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, and F16 if that does
//! not split either.

use crate::gguf::format::writer::TensorInfo;
use anyhow::{bail, Result};
use candle_core::quantized::GgmlDType;

/// The model numbers the choice reads.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third between.
fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    let (i, n) = (i_layer as i64, n_layers as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The layer of a `blk.N.` tensor (llama.cpp's loader walks tensors in layer order, so its
/// `attn_v` / `ffn_down` counters are the layer numbers).
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split_once('.')?.0.parse().ok()
}

/// Sets the type of every quantized tensor of `infos` (those not F32: the 2-D weights) as
/// llama.cpp's Q4_K_M does.
pub fn choose_types(infos: &mut [&mut TensorInfo], shape: Shape) -> Result<()> {
    let tied = !infos.iter().any(|info| info.name == "output.weight");
    let n_attention_wv = infos.iter().filter(|info| info.name.contains("attn_v.weight")).count();
    let is_70b = shape.layers == 80 && shape.heads != shape.kv_heads;
    for info in infos.iter_mut() {
        if info.dtype == GgmlDType::F32 {
            continue;
        }
        let name = info.name.as_str();
        let cols = *info.shape.last().unwrap_or(&0);
        let layer =
            || layer_of(name).ok_or_else(|| anyhow::anyhow!("tensor {name}: no layer number in its name"));
        let chosen = if name == "output.weight" || (tied && name == "token_embd.weight") {
            if !cols.is_multiple_of(QK_K) {
                GgmlDType::Q8_0
            } else {
                GgmlDType::Q6K
            }
        } else if name.contains("attn_v.weight") {
            let mut t = if use_more_bits(layer()?, n_attention_wv) { GgmlDType::Q6K } else { GgmlDType::Q4K };
            if is_70b && t == GgmlDType::Q4K {
                t = GgmlDType::Q5K;
            }
            t
        } else if name.contains("ffn_down") && use_more_bits(layer()?, shape.layers) {
            GgmlDType::Q6K
        } else {
            GgmlDType::Q4K
        };
        info.dtype = fallback(name, cols, chosen)?;
    }
    Ok(())
}

const QK_K: usize = 256;

/// `tensor_type_fallback`: a type whose blocks split the row, or F16.
fn fallback(name: &str, cols: usize, chosen: GgmlDType) -> Result<GgmlDType> {
    if cols.is_multiple_of(chosen.block_size()) {
        return Ok(chosen);
    }
    let next = match chosen {
        GgmlDType::Q4K => GgmlDType::Q5_0,
        GgmlDType::Q5K => GgmlDType::Q5_1,
        GgmlDType::Q6K => GgmlDType::Q8_0,
        other => bail!("tensor {name}: rows of {cols} do not split into {other:?} blocks (llama.cpp has no fallback either)"),
    };
    if next == GgmlDType::Q5_1 {
        bail!("tensor {name}: Q5_K's fallback Q5_1 (rows of {cols}) is not written by export-gguf");
    }
    Ok(if cols.is_multiple_of(next.block_size()) { next } else { GgmlDType::F16 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, shape: &[usize]) -> TensorInfo {
        TensorInfo { name: name.into(), shape: shape.to_vec(), dtype: GgmlDType::Q4K }
    }

    /// llama.cpp's layers with more bits for 32 layers: 0..4, 28..32 and 6, 9, …, 27.
    #[test]
    fn use_more_bits_is_llama_cpps() {
        let picked: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(picked, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
    }

    #[test]
    fn untied_output_is_q6_k_and_fallbacks_follow_the_row() {
        let mut infos = [
            info("token_embd.weight", &[1000, 512]),
            info("output.weight", &[1000, 512]),
            info("blk.0.attn_v.weight", &[128, 512]),
            info("blk.1.attn_v.weight", &[128, 512]),
            info("blk.1.ffn_down.weight", &[512, 100]),
            info("blk.1.attn_q.weight", &[512, 48]),
        ];
        let mut refs: Vec<&mut TensorInfo> = infos.iter_mut().collect();
        choose_types(&mut refs, Shape { layers: 2, heads: 8, kv_heads: 8 }).unwrap();
        let types: Vec<GgmlDType> = infos.iter().map(|i| i.dtype).collect();
        use GgmlDType::*;
        // 2 layers: use_more_bits(i, 2) holds for i >= 7·2/8 = 1
        assert_eq!(types, [Q4K, Q6K, Q4K, Q6K, F16, F16]);
    }
}
