//! Adafactor (Shazeer & Stern 2018) in two flavors that differ in details and are both in use:
//!
//! * `torch`: `torch.optim.Adafactor`. The lr passed to `step` caps the relative step,
//!   rho_t = min(lr, 1/sqrt(t)), and the step is scaled by max(eps2, RMS(param)); weight decay is
//!   decoupled, param *= 1 - lr * wd (applied after the RMS is taken). eps1 (`None`: the dtype's
//!   machine epsilon) bounds the row-mean normalizer and sqrt(V) from below.
//! * `hf`: `transformers.optimization.Adafactor`. The lr passed to `step` is the step size itself
//!   unless `relative_step` (then min(1e-2 or 1e-6 t with `warmup_init`, 1/sqrt(t)) and the lr
//!   passed is ignored); `scale_parameter` multiplies it by max(eps2, RMS(param)). eps1 (`None`:
//!   1e-30, hf's default) is added to the squared gradient; the optional first moment (beta1)
//!   averages the clipped, lr-scaled update; weight decay is param -= wd * lr_t * param.
//!
//! Both factor the second moment of tensors with 2 or more dims over the last two (row and column
//! means); vectors and 0-dim tensors keep a full second moment. The state is kept in the
//! parameter's dtype and device, row factors as [.., n, 1] and column factors as [.., 1, m].
//! Everything per step is tensor ops on the parameter's device: no value leaves it.

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_core::{DType, Tensor, Var, D};

use crate::config::{AdafactorFlavor, AdafactorSection};

#[derive(Debug, thiserror::Error)]
pub enum AdafactorError {
    #[error("optim: {0} is not part of flavor = \"torch\" (torch.optim.Adafactor); use flavor = \"hf\"")]
    NotInTorch(&'static str),
    #[error("optim: warmup_init needs relative_step (as in transformers' Adafactor)")]
    WarmupWithoutRelativeStep,
    #[error("optim: flavor = \"torch\" needs clip_threshold >= 1 (torch.optim.Adafactor's d), got {0}")]
    TorchClipBelowOne(f64),
    #[error("optim: parameter {index} is {dtype:?}; Adafactor needs a float parameter")]
    NotFloat { index: usize, dtype: DType },
    #[error("optim: {got} gradients for {want} parameters")]
    GradCount { got: usize, want: usize },
    #[error("optim state: {name} missing")]
    MissingState { name: String },
    #[error("optim state: {name} has shape {got:?}, expected {want:?}")]
    StateShape { name: String, got: Vec<usize>, want: Vec<usize> },
}

/// Second-moment estimate of one parameter.
#[derive(Debug, Clone)]
enum SecondMoment {
    /// Running means of the squared gradient over the last dim (`row`, [.., n, 1]) and the
    /// second-to-last dim (`col`, [.., 1, m]).
    Factored { row: Tensor, col: Tensor },
    /// Running mean of the squared gradient (vectors, scalars).
    Full(Tensor),
}

#[derive(Debug, Clone)]
struct ParamState {
    second: SecondMoment,
    /// hf only, with beta1: running mean of the update.
    exp_avg: Option<Tensor>,
}

pub struct Adafactor {
    params: Vec<Var>,
    states: Vec<ParamState>,
    cfg: AdafactorSection,
    weight_decay: f64,
    step: u64,
}

impl Adafactor {
    /// `weight_decay` is `train.weight_decay`. Rejects settings the chosen flavor does not have,
    /// exactly where the reference implementation raises.
    pub fn new(params: Vec<Var>, cfg: &AdafactorSection, weight_decay: f64) -> Result<Self> {
        check_flavor(cfg)?;
        let states = params
            .iter()
            .enumerate()
            .map(|(index, p)| fresh_state(p.as_tensor(), cfg, index))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { params, states, cfg: cfg.clone(), weight_decay, step: 0 })
    }

