//! Optimization: the Adafactor optimizer (torch and transformers flavors), the warmup + decay
//! learning-rate schedules of transformers, and global-norm gradient clipping as in torch.

mod adafactor;
mod clip;
#[cfg(feature = "cuda")]
mod cuda;
mod schedule;

pub use adafactor::{Adafactor, AdafactorError};
pub use clip::{clip_coefficient, clip_grad_norm, grad_norm};
pub use schedule::LrSchedule;
