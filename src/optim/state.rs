//! What the AdamW optimizers share: checking gradients against parameters, and reading a
//! checkpoint's state tensors back.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor, Var};

/// The gradient of `var` for an update: detached, f32, in the parameter's shape.
pub(super) fn grad_for(var: &Var, grad: &Tensor, index: usize) -> Result<Tensor> {
    let p = var.as_tensor();
    if p.dtype() != DType::F32 {
        bail!("optim: parameter {index} is {:?}; AdamW keeps f32 parameters", p.dtype());
    }
    let g = grad.detach().to_dtype(DType::F32)?;
    g.reshape(p.shape()).with_context(|| format!("optim: gradient {index} vs its parameter"))
}

pub(super) fn check_counts(grads: usize, params: usize) -> Result<()> {
    if grads != params {
        bail!("optim: {grads} gradients for {params} parameters");
    }
    Ok(())
}

/// Entry `name` of a saved state, shaped and typed as `like`, copied onto `like`'s device (the
/// CUDA steps update the state in place, and `tensors` is the caller's).
pub(super) fn take(tensors: &HashMap<String, Tensor>, name: &str, like: &Tensor) -> Result<Tensor> {
    let Some(t) = tensors.get(name) else { bail!("optim state: {name} missing") };
    if t.dims() != like.dims() {
        bail!("optim state: {name} has shape {:?}, expected {:?}", t.dims(), like.dims());
    }
    if t.dtype() != like.dtype() {
        bail!("optim state: {name} is {:?}, expected {:?}", t.dtype(), like.dtype());
    }
    Ok(t.to_device(like.device())?.copy()?)
}

/// Refuses a saved state with entries this optimizer does not have (another optimizer's).
pub(super) fn no_strangers(
    tensors: &HashMap<String, Tensor>,
    ours: &[(String, Tensor)],
    what: &str,
) -> Result<()> {
    if let Some(name) = tensors.keys().find(|k| !ours.iter().any(|(n, _)| n == *k)) {
        bail!("optim state: {name} is not part of {what}'s state (a checkpoint of another optimizer?)");
    }
    Ok(())
}