    /// Optimizer steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn params(&self) -> &[Var] {
        &self.params
    }

    /// One step; `grads[i]` is the gradient of `params[i]` (cast to its dtype). `lr` is this
    /// step's scheduled lr; hf with `relative_step` ignores it.
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<()> {
        if grads.len() != self.params.len() {
            return Err(AdafactorError::GradCount { got: grads.len(), want: self.params.len() }.into());
        }
        self.step += 1;
        let t = self.step as f64;
        for (i, (var, grad)) in self.params.iter().zip(grads).enumerate() {
            // Detached: the update must not build an autograd graph through the Var.
            let p = var.as_tensor().detach();
            let g = grad.detach().to_dtype(p.dtype())?;
            let g = g.reshape(p.shape()).with_context(|| format!("optim: gradient {i} vs its parameter"))?;
            let state = &mut self.states[i];
            let new = match self.cfg.flavor {
                AdafactorFlavor::Torch => torch_step(&p, &g, state, &self.cfg, self.weight_decay, t, lr)?,
                AdafactorFlavor::Hf => hf_step(&p, &g, state, &self.cfg, self.weight_decay, t, lr)?,
            };
            var.set(&new)?;
        }
        Ok(())
    }

    /// One step on `grads[i] · grad_mult` (the loss-scale and clipping factor, folded in here so
    /// the gradients are read once). On CUDA, with 2-D f32 parameters, it is one fused kernel
    /// launch (`cuda.rs`) instead of ~25 tensor ops per parameter.
    pub fn step_scaled(&mut self, grads: &[Tensor], grad_mult: f64, lr: f64) -> Result<()> {
        #[cfg(feature = "cuda")]
        if self.fused_fits(grads) {
            self.step += 1;
            return self.fused_step(grads, grad_mult, lr);
        }
        let scaled = super::clip::scaled_grads(grads, grad_mult)?;
        self.step(&scaled, lr)
    }

    #[cfg(feature = "cuda")]
    fn fused_fits(&self, grads: &[Tensor]) -> bool {
        use crate::cuda::adafactor::{fits, fits_parameter};
        grads.len() == self.params.len()
            && crate::cuda::adafactor::fits_grads(grads.iter())
            && self.params.iter().zip(grads).zip(&self.states).all(|((p, g), s)| {
                let p = p.as_tensor();
                let state_fits = match &s.second {
                    SecondMoment::Factored { row, col } => fits(row) && fits(col),
                    SecondMoment::Full(_) => false,
                };
                fits_parameter(p) && g.dims() == p.dims() && state_fits && s.exp_avg.as_ref().is_none_or(fits)
            })
    }

    #[cfg(feature = "cuda")]
    fn fused_step(&mut self, grads: &[Tensor], grad_mult: f64, lr: f64) -> Result<()> {
        use crate::cuda::adafactor::{step, FusedParam};
        let h = hyper(&self.cfg, self.weight_decay, self.step as f64, lr, grad_mult);
        let mut params = Vec::with_capacity(self.params.len());
        for ((var, g), s) in self.params.iter().zip(grads).zip(&self.states) {
            let SecondMoment::Factored { row, col } = &s.second else {
                anyhow::bail!("optim: the fused step needs factored second moments");
            };
            params.push(FusedParam { p: var.as_tensor(), g, row, col, exp_avg: s.exp_avg.as_ref() });
        }
        step(&params, &h).context("optim: fused Adafactor step")
    }

    /// The state to checkpoint, by name (`param.<i>.row|col|sq|exp_avg`); the step count is
    /// saved beside it. The tensors share the live state's memory, which the CUDA step updates in
    /// place: write them out before the next step.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, s) in self.states.iter().enumerate() {
            match &s.second {
                SecondMoment::Factored { row, col } => {
                    out.push((format!("param.{i}.row"), row.clone()));
                    out.push((format!("param.{i}.col"), col.clone()));
                }
                SecondMoment::Full(sq) => out.push((format!("param.{i}.sq"), sq.clone())),
            }
            if let Some(m) = &s.exp_avg {
                out.push((format!("param.{i}.exp_avg"), m.clone()));
            }
        }
        out
    }

    /// Restores the state written by `state_tensors` after `step` steps, moving it to each
    /// parameter's device and dtype. All-or-nothing: on error the current state is kept.
    pub fn load_state(&mut self, tensors: &HashMap<String, Tensor>, step: u64) -> Result<()> {
        let take = |name: String, like: &Tensor| -> Result<Tensor> {
            let t = tensors.get(&name).ok_or_else(|| AdafactorError::MissingState { name: name.clone() })?;
            if t.dims() != like.dims() {
                let (got, want) = (t.dims().to_vec(), like.dims().to_vec());
                return Err(AdafactorError::StateShape { name, got, want }.into());
            }
            // A copy: the CUDA step updates the state in place, and `tensors` is the caller's.
            Ok(t.to_device(like.device())?.to_dtype(like.dtype())?.copy()?)
        };
        let mut loaded = Vec::with_capacity(self.states.len());
        for (i, s) in self.states.iter().enumerate() {
            let second = match &s.second {
                SecondMoment::Factored { row, col } => SecondMoment::Factored {
                    row: take(format!("param.{i}.row"), row)?,
                    col: take(format!("param.{i}.col"), col)?,
                },
                SecondMoment::Full(sq) => SecondMoment::Full(take(format!("param.{i}.sq"), sq)?),
            };
            let exp_avg = match &s.exp_avg {
                Some(m) => Some(take(format!("param.{i}.exp_avg"), m)?),
                None => None,
            };
            loaded.push(ParamState { second, exp_avg });
        }
        self.states = loaded;
        self.step = step;
        Ok(())
    }
}

