//! The optimizer a run trains with (`optim.name`): one type over Adafactor, AdamW and 8-bit
//! AdamW, so the trainer, checkpoints and the batch probe need not know which.

use std::collections::HashMap;

use anyhow::Result;
use candle_core::{Tensor, Var};

use super::{Adafactor, AdamW, AdamW8bit};
use crate::config::{OptimName, OptimSection};

pub enum Optimizer {
    Adafactor(Adafactor),
    AdamW(AdamW),
    AdamW8bit(AdamW8bit),
}

/// The same call on whichever optimizer it is.
macro_rules! each {
    ($self:expr, $o:ident => $e:expr) => {
        match $self {
            Optimizer::Adafactor($o) => $e,
            Optimizer::AdamW($o) => $e,
            Optimizer::AdamW8bit($o) => $e,
        }
    };
}

impl Optimizer {
    /// The optimizer `cfg.name` names over `params`; `weight_decay` is `train.weight_decay`.
    pub fn new(params: Vec<Var>, cfg: &OptimSection, weight_decay: f64) -> Result<Self> {
        Ok(match cfg.name {
            OptimName::Adafactor => {
                Self::Adafactor(Adafactor::new(params, &cfg.adafactor_section(), weight_decay)?)
            }
            OptimName::Adamw => Self::AdamW(AdamW::new(params, &cfg.adamw_section(), weight_decay)?),
            OptimName::Adamw8bit => {
                Self::AdamW8bit(AdamW8bit::new(params, &cfg.adamw_section(), weight_decay)?)
            }
        })
    }

    /// `optim.name` of this optimizer (what a checkpoint records).
    pub fn name(&self) -> OptimName {
        match self {
            Optimizer::Adafactor(_) => OptimName::Adafactor,
            Optimizer::AdamW(_) => OptimName::Adamw,
            Optimizer::AdamW8bit(_) => OptimName::Adamw8bit,
        }
    }

    pub fn step_count(&self) -> u64 {
        each!(self, o => o.step_count())
    }

    pub fn params(&self) -> &[Var] {
        each!(self, o => o.params())
    }

    /// One step on `grads[i] · grad_mult` at learning rate `lr`.
    pub fn step_scaled(&mut self, grads: &[Tensor], grad_mult: f64, lr: f64) -> Result<()> {
        each!(self, o => o.step_scaled(grads, grad_mult, lr))
    }

    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        each!(self, o => o.state_tensors())
    }

    pub fn load_state(&mut self, tensors: &HashMap<String, Tensor>, step: u64) -> Result<()> {
        each!(self, o => o.load_state(tensors, step))
    }
}
