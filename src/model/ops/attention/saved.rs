//! What an attention forward hands its backward, by the implementation that ran it.

use candle_core::Tensor;

/// What the backward needs beyond q, k, v: on CUDA, the forward's context and row log-sum-exp;
/// on the CPU's fused path the log-sum-exp; the composed path recomputes everything and keeps
/// nothing.
pub struct AttentionSaved {
    pub(super) kernel: Option<KernelSaved>,
}

impl AttentionSaved {
    /// Nothing kept: a forward no backward follows.
    pub fn nothing() -> Self {
        Self { kernel: None }
    }

    /// The kernel's saved output and statistics (none on the composed path), for offloading.
    pub fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        match &mut self.kernel {
            Some(KernelSaved::Flash { context, lse }) => vec![context, lse],
            Some(KernelSaved::Cudnn { context, stats }) => vec![context, stats],
            Some(KernelSaved::Cpu { lse }) => vec![lse],
            None => Vec::new(),
        }
    }

    /// Which implementation ran the forward: "cudnn", "flash", "cpu" or "composed".
    pub fn kernel_name(&self) -> &'static str {
        match self.kernel {
            Some(KernelSaved::Cudnn { .. }) => "cudnn",
            Some(KernelSaved::Flash { .. }) => "flash",
            Some(KernelSaved::Cpu { .. }) => "cpu",
            None => "composed",
        }
    }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(super) enum KernelSaved {
    /// flash.rs: lse in log2 units.
    Flash { context: Tensor, lse: Tensor },
    /// cudnn_sdpa.rs: the same statistic in natural-log units.
    Cudnn { context: Tensor, stats: Tensor },
    /// cpu/attention.rs: the row log-sum-exp `[b, h, t]`, natural log.
    Cpu { lse: Tensor },
}