fn check_flavor(cfg: &AdafactorSection) -> Result<(), AdafactorError> {
    if cfg.flavor == AdafactorFlavor::Torch {
        for (on, name) in [
            (cfg.beta1.is_some(), "beta1"),
            (cfg.relative_step, "relative_step"),
            (cfg.scale_parameter, "scale_parameter"),
            (cfg.warmup_init, "warmup_init"),
        ] {
            if on {
                return Err(AdafactorError::NotInTorch(name));
            }
        }
        if cfg.clip_threshold < 1.0 {
            return Err(AdafactorError::TorchClipBelowOne(cfg.clip_threshold));
        }
    }
    if cfg.warmup_init && !cfg.relative_step {
        return Err(AdafactorError::WarmupWithoutRelativeStep);
    }
    Ok(())
}

fn fresh_state(p: &Tensor, cfg: &AdafactorSection, index: usize) -> Result<ParamState> {
    if !p.dtype().is_float() {
        return Err(AdafactorError::NotFloat { index, dtype: p.dtype() }.into());
    }
    let dims = p.dims();
    let second = if dims.len() >= 2 {
        let (mut row, mut col) = (dims.to_vec(), dims.to_vec());
        row[dims.len() - 1] = 1;
        col[dims.len() - 2] = 1;
        let zeros = |shape: &[usize]| Tensor::zeros(shape, p.dtype(), p.device());
        SecondMoment::Factored { row: zeros(&row)?, col: zeros(&col)? }
    } else {
        SecondMoment::Full(p.zeros_like()?)
    };
    let exp_avg = match cfg.beta1 {
        Some(_) => Some(p.zeros_like()?),
        None => None,
    };
    Ok(ParamState { second, exp_avg })
}

/// Root mean square of all elements, as a 0-dim tensor.
fn rms(x: &Tensor) -> candle_core::Result<Tensor> {
    x.sqr()?.mean_all()?.sqrt()
}

/// `start.lerp_(end, w)` with torch's CPU formula (the branch keeps w = 1 exact).
pub(super) fn lerp(start: &Tensor, end: &Tensor, w: f64) -> candle_core::Result<Tensor> {
    let diff = end.sub(start)?;
    if w < 0.5 {
        start.add(&diff.affine(w, 0.0)?)
    } else {
        end.sub(&diff.affine(1.0 - w, 0.0)?)
    }
}

/// The dtype's machine epsilon: torch's `finfo(dtype).eps`, eps1's default in the torch flavor.
pub(super) fn machine_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f64::from(half::f16::EPSILON),
        DType::BF16 => f64::from(half::bf16::EPSILON),
        DType::F64 => f64::EPSILON,
        _ => f64::from(f32::EPSILON),
    }
}

/// One parameter's new value under `torch.optim.Adafactor` (`_single_tensor_adafactor`).
fn torch_step(
    p: &Tensor,
    g: &Tensor,
    state: &mut ParamState,
    cfg: &AdafactorSection,
    weight_decay: f64,
    t: f64,
    lr: f64,
) -> Result<Tensor> {
    let eps1 = cfg.eps1.unwrap_or_else(|| machine_eps(p.dtype()));
    let one_minus_beta2 = t.powf(cfg.decay_rate);
    let rho = lr.min(1.0 / t.sqrt());
    let alpha = rms(p)?.maximum(cfg.eps2)?.affine(rho, 0.0)?;
    let p = if weight_decay != 0.0 { p.affine(1.0 - lr * weight_decay, 0.0)? } else { p.clone() };
    let var = match &mut state.second {
        SecondMoment::Factored { row, col } => {
            let g2 = g.sqr()?;
            *row = lerp(row, &g2.mean_keepdim(D::Minus1)?, one_minus_beta2)?;
            *col = lerp(col, &g2.mean_keepdim(D::Minus2)?, one_minus_beta2)?;
            let row_mean = row.mean_keepdim(D::Minus2)?.maximum(eps1)?;
            row.broadcast_mul(col)?.broadcast_div(&row_mean)?
        }
        SecondMoment::Full(sq) => {
            *sq = lerp(sq, &g.sqr()?, one_minus_beta2)?;
            sq.clone()
        }
    };
    let update = var.maximum(eps1 * eps1)?.sqrt()?.recip()?.mul(g)?;
    let denom = rms(&update)?.affine(1.0 / cfg.clip_threshold, 0.0)?.maximum(1.0)?;
    Ok(p.sub(&update.broadcast_mul(&alpha.div(&denom)?)?)?)
}

/// hf's default eps1 (`eps=(1e-30, 1e-3)`).
pub(super) const HF_EPS1: f64 = 1e-30;

