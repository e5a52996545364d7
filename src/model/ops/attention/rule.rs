//! What one layer's attention computes: which keys each query sees (causality and the sliding
//! window, as an additive mask for the composed path) and how scores are scaled and soft-capped.

use candle_core::{Device, Result, Tensor};

/// Additive mask `[q_len, kv_len]` (0 or −∞) for queries at positions offset..offset+q_len.
/// A key j is visible to query i when j ≤ i and, with a window w, i − j < w (HF Mistral).
pub fn causal_mask(
    q_len: usize,
    kv_len: usize,
    offset: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Tensor> {
    let mask: Vec<f32> = (0..q_len)
        .flat_map(|qi| {
            let i = qi + offset;
            (0..kv_len).map(move |j| {
                let visible = j <= i && window.is_none_or(|w| i - j < w);
                if visible {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (q_len, kv_len), device)
}

/// How one layer turns q·kᵀ into probabilities: s = scale · q·kᵀ, soft-capped to
/// cap · tanh(s / cap) where the family does (Gemma 2), masked causally and to the sliding window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreRule {
    /// 1/sqrt(head_dim), or Gemma's 1/sqrt(query_pre_attn_scalar).
    pub scale: f64,
    pub softcap: Option<f64>,
    pub window: Option<usize>,
}

impl ScoreRule {
    /// Plain causal attention over heads of `head_dim`, with an optional window.
    pub fn causal(head_dim: usize, window: Option<usize>) -> Self {
        Self { scale: 1.0 / (head_dim as f64).sqrt(), softcap: None, window }
    }

    /// The factor q is multiplied by so that kernels that scale by 1/sqrt(head_dim) compute
    /// this rule's scale (1 for every family but Gemma's with query_pre_attn_scalar ≠ head_dim).
    #[cfg(feature = "cuda")]
    pub(super) fn query_factor(&self, head_dim: usize) -> f64 {
        self.scale * (head_dim as f64).sqrt()
    }
}
