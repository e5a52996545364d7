//! The per-head norms of q and k (Qwen3, Gemma 3) and the norms after a sublayer's output
//! (Gemma), forward and backward side by side.

use candle_core::{Result, Tensor};

use super::{DecoderLayer, Pass};
use crate::model::ops::{rms_norm, rms_norm_backward};

impl DecoderLayer {
    /// y `[n, heads·d]` with RMSNorm (`weight` `[d]`) over each head, and y itself where a
    /// backward will read it; y unchanged without a norm.
    pub(super) fn head_norm(
        &self,
        y: Tensor,
        weight: Option<&Tensor>,
        pass: Pass,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let Some(w) = weight else { return Ok((y, None)) };
        let (n, width) = y.dims2()?;
        let normed = rms_norm(&y.reshape((n * width / self.head_dim, self.head_dim))?, w, self.rms_norm_eps)?;
        Ok((normed.reshape((n, width))?, (pass != Pass::Forward).then_some(y)))
    }

    /// The gradient of y given that of `head_norm(y)` (`dy` `[n, heads·d]`).
    pub(super) fn head_norm_backward(
        &self,
        raw: Option<Tensor>,
        weight: Option<&Tensor>,
        dy: Tensor,
    ) -> Result<Tensor> {
        let (Some(y), Some(w)) = (raw, weight) else { return Ok(dy) };
        let (n, width) = y.dims2()?;
        let rows = (n * width / self.head_dim, self.head_dim);
        rms_norm_backward(&y.reshape(rows)?, w, self.rms_norm_eps, &dy.reshape(rows)?)?.reshape((n, width))
    }

    /// The gradient of a sublayer's output before its output norm, given the residual stream's.
    pub(super) fn out_norm_backward(
        &self,
        y: Option<&Tensor>,
        out_norm: Option<&Tensor>,
        d: &Tensor,
    ) -> Result<Tensor> {
        match (y, out_norm) {
            (Some(y), Some(w)) => rms_norm_backward(y, w, self.rms_norm_eps, d),
            _ => Ok(d.clone()),
        }
    }
}
