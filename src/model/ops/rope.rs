//! Rotary position embedding, forward and backward (a rotation by the opposite angle), with the
//! frequency scalings of long-context models (Llama 3.1's, YaRN, linear, dynamic) as transformers'
//! `modeling_rope_utils` computes them.

use std::f64::consts::PI;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Result, Tensor};

use crate::arch::{RopeScaling, RopeSpec};
use crate::profile::section;

/// RoPE's inverse frequencies (`head_dim / 2` of them, in f64) and the factor its cos and sin are
/// multiplied by (YaRN's attention scaling; 1 otherwise), for `spec`.
///
/// `Dynamic` (NTK-aware) scaling changes the base only for a sequence longer than
/// `max_position_embeddings`, which lora-ft refuses, so within the positions it accepts it is
/// plain RoPE, as in transformers.
pub fn frequencies(head_dim: usize, spec: &RopeSpec) -> (Vec<f64>, f64) {
    let dim = head_dim as f64;
    let pos_freqs: Vec<f64> = (0..head_dim / 2).map(|i| spec.theta.powf(2.0 * i as f64 / dim)).collect();
    let plain = || pos_freqs.iter().map(|p| 1.0 / p).collect::<Vec<f64>>();
    match spec.scaling {
        RopeScaling::None | RopeScaling::Dynamic { .. } => (plain(), 1.0),
        RopeScaling::Linear { factor } => (plain().iter().map(|f| f / factor).collect(), 1.0),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
            let old = original_max_position as f64;
            let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
            let scaled = plain()
                .into_iter()
                .map(|f| {
                    let wavelen = 2.0 * PI / f;
                    if wavelen < high_wavelen {
                        f // high frequencies: kept
                    } else if wavelen > low_wavelen {
                        f / factor // low frequencies: interpolated
                    } else {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect();
            (scaled, 1.0)
        }
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } => {
            let old = original_max_position as f64;
            let correction_dim =
                |rotations: f64| (dim * (old / (rotations * 2.0 * PI)).ln()) / (2.0 * spec.theta.ln());
            let (low, high) = (correction_dim(beta_fast), correction_dim(beta_slow));
            let (low, high) = if truncate { (low.floor(), high.ceil()) } else { (low, high) };
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001; // as transformers: no division by zero
            }
            let scaled = pos_freqs
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let extrapolation = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    (1.0 / (factor * p)) * (1.0 - extrapolation) + (1.0 / p) * extrapolation
                })
                .collect();
            let mscale = if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
            (scaled, attention_factor.unwrap_or(mscale))
        }
    }
}

/// Rotary position embedding in HF's "rotate_half" layout. The cos/sin tables `[len, head_dim/2]`
/// are computed on first use for the positions needed so far (rounded up to a power of two), not
/// for all `max_position_embeddings`: 32k positions would hold 8 MiB that training never reads.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Tensor,
    /// cos and sin are multiplied by this (YaRN; 1 otherwise).
    scaling: f64,
    max_pos: usize,
    dtype: DType,
    tables: Arc<Mutex<Option<(Tensor, Tensor)>>>,
}

impl Rope {
    /// Plain RoPE with base `theta`.
    pub fn new(head_dim: usize, theta: f64, max_pos: usize, dtype: DType, device: &Device) -> Result<Self> {
        let spec = RopeSpec { theta, scaling: RopeScaling::None, max_positions: max_pos };
        Self::from_spec(head_dim, &spec, dtype, device)
    }

    /// RoPE as a model's `Architecture` describes it (scaling included).
    pub fn from_spec(head_dim: usize, spec: &RopeSpec, dtype: DType, device: &Device) -> Result<Self> {
        let (inv_freq, scaling) = frequencies(head_dim, spec);
        // The tables are computed in f64 and rounded once (transformers computes the angles in
        // f32, which costs up to a few ulp of each angle: ~1e-6 at position 50).
        let inv_freq = Tensor::from_vec(inv_freq, (1, head_dim / 2), device)?;
        let tables = Arc::new(Mutex::new(None));
        Ok(Self { inv_freq, scaling, max_pos: spec.max_positions, dtype, tables })
    }