/// One parameter's new value under `transformers.optimization.Adafactor`.
fn hf_step(
    p: &Tensor,
    g: &Tensor,
    state: &mut ParamState,
    cfg: &AdafactorSection,
    weight_decay: f64,
    t: f64,
    lr: f64,
) -> Result<Tensor> {
    let lr_t = hf_lr(p, cfg, t, lr)?;
    let beta2t = 1.0 - t.powf(cfg.decay_rate);
    let ema = |avg: &Tensor, x: &Tensor| avg.affine(beta2t, 0.0)?.add(&x.affine(1.0 - beta2t, 0.0)?);
    let sq_grad = g.sqr()?.affine(1.0, cfg.eps1.unwrap_or(HF_EPS1))?;
    let update = match &mut state.second {
        SecondMoment::Factored { row, col } => {
            *row = ema(row, &sq_grad.mean_keepdim(D::Minus1)?)?;
            *col = ema(col, &sq_grad.mean_keepdim(D::Minus2)?)?;
            // _approx_sq_grad: rsqrt(row / mean(row)) * rsqrt(col).
            let r_factor = row.broadcast_div(&row.mean_keepdim(D::Minus2)?)?.sqrt()?.recip()?;
            let c_factor = col.sqrt()?.recip()?;
            r_factor.broadcast_mul(&c_factor)?.mul(g)?
        }
        SecondMoment::Full(sq) => {
            *sq = ema(sq, &sq_grad)?;
            sq.sqrt()?.recip()?.mul(g)?
        }
    };
    let denom = rms(&update)?.affine(1.0 / cfg.clip_threshold, 0.0)?.maximum(1.0)?;
    let mut update = update.broadcast_div(&denom)?.broadcast_mul(&lr_t)?;
    if let (Some(beta1), Some(m)) = (cfg.beta1, state.exp_avg.as_mut()) {
        *m = m.affine(beta1, 0.0)?.add(&update.affine(1.0 - beta1, 0.0)?)?;
        update = m.clone();
    }
    let p = if weight_decay != 0.0 {
        p.add(&p.broadcast_mul(&lr_t.affine(-weight_decay, 0.0)?)?)?
    } else {
        p.clone()
    };
    Ok(p.sub(&update)?)
}

/// hf's `_get_lr`, as a 0-dim tensor (with `scale_parameter` it depends on the parameter RMS).
fn hf_lr(p: &Tensor, cfg: &AdafactorSection, t: f64, lr: f64) -> Result<Tensor> {
    let step_size = hf_step_size(cfg, t, lr);
    Ok(if cfg.scale_parameter {
        rms(p)?.maximum(cfg.eps2)?.affine(step_size, 0.0)?
    } else {
        Tensor::full(step_size, (), p.device())?.to_dtype(p.dtype())?
    })
}

/// hf's step size before parameter scaling: the lr passed, or the relative step.
pub(super) fn hf_step_size(cfg: &AdafactorSection, t: f64, lr: f64) -> f64 {
    if cfg.relative_step {
        let cap = if cfg.warmup_init { 1e-6 * t } else { 1e-2 };
        cap.min(1.0 / t.sqrt())
    } else {
        lr
    }
}

#[cfg(feature = "cuda")]
/// The fused kernel's scalars of step `t` (1-based), exactly as `torch_step`/`hf_step` derive them.
fn hyper(
    cfg: &AdafactorSection,
    weight_decay: f64,
    t: f64,
    lr: f64,
    grad_mult: f64,
) -> crate::cuda::adafactor::Hyper {
    let hf = cfg.flavor == AdafactorFlavor::Hf;
    let (w, eps1, step_size, decay) = if hf {
        (1.0 - t.powf(cfg.decay_rate), cfg.eps1.unwrap_or(HF_EPS1), hf_step_size(cfg, t, lr), -weight_decay)
    } else {
        let eps1 = cfg.eps1.unwrap_or_else(|| machine_eps(DType::F32));
        (t.powf(cfg.decay_rate), eps1, lr.min(1.0 / t.sqrt()), 1.0 - lr * weight_decay)
    };
    let beta1 = cfg.beta1.unwrap_or(0.0);
    crate::cuda::adafactor::Hyper {
        hf: hf as i32,
        grad_mult: grad_mult as f32,
        w: w as f32,
        one_minus_w: (1.0 - w) as f32,
        lerp_low: (w < 0.5) as i32,
        eps1: eps1 as f32,
        eps1_sq: (eps1 * eps1) as f32,
        eps2: cfg.eps2 as f32,
        step_size: step_size as f32,
        scale_parameter: cfg.scale_parameter as i32,
        inv_clip: (1.0 / cfg.clip_threshold) as f32,
        weight_decay_on: (weight_decay != 0.0) as i32,
        decay: decay as f32,
        beta1_on: cfg.beta1.is_some() as i32,
        beta1: beta1 as f32,
        one_minus_beta1: (1.0 - beta1) as f32,
    }
}

#[cfg(test)]
#[path = "adafactor_tests.rs"]
mod tests;
