//! Each op of the decoder with its forward and its hand-written backward side by side (llm.c's
//! rule): what the forward returns is what the backward reads. The CUDA path of each calls its
//! kernel in `crate::cuda`, the CPU path of the hot ones its fused loops in `cpu`; the composed
//! candle ops are the other dtypes' path and the tests' reference.

pub mod attention;
pub mod cpu;
pub mod dropout_mask;
pub mod embedding;
pub mod lm_head;
pub mod loss;
pub mod mlp;
pub mod norm;
pub mod product_sum;
pub mod rope;
pub mod rows;
pub mod softcap;
#[cfg(test)]
pub(crate) mod test_util;

pub use mlp::{gated, gated_backward};
pub use norm::{rms_norm, rms_norm_backward, rms_norm_backward_add};
pub use rope::Rope;