    fn tables(&self, offset: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let end = offset + len;
        if end > self.max_pos {
            candle_core::bail!("position {end} is past max_position_embeddings ({})", self.max_pos);
        }
        let mut cached =
            self.tables.lock().map_err(|_| candle_core::Error::Msg("RoPE cache poisoned".into()))?;
        if cached.as_ref().is_none_or(|(cos, _)| cos.dim(0).unwrap_or(0) < end) {
            let rows = end.next_power_of_two().max(256).min(self.max_pos);
            let pos = Tensor::arange(0u32, rows as u32, self.inv_freq.device())?.to_dtype(DType::F64)?;
            let angles = pos.reshape((rows, 1))?.broadcast_mul(&self.inv_freq)?;
            let (cos, sin) = (angles.cos()?, angles.sin()?);
            let (cos, sin) = match self.scaling {
                1.0 => (cos, sin),
                s => ((cos * s)?, (sin * s)?),
            };
            *cached = Some((cos.to_dtype(self.dtype)?, sin.to_dtype(self.dtype)?));
        }
        let (cos, sin) = cached.as_ref().expect("filled above");
        Ok((cos.narrow(0, offset, len)?, sin.narrow(0, offset, len)?))
    }

    /// The cos and sin tables `[limit, head_dim / 2]` of positions `0..limit`, in the rope's
    /// dtype: for a kernel that rotates rows at positions it reads on the device.
    pub fn tables_to(&self, limit: usize) -> Result<(Tensor, Tensor)> {
        self.tables(0, limit)
    }

    /// x `[b, heads, t, head_dim]` at positions offset..offset+t.
    pub fn apply(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (cos, sin) = self.tables(offset, x.dim(2)?)?;
        section("rope", x.device(), || rotate(x, &cos, &sin, false))
    }

    /// RoPE is a rotation, so its backward is the rotation by the opposite angle.
    pub fn backward(&self, dy: &Tensor, offset: usize) -> Result<Tensor> {
        let (cos, sin) = self.tables(offset, dy.dim(2)?)?;
        section("rope", dy.device(), || rotate(dy, &cos, &sin, true))
    }

    /// The tables `[b, t, head_dim / 2]` at each token's own position (`positions` `[b · t]`
    /// u32, each below t: packed rows restart at every dialogue).
    fn tables_at(&self, positions: &Tensor, (b, t): (usize, usize)) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.tables(0, t)?;
        let at = |table: &Tensor| table.index_select(positions, 0)?.reshape((b, t, ()));
        Ok((at(&cos)?, at(&sin)?))
    }

    /// x `[b, heads, t, head_dim]`, token (r, i) at `positions[r · t + i]`.
    pub fn apply_at(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let (cos, sin) = self.tables_at(positions, (x.dim(0)?, x.dim(2)?))?;
        section("rope", x.device(), || rotate(x, &cos, &sin, false))
    }

    /// q and k `[b, heads, 1, d]`, row r at position `positions[r]` (u32 `[b]`, each below
    /// `limit`): rows decoded together, each at its own length; the rows' tables gathered once
    /// for both.
    pub fn apply_rows(
        &self,
        (q, k): (&Tensor, &Tensor),
        positions: &Tensor,
        limit: usize,
    ) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.tables(0, limit)?;
        let b = q.dim(0)?;
        let at = |table: &Tensor| table.index_select(positions, 0)?.reshape((b, 1, ()));
        let (cos, sin) = (at(&cos)?, at(&sin)?);
        section("rope", q.device(), || Ok((rotate(q, &cos, &sin, false)?, rotate(k, &cos, &sin, false)?)))
    }

    /// The backward of `apply_at`.
    pub fn backward_at(&self, dy: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let (cos, sin) = self.tables_at(positions, (dy.dim(0)?, dy.dim(2)?))?;
        section("rope", dy.device(), || rotate(dy, &cos, &sin, true))
    }
}

