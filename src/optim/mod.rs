//! Optimization: the Adafactor optimizer (torch and transformers flavors), the warmup + decay
//! learning-rate schedules of transformers, and global-norm gradient clipping as in torch.

mod adafactor;
mod clip;
#[cfg(all(test, feature = "cuda"))]
mod fused_tests;
mod schedule;

pub use adafactor::{Adafactor, AdafactorError};
pub use clip::{clip_coefficient, clip_grad_norm, grad_norm};
pub use schedule::LrSchedule;
