//! AdamW as `torch.optim.AdamW` computes it (`_single_tensor_adam` with decoupled weight decay,
//! torch 2.x), per parameter and step t:
//!
//! ```text
//! p  *= 1 - lr·wd                                  (weight decay first, when wd ≠ 0)
//! m   = m.lerp(g, 1 - β1)                          (= β1·m + (1-β1)·g)
//! v   = β2·v + (1-β2)·g·g
//! p  -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + eps)
//! ```
//!
//! The state (`exp_avg` m, `exp_avg_sq` v) is f32 like the LoRA parameters. On the CPU it is
//! composed tensor ops; on CUDA with f32 parameters one fused launch updates every parameter
//! (`crate::cuda::adamw`).

use std::collections::HashMap;

#[cfg(feature = "cuda")]
use anyhow::Context;
use anyhow::Result;
use candle_core::{DType, Tensor, Var};

use super::adafactor::lerp;
use super::state::{check_counts, grad_for, no_strangers, take};
use crate::config::AdamwSection;

pub struct AdamW {
    params: Vec<Var>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    cfg: AdamwSection,
    weight_decay: f64,
    step: u64,
}

/// torch's scalars of step `t`: (lr/(1-β1^t), sqrt(1-β2^t)), in f64 as Python computes them.
pub(super) fn corrections(cfg: &AdamwSection, lr: f64, t: f64) -> (f64, f64) {
    let bias_correction1 = 1.0 - cfg.beta1.powf(t);
    let bias_correction2 = 1.0 - cfg.beta2.powf(t);
    (lr / bias_correction1, bias_correction2.sqrt())
}

impl AdamW {
    /// `weight_decay` is `train.weight_decay`.
    pub fn new(params: Vec<Var>, cfg: &AdamwSection, weight_decay: f64) -> Result<Self> {
        let zeros = |p: &Var| -> Result<Tensor> {
            anyhow::ensure!(
                p.dtype() == DType::F32,
                "optim: AdamW keeps f32 parameters, got {:?}",
                p.dtype()
            );
            Ok(p.as_tensor().zeros_like()?)
        };
        let exp_avg = params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        let exp_avg_sq = params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        Ok(Self { params, exp_avg, exp_avg_sq, cfg: *cfg, weight_decay, step: 0 })
    }

    pub fn step_count(&self) -> u64 {
        self.step
    }

    pub fn params(&self) -> &[Var] {
        &self.params
    }

    /// One step; `grads[i]` is the gradient of `params[i]`, `lr` this step's lr.
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<()> {
        check_counts(grads.len(), self.params.len())?;
        self.step += 1;
        let (step_size, bias_correction2_sqrt) = corrections(&self.cfg, lr, self.step as f64);
        let (beta1, beta2) = (self.cfg.beta1, self.cfg.beta2);
        for (i, (var, grad)) in self.params.iter().zip(grads).enumerate() {
            let g = grad_for(var, grad, i)?;
            let mut p = var.as_tensor().detach();
            if self.weight_decay != 0.0 {
                p = p.affine(1.0 - lr * self.weight_decay, 0.0)?;
            }
            let m = lerp(&self.exp_avg[i], &g, 1.0 - beta1)?;
            // addcmul: v + (value·g)·g
            let v = self.exp_avg_sq[i].affine(beta2, 0.0)?.add(&g.affine(1.0 - beta2, 0.0)?.mul(&g)?)?;
            let denom = v.sqrt()?.affine(1.0 / bias_correction2_sqrt, self.cfg.eps)?;
            var.set(&p.sub(&m.div(&denom)?.affine(step_size, 0.0)?)?)?;
            self.exp_avg[i] = m;
            self.exp_avg_sq[i] = v;
        }
        Ok(())
    }

    /// One step on `grads[i] · grad_mult` (loss-scale and clipping factor). On CUDA with f32
    /// parameters, one fused launch for all of them.
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
        use crate::cuda::adafactor::{fits, fits_grads};
        grads.len() == self.params.len()
            && fits_grads(grads.iter())
            && self.params.iter().zip(grads).all(|(p, g)| fits(p.as_tensor()) && g.dims() == p.dims())
            && self.exp_avg.iter().chain(&self.exp_avg_sq).all(fits)
    }

    #[cfg(feature = "cuda")]
    fn fused_step(&mut self, grads: &[Tensor], grad_mult: f64, lr: f64) -> Result<()> {
        use crate::cuda::adamw::{adamw_step, AdamwHyper, AdamwParam};
        let (step_size, bias_correction2_sqrt) = corrections(&self.cfg, lr, self.step as f64);
        let h = AdamwHyper {
            grad_mult: grad_mult as f32,
            decay: (1.0 - lr * self.weight_decay) as f32,
            weight_decay_on: (self.weight_decay != 0.0) as i32,
            w: (1.0 - self.cfg.beta1) as f32,
            one_minus_w: self.cfg.beta1 as f32,
            lerp_low: (1.0 - self.cfg.beta1 < 0.5) as i32,
            beta2: self.cfg.beta2 as f32,
            one_minus_beta2: (1.0 - self.cfg.beta2) as f32,
            inv_bias_correction2_sqrt: (1.0 / bias_correction2_sqrt) as f32,
            eps: self.cfg.eps as f32,
            step_size: step_size as f32,
        };
        let params: Vec<AdamwParam> = (0..self.params.len())
            .map(|i| AdamwParam {
                p: self.params[i].as_tensor(),
                g: &grads[i],
                exp_avg: &self.exp_avg[i],
                exp_avg_sq: &self.exp_avg_sq[i],
            })
            .collect();
        adamw_step(&params, &h).context("optim: fused AdamW step")
    }

    /// The state to checkpoint: `param.<i>.exp_avg`, `param.<i>.exp_avg_sq`. The tensors share
    /// the live state's memory (the CUDA step updates it in place): write them before the next step.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.params.len());
        for (i, (m, v)) in self.exp_avg.iter().zip(&self.exp_avg_sq).enumerate() {
            out.push((format!("param.{i}.exp_avg"), m.clone()));
            out.push((format!("param.{i}.exp_avg_sq"), v.clone()));
        }
        out
    }

    /// Restores the state of `state_tensors` after `step` steps; all or nothing.
    pub fn load_state(&mut self, tensors: &HashMap<String, Tensor>, step: u64) -> Result<()> {
        no_strangers(tensors, &self.state_tensors(), "AdamW")?;
        let mut exp_avg = Vec::with_capacity(self.params.len());
        let mut exp_avg_sq = Vec::with_capacity(self.params.len());
        for (i, (m, v)) in self.exp_avg.iter().zip(&self.exp_avg_sq).enumerate() {
            exp_avg.push(take(tensors, &format!("param.{i}.exp_avg"), m)?);
            exp_avg_sq.push(take(tensors, &format!("param.{i}.exp_avg_sq"), v)?);
        }
        (self.exp_avg, self.exp_avg_sq, self.step) = (exp_avg, exp_avg_sq, step);
        Ok(())
    }
}

#[cfg(test)]
#[path = "adamw_tests.rs"]
mod tests;
