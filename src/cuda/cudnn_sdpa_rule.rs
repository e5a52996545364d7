//! What a cuDNN attention call computes: the score rule, and packed rows' spans as cuDNN reads
//! them.

use candle_core::Tensor;

/// How scores are made and masked: s = scale · q·kᵀ, cap · tanh(s / cap) with a soft cap, then
/// causal and, with a window w, key j visible from row i only when i − j < w.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    pub scale: f64,
    pub softcap: Option<f64>,
    pub window: Option<usize>,
}

/// Packed rows (`data.packing`) as cuDNN reads them: `sequences` spans laid back to back in the
/// `[b, t, heads, d]` memory of q, k and v, each at most `longest` tokens; `q_offsets` and
/// `kv_offsets` (`[sequences + 1]` i32) where each starts, in elements of q and of k/v;
/// `seq_lens` (`[sequences]` i32) their lengths. Spans of length 0 may pad `sequences` to a
/// bucket, so that few graphs are built.
pub struct Ragged<'a> {
    pub sequences: usize,
    pub longest: usize,
    pub q_offsets: &'a Tensor,
    pub kv_offsets: &'a Tensor,
    pub seq_lens: &'a Tensor,
}
