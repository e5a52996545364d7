//! Bytes of optimizer state the planner counts per LoRA matrix, for each `optim.name`.

use crate::config::{Config, OptimName};
use crate::optim::{blocks_8bit, is_8bit};

/// The optimizer of a run, as far as its state goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerState {
    /// Factored second moments (row + column), and the full first moment with `beta1`.
    Adafactor { first_moment: bool },
    /// f32 exp_avg and exp_avg_sq.
    AdamW,
    /// u8 codes of both moments with an f32 absmax per block of 256; f32 moments below
    /// bitsandbytes' `min_8bit_size`.
    AdamW8bit,
}

impl OptimizerState {
    pub fn of(cfg: &Config) -> Self {
        match cfg.optim.name {
            OptimName::Adafactor => {
                Self::Adafactor { first_moment: cfg.optim.adafactor_section().beta1.is_some() }
            }
            OptimName::Adamw => Self::AdamW,
            OptimName::Adamw8bit => Self::AdamW8bit,
        }
    }

    /// Bytes of state of one f32 `[rows, cols]` parameter.
    pub fn bytes(self, rows: u64, cols: u64) -> u64 {
        let n = rows * cols;
        match self {
            Self::Adafactor { first_moment } => 4 * ((rows + cols) + if first_moment { n } else { 0 }),
            Self::AdamW => 2 * 4 * n,
            Self::AdamW8bit if is_8bit(n as usize) => 2 * n + 2 * 4 * blocks_8bit(n as usize) as u64,
            Self::AdamW8bit => 2 * 4 * n,
        }
    }
}

#[cfg(test)]
#[path = "optimizer_state_tests.rs"]
mod tests;