/// x `[b, h, t, d]` rotated, by the opposite angle where `inverse`. A view of `[b, t, h, d]`
/// memory (the projections' own layout, which the CUDA attention reads strided) is rotated in
/// that layout and returned as the same kind of view, so no transpose is ever copied (on CUDA by
/// cuda/rope.rs, candle's arithmetic in 16-byte loads); anything else is made
/// `[b, h, t, d]`-contiguous.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, inverse: bool) -> Result<Tensor> {
    let thd = x.transpose(1, 2)?;
    if thd.is_contiguous() && !x.is_contiguous() {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return crate::cuda::rope::rope_thd(&thd, cos, sin, inverse)?.transpose(1, 2);
        }
        let sin = if inverse { sin.neg()? } else { sin.clone() };
        return candle_nn::rotary_emb::rope_thd(&thd, cos, &sin)?.transpose(1, 2);
    }
    let sin = if inverse { sin.neg()? } else { sin.clone() };
    candle_nn::rotary_emb::rope(&x.contiguous()?, cos, &sin)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{autograd_grad, f64, max_rel, randn};
    use super::*;
    use crate::testing::assert_within_reference_error;
    use candle_core::D;

    /// rotate_half in composed ops, on the rope's own (f32) tables in x's dtype: in f64 it is the
    /// exact rotation by those tables.
    fn rope_slow(x: &Tensor, rope: &Rope) -> Result<Tensor> {
        let (cos, sin) = rope.tables(0, x.dim(2)?)?;
        let (cos, sin) = (cos.to_dtype(x.dtype())?, sin.to_dtype(x.dtype())?);
        let cos = Tensor::cat(&[&cos, &cos], D::Minus1)?;
        let sin = Tensor::cat(&[&sin, &sin], D::Minus1)?;
        let half = x.dim(D::Minus1)? / 2;
        let rotated =
            Tensor::cat(&[&x.narrow(D::Minus1, half, half)?.neg()?, &x.narrow(D::Minus1, 0, half)?], 3)?;
        x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
    }

    #[test]
    fn rope_matches_rotate_half_and_backward_matches_autograd() {
        let rope = Rope::new(8, 10000.0, 32, DType::F32, &Device::Cpu).unwrap();
        let x = randn(&[2, 3, 7, 8], 4);
        let dy = randn(&[2, 3, 7, 8], 5);
        let (x64, dy64) = (f64(&x), f64(&dy));
        let y_exact = rope_slow(&x64, &rope).unwrap();
        let y = rope.apply(&x, 0).unwrap();
        assert_within_reference_error("rope", &y, &rope_slow(&x, &rope).unwrap(), &y_exact);
        let dx = rope.backward(&dy, 0).unwrap();
        let dx_ref = autograd_grad(&x, |x| rope_slow(x, &rope), &dy);
        let dx_exact = autograd_grad(&x64, |x| rope_slow(x, &rope), &dy64);
        assert_within_reference_error("rope dx", &dx, &dx_ref, &dx_exact);
    }

    /// RoPE on a `[b, h, t, d]` view of `[b, t, h, d]` memory (rotated in place of layout) equals
    /// RoPE on the contiguous heads, forward and backward, and stays a view.
    #[test]
    fn rope_on_a_head_view_equals_rope_on_contiguous_heads() {
        let rope = Rope::new(16, 10_000.0, 64, DType::F32, &Device::Cpu).unwrap();
        // the same tables (computed in f32, then cast) for the exact backward of the contiguous heads
        let rope64 = Rope::new(16, 10_000.0, 64, DType::F64, &Device::Cpu).unwrap();
        let thd = randn(&[2, 7, 3, 16], 21);
        let view = thd.transpose(1, 2).unwrap();
        let contiguous = view.contiguous().unwrap();
        for offset in [0, 5] {
            let (a, b) = (rope.apply(&view, offset).unwrap(), rope.apply(&contiguous, offset).unwrap());
            assert!(!a.is_contiguous() && a.transpose(1, 2).unwrap().is_contiguous());
            assert_eq!(max_rel(&a.contiguous().unwrap(), &b), 0.0);
            let (a, b) = (rope.backward(&view, offset).unwrap(), rope.backward(&contiguous, offset).unwrap());
            let exact = rope64.backward(&f64(&contiguous), offset).unwrap();
            assert_within_reference_error(
                &format!("rope backward on a view, offset {offset}"),
                &a.contiguous().unwrap(),
                &b,
                &exact,
            );
        }
    }
}
