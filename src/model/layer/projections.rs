//! The two ways a layer runs its projections, for the untiled passes (mod.rs) and the tiled MLP
//! (tiles.rs) alike: one projection's output into a sum of products, and the summed input
//! gradient of the projections that read one input.

use candle_core::{Result, Tensor};

use crate::model::lora::group::LoraGroup;
use crate::model::lora::linear::{DropoutSeed, LoraGrad, LoraLinear};
use crate::model::ops::product_sum::ProductSum;

/// proj(x) into `out`: member i of `group`'s low-rank output and the base GEMM, or the
/// projection's own path (with its dropout mask drawn from `seed`).
pub(super) fn project_into(
    proj: &LoraLinear,
    x: &Tensor,
    seed: Option<DropoutSeed>,
    group: Option<(&LoraGroup, usize)>,
    out: &mut ProductSum,
) -> Result<()> {
    match group {
        Some((g, i)) => {
            g.add_output(i, out)?;
            proj.base_forward_into(x, out)
        }
        None => proj.forward_into(x, seed, out),
    }
}

/// The input gradient of projections that all read x, given each one's output gradient, summed
/// in one buffer; and their LoRA gradients (compute dtype), in order.
pub(super) fn backward_shared_input(
    x: &Tensor,
    uses: &[(&LoraLinear, Option<DropoutSeed>, &Tensor)],
    group: Option<&LoraGroup>,
) -> Result<(Tensor, Vec<Option<LoraGrad>>)> {
    let mut dx = ProductSum::new();
    let grads = match group {
        Some(g) => {
            let dys: Vec<&Tensor> = uses.iter().map(|&(_, _, dy)| dy).collect();
            let grads = g.backward(x, &dys, &mut dx)?.into_iter().map(Some).collect();
            for &(proj, _, dy) in uses {
                proj.base_backward_into(dy, &mut dx)?;
            }
            grads
        }
        None => uses
            .iter()
            .map(|&(proj, seed, dy)| proj.backward_into(x, dy, seed, &mut dx))
            .collect::<Result<Vec<_>>>()?,
    };
    Ok((dx.finish()?, grads))
}
