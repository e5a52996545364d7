//! Optimization: the Adafactor optimizer (torch and transformers flavors), the warmup + decay
//! learning-rate schedules of transformers, and global-norm gradient clipping as in torch.

mod adafactor;
mod clip;
mod schedule;

pub use adafactor::{Adafactor, AdafactorError};
pub use clip::clip_grad_norm;
pub use schedule::LrSchedule;
