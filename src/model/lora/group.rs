//! The LoRA half of the projections that read one input (q/k/v, gate/up, or one projection
//! alone), run together: h = x·[A₁; …; Aₙ]ᵀ is one skinny GEMM that reads x once instead of n
//! times, and each out_i += h_i·(scale_i·B_i)ᵀ. The backward reads x once more for all the A
//! gradients, [dh₁ … dhₙ]ᵀ·x, and adds the input gradient [dh₁ … dhₙ]·[A₁; …; Aₙ] in one GEMM.
//! `LayerSaved` keeps a group from the recompute, so the backward neither converts the weights
//! nor recomputes h again. Without dropout only: each projection draws its own dropout mask on
//! x (PEFT's rule), so with dropout on, `LoraLinear`'s per-projection path runs instead.

use candle_core::{Result, Tensor};

use super::adapter;
use super::linear::{LoraGrad, LoraLinear};
use crate::model::ops::product_sum::{Product, ProductSum};
use crate::profile::section;

/// One group's LoRA weights in the compute dtype and its low-rank activations.
pub struct LoraGroup {
    /// [A₁; …; Aₙ], `[Σr, in]`.
    a: Tensor,
    /// scale_i·B_i, `[out_i, r_i]`.
    scaled_b: Vec<Tensor>,
    scales: Vec<f64>,
    ranks: Vec<usize>,
    /// x·aᵀ, `[n, Σr]`.
    h: Tensor,
}

impl LoraGroup {
    /// The group of `projs` on input x `[n, in]`, or `None` when one of them has no adapter or
    /// `dropout` is on for one of them (then the per-projection path runs).
    pub fn forward(projs: &[&LoraLinear], x: &Tensor, dropout: bool) -> Result<Option<Self>> {
        let Some(adapters) = projs.iter().map(|p| p.lora.as_ref()).collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        if adapters.is_empty() || (dropout && adapters.iter().any(|l| l.dropout > 0.0)) {
            return Ok(None);
        }
        let dev = x.device();
        let (a, scaled_b) = section("lora.weights", dev, || adapter::compute_dtype(&adapters, x.dtype()))?;
        let h = section("lora.x_a", dev, || Product::nt(x, &a).eval())?;
        let scales = adapters.iter().map(|l| l.scale).collect();
        let ranks = adapters.iter().map(|l| l.rank()).collect();
        Ok(Some(Self { a, scaled_b, scales, ranks, h }))
    }

    /// h = x·aᵀ, the group's one activation (the weights' compute-dtype copies are not), for
    /// offloading.
    pub fn activation_mut(&mut self) -> &mut Tensor {
        &mut self.h
    }

    /// Columns of projection i in h (and rows in a).
    fn span(&self, i: usize) -> (usize, usize) {
        (self.ranks[..i].iter().sum(), self.ranks[i])
    }

    /// h_i `[n, r_i]`: a column slice of h, which cuBLAS reads in place.
    fn h_part(&self, i: usize) -> Result<Tensor> {
        let (start, len) = self.span(i);
        self.h.narrow(1, start, len)
    }

    /// out += h_i·(scale_i·B_i)ᵀ: projection i's low-rank output.
    pub fn add_output(&self, i: usize, out: &mut ProductSum) -> Result<()> {
        let h = self.h_part(i)?;
        section("lora.h_b", h.device(), || out.add_product(Product::nt(&h, &self.scaled_b[i])))
    }

    /// Given x and each member's output gradient dy_i, adds the low-rank input gradient to dx and
    /// returns the members' adapter gradients (compute dtype), in order.
    pub fn backward(&self, x: &Tensor, dys: &[&Tensor], dx: &mut ProductSum) -> Result<Vec<LoraGrad>> {
        self.backward_before_x(dys, dx)?.finish(x)
    }

    /// `backward` up to what needs x: the B gradients and dh, and dh·[A₁; …; Aₙ] added to dx; the
    /// A gradients, [dh₁ … dhₙ]ᵀ·x, once x is at hand (`PendingGrads::finish`). The gated MLP's
    /// backward makes down's x, the activation, in the pass that takes dx (mlp.rs
    /// `gated_backward_with_act`).
    pub fn backward_before_x(&self, dys: &[&Tensor], dx: &mut ProductSum) -> Result<PendingGrads> {
        section("lora.backward", self.a.device(), || {
            // dh = [dy₁·(scale₁·B₁) … dyₙ·(scaleₙ·Bₙ)], each member's product into its columns
            let width = self.ranks.iter().sum();
            let (mut dh, mut grad_b) = (ProductSum::new(), Vec::with_capacity(dys.len()));
            for (i, dy) in dys.iter().enumerate() {
                let h = self.h_part(i)?;
                grad_b.push(Product::tn(dy, &h).scaled(self.scales[i]).eval()?); // [out, r]
                dh.add_product_to_columns(Product::nn(dy, &self.scaled_b[i]), self.span(i).0, width)?;
            }
            let dh = dh.finish()?;
            dx.add_product(Product::nn(&dh, &self.a))?;
            Ok(PendingGrads { dh, grad_b, ranks: self.ranks.clone() })
        })
    }
}

