//! Optimization: Adafactor (torch and transformers flavors), AdamW (torch's) and 8-bit AdamW
//! (bitsandbytes'), one `Optimizer` over the three (`optim.name`), the warmup + decay
//! learning-rate schedules of transformers, and global-norm gradient clipping as in torch.

mod adafactor;
mod adamw;
mod adamw8bit;
pub mod blockwise8;
mod clip;
#[cfg(all(test, feature = "cuda"))]
mod fused_adamw_tests;
#[cfg(all(test, feature = "cuda"))]
mod fused_tests;
mod optimizer;
mod schedule;
mod state;

pub use adafactor::{Adafactor, AdafactorError};
pub use adamw::AdamW;
pub use adamw8bit::{blocks as blocks_8bit, is_8bit, AdamW8bit};
pub use clip::{clip_coefficient, clip_grad_norm, grad_norm};
pub use optimizer::Optimizer;
pub use schedule::LrSchedule;
