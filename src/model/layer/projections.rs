//! The two ways a layer runs its projections, for the untiled passes (mod.rs) and the tiled MLP
//! (tiles.rs) alike: one projection's output into a sum of products, and the summed input
//! gradient of the projections that read one input.

use candle_core::{Result, Tensor};

use crate::model::lora::group::{LoraGroup, PendingGrads};
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
    match group {
        Some(g) => {
            let (dx, pending) = group_backward_before_x(uses, g)?;
            Ok((dx, pending.finish(x)?.into_iter().map(Some).collect()))
        }
        None => {
            let mut dx = ProductSum::new();
            let grads = uses
                .iter()
                .map(|&(proj, seed, dy)| proj.backward_into(x, dy, seed, &mut dx))
                .collect::<Result<Vec<_>>>()?;
            Ok((dx.finish()?, grads))
        }
    }
}

/// `backward_shared_input` through `group` before x is needed: the summed input gradient, and
/// the LoRA gradients waiting for x (`PendingGrads::finish`).
pub(super) fn group_backward_before_x(
    uses: &[(&LoraLinear, Option<DropoutSeed>, &Tensor)],
    group: &LoraGroup,
) -> Result<(Tensor, PendingGrads)> {
    let mut dx = ProductSum::new();
    let dys: Vec<&Tensor> = uses.iter().map(|&(_, _, dy)| dy).collect();
    let pending = group.backward_before_x(&dys, &mut dx)?;
    for &(proj, _, dy) in uses {
        proj.base_backward_into(dy, &mut dx)?;
    }
    Ok((dx.finish()?, pending))
}