/// A group's adapter gradients but for the A gradients, which wait for the members' input x.
pub struct PendingGrads {
    /// [dh₁ … dhₙ], `[n, Σr]`.
    dh: Tensor,
    grad_b: Vec<Tensor>,
    ranks: Vec<usize>,
}

impl PendingGrads {
    /// The members' gradients, in order, given their input x `[n, in]`.
    pub fn finish(self, x: &Tensor) -> Result<Vec<LoraGrad>> {
        section("lora.backward", x.device(), || {
            let grad_a = Product::tn(&self.dh, x).eval()?; // [Σr, in]
            let mut start = 0;
            self.grad_b
                .into_iter()
                .zip(&self.ranks)
                .map(|(lora_b, &len)| {
                    let lora_a = grad_a.narrow(0, start, len)?;
                    start += len;
                    Ok(LoraGrad { lora_a, lora_b })
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::reference::{linear_f64, random_layer};
    use crate::testing::assert_within_reference_error;
    use candle_core::{DType, Device};

    /// q/k/v and gate/up of a random layer through one group each equal every projection's own
    /// path: outputs, adapter gradients and the summed input gradient. Both are f32 paths of ours
    /// that agree up to rounding; the own path run in f64 is the exact answer.
    #[test]
    fn a_group_equals_its_projections_run_one_by_one() -> Result<()> {
        let dev = Device::Cpu;
        let layer = random_layer(32, 48, 4, 2, 3, 21);
        let x = Tensor::randn(0f32, 1.0, (7, 32), &dev)?;
        let x64 = x.to_dtype(DType::F64)?;
        for members in [&[0usize, 1, 2][..], &[4, 5][..]] {
            let projs: Vec<&LoraLinear> = members.iter().map(|&p| &layer.proj[p]).collect();
            let group = LoraGroup::forward(&projs, &x, false)?.expect("every member has an adapter");
            let dys = projs
                .iter()
                .map(|p| Tensor::randn(0f32, 1.0, (7, p.base.dims().0), &dev))
                .collect::<Result<Vec<_>>>()?;
            let (mut dx_group, mut dx_own, mut dx_exact) =
                (ProductSum::new(), ProductSum::new(), ProductSum::new());
            let grads = group.backward(&x, &dys.iter().collect::<Vec<_>>(), &mut dx_group)?;
            for (i, p) in projs.iter().enumerate() {
                let p64 = linear_f64(p);
                let dy64 = dys[i].to_dtype(DType::F64)?;
                let mut out = ProductSum::new();
                group.add_output(i, &mut out)?;
                p.base_forward_into(&x, &mut out)?;
                let what = |name: &str| format!("members {members:?}, {i}: {name}");
                assert_within_reference_error(
                    &what("output"),
                    &out.finish()?,
                    &p.forward(&x, None)?,
                    &p64.forward(&x64, None)?,
                );
                p.base_backward_into(&dys[i], &mut dx_group)?;
                let own = p.backward_into(&x, &dys[i], None, &mut dx_own)?.expect("an adapter");
                let exact = p64.backward_into(&x64, &dy64, None, &mut dx_exact)?.expect("an adapter");
                assert_within_reference_error(&what("grad A"), &grads[i].lora_a, &own.lora_a, &exact.lora_a);
                assert_within_reference_error(&what("grad B"), &grads[i].lora_b, &own.lora_b, &exact.lora_b);
            }
            assert_within_reference_error(
                &format!("members {members:?}: dx"),
                &dx_group.finish()?,
                &dx_own.finish()?,
                &dx_exact.finish()?,
            );
        }
        Ok(())
    }

    #[test]
    fn dropout_or_a_member_without_adapter_leaves_the_projections_on_their_own() -> Result<()> {
        let layer = random_layer(32, 48, 4, 2, 3, 5);
        let x = Tensor::randn(0f32, 1.0, (3, 32), &Device::Cpu)?;
        let mut dropped = layer.proj[0].clone();
        dropped.lora.as_mut().expect("an adapter").dropout = 0.1;
        assert!(LoraGroup::forward(&[&dropped, &layer.proj[1]], &x, true)?.is_none());
        // eval mode draws no mask: the group runs
        assert!(LoraGroup::forward(&[&dropped, &layer.proj[1]], &x, false)?.is_some());
        let mut bare = layer.proj[1].clone();
        bare.lora = None;
        assert!(LoraGroup::forward(&[&layer.proj[0], &bare], &x, false)?.is_none());
        Ok(())
    }
}
