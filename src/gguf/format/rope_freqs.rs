//! Llama 3's RoPE scaling as llama.cpp stores it: not in keys but as the `rope_freqs` tensor,
//! each frequency's divisor as convert_hf_to_gguf.py computes it (`generate_extra_tensors`). The
//! export writes these factors; the import fits the `llama3` parameters back to them.

use std::f64::consts::PI;

/// The tensor's name.
pub(crate) const ROPE_FREQS: &str = "rope_freqs.weight";

/// llama.cpp's converter default for `original_max_position_embeddings` (every Llama 3.x has it).
pub(crate) const LLAMA3_ORIGINAL_CONTEXT: u64 = 8192;

/// llama.cpp's converter's `rope_factors[i]` for the frequency `freq`.
pub(crate) fn llama3_factor(freq: f64, factor: f64, low: f64, high: f64, old: f64) -> f64 {
    let wavelen = 2.0 * PI / freq;
    if wavelen < old / high {
        1.0
    } else if wavelen > old / low {
        factor
    } else {
        let smooth = (old / wavelen - low) / (high - low);
        1.0 / ((1.0 - smooth) / factor + smooth)
    }
}
