//! GPU memory accounting. cudarc allocates from the device's default stream-ordered memory pool
//! (`cuMemAllocAsync`), whose counters are the analogue of PyTorch's `memory_allocated` /
//! `max_memory_allocated` (used) and `memory_reserved` (reserved); the driver's `cuMemGetInfo`
//! gives the device-wide view, CUDA context included.

use candle_core::Device;
use serde::Serialize;

pub const GIB: f64 = (1u64 << 30) as f64;

/// Device-wide memory from the driver: every allocation of every process plus the contexts.
#[derive(Debug, Clone, Copy)]
pub struct DeviceMemory {
    pub used: usize,
    pub total: usize,
}

/// This process's allocations in the device's default memory pool, in bytes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PoolMemory {
    pub allocated: u64,
    pub peak_allocated: u64,
    pub reserved: u64,
    pub peak_reserved: u64,
}

/// `None` on the CPU.
pub fn device_memory(device: &Device) -> Option<DeviceMemory> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let stream = d.cuda_stream();
            // Let freed blocks go back to the driver before asking it.
            stream.synchronize().ok()?;
            let (free, total) = stream.context().mem_get_info().ok()?;
            Some(DeviceMemory { used: total - free, total })
        }
        _ => None,
    }
}

/// `None` on the CPU or when the device has no memory pool.
pub fn pool_memory(device: &Device) -> Option<PoolMemory> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        use cuda::{attribute, default_pool, Attr};
        let pool = default_pool(d)?;
        return Some(PoolMemory {
            allocated: attribute(pool, Attr::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            peak_allocated: attribute(pool, Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved: attribute(pool, Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            peak_reserved: attribute(pool, Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        });
    }
    let _ = device;
    None
}

/// Makes the device's memory pool keep freed memory instead of returning it to the driver at
/// every synchronisation (the pool's default release threshold is 0): a training step frees and
/// allocates the same large buffers layer after layer, and mapping them afresh after each host
/// sync is slow. PyTorch's caching allocator keeps memory the same way; `reserved` shows it.
pub fn retain_freed_memory(device: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        use cuda::{default_pool, set_attribute, Attr};
        if let Some(pool) = default_pool(d) {
            set_attribute(pool, Attr::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX);
        }
    }
    let _ = device;
}

/// Gives the memory the pool keeps but no tensor uses back to the driver, once the device's work
/// is done: after a step ran out of memory, its retry maps what it needs afresh instead of finding
/// the pool cut into the failed step's sizes. No-op on the CPU.
pub fn trim_pool(device: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        if let Some(pool) = cuda::default_pool(d) {
            cuda::trim(pool);
        }
    }
    let _ = device;
}

/// Starts a new peak (like `torch.cuda.reset_peak_memory_stats`). No-op on the CPU.
pub fn reset_peak(device: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        use cuda::{default_pool, set_zero, Attr};
        if let Some(pool) = default_pool(d) {
            set_zero(pool, Attr::CU_MEMPOOL_ATTR_USED_MEM_HIGH);
            set_zero(pool, Attr::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
        }
    }
    let _ = device;
}

/// The memory a run may use on one GPU: `max_vram_fraction` of the card, as PyTorch's
/// `set_per_process_memory_fraction` (the rest is the reserve for the CUDA context, cuBLAS
/// workspaces and pool fragmentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VramBudget {
    pub fraction: f64,
    pub total: u64,
}

impl VramBudget {
    /// `fraction`, or when omitted 0.90 on cards up to 32 GiB and 0.92 above (what users of
    /// 24 GB and 48 GB cards set by hand).
    pub fn new(total: u64, fraction: Option<f64>) -> Self {
        let default = if total as f64 <= 32.0 * GIB { 0.90 } else { 0.92 };
        Self { fraction: fraction.unwrap_or(default), total }
    }

    /// The budget of `device`, or of a card of `card_gib` where that is smaller (`train.gpu_mem`);
    /// `None` on the CPU.
    pub fn of(device: &Device, fraction: Option<f64>, card_gib: Option<f64>) -> Option<Self> {
        let card = |total: u64| card_gib.map_or(total, |g| total.min((g * GIB) as u64));
        device_memory(device).map(|m| Self::new(card(m.total as u64), fraction))
    }

    pub fn bytes(&self) -> u64 {
        (self.total as f64 * self.fraction) as u64
    }

    /// `Err` with the numbers when a peak of `peak` bytes went over the budget.
    pub fn check(&self, peak: u64) -> Result<(), String> {
        if peak <= self.bytes() {
            return Ok(());
        }
        Err(format!(
            "peak GPU memory {:.2} GiB is over train.max_vram_fraction = {:.2} of the card's {:.2} GiB \
             ({:.2} GiB)",
            peak as f64 / GIB,
            self.fraction,
            self.total as f64 / GIB,
            self.bytes() as f64 / GIB
        ))
    }
}

/// Device memory held outside the memory pool while it lives: on a GPU larger than the card a run
/// plans for (`--gpu-mem`), what the card would not have, so that the pool can grow no further than
/// on that card, its fragmentation included, and a run that fits only the larger GPU fails here as
/// it would there. The CUDA context and anything else already on the device stay counted, as on the
/// card.
pub struct HeldMemory {
    pub bytes: u64,
    #[cfg(feature = "cuda")]
    held: Option<(candle_core::cuda_backend::cudarc::driver::sys::CUdeviceptr, candle_core::CudaDevice)>,
}

/// Bytes a GPU of `total` bytes has beyond a card of `card` bytes.
pub fn beyond_card(total: u64, card: u64) -> u64 {
    total.saturating_sub(card)
}

impl HeldMemory {
    /// Holds what `device` has beyond a card of `card_gib` GiB; nothing on the CPU or on a GPU no
    /// larger than the card.
    pub fn beyond(device: &Device, card_gib: f64) -> anyhow::Result<Self> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = device {
            use anyhow::Context;
            use candle_core::cuda_backend::cudarc::driver::result;
            let total = device_memory(device).context("the GPU's memory size")?.total as u64;
            let bytes = beyond_card(total, (card_gib * GIB) as u64);
            if bytes > 0 {
                d.cuda_stream().context().bind_to_thread()?;
                // SAFETY: a plain allocation, freed once in `drop` on the same context.
                let ptr = unsafe { result::malloc_sync(bytes as usize) }.with_context(|| {
                    format!(
                        "holding the {:.2} GiB beyond a {card_gib} GiB card (--gpu-mem)",
                        bytes as f64 / GIB
                    )
                })?;
                return Ok(Self { bytes, held: Some((ptr, d.clone())) });
            }
        }
        let _ = (device, card_gib);
        Ok(Self {
            bytes: 0,
            #[cfg(feature = "cuda")]
            held: None,
        })
    }
}

impl Drop for HeldMemory {
    fn drop(&mut self) {
        #[cfg(feature = "cuda")]
        if let Some((ptr, d)) = self.held.take() {
            use candle_core::cuda_backend::cudarc::driver::result;
            if d.cuda_stream().context().bind_to_thread().is_ok() {
                // SAFETY: allocated by `beyond` with malloc_sync and freed only here.
                let _ = unsafe { result::free_sync(ptr) };
            }
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::CudaDevice;

    pub use sys::CUmemPool_attribute as Attr;

    pub fn default_pool(d: &CudaDevice) -> Option<sys::CUmemoryPool> {
        let stream = d.cuda_stream();
        let ctx = stream.context();
        ctx.bind_to_thread().ok()?;
        stream.synchronize().ok()?;
        // SAFETY: the device ordinal comes from a live context.
        unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }.ok()
    }

    pub fn attribute(pool: sys::CUmemoryPool, attr: Attr) -> Option<u64> {
        let mut value: u64 = 0;
        // SAFETY: these attributes are cuuint64_t.
        unsafe { result::mem_pool::get_attribute(pool, attr, (&mut value as *mut u64).cast()) }.ok()?;
        Some(value)
    }

    pub fn trim(pool: sys::CUmemoryPool) {
        // SAFETY: a live pool; it keeps what outstanding allocations use.
        let _ = unsafe { result::mem_pool::trim_to(pool, 0) };
    }

    pub fn set_zero(pool: sys::CUmemoryPool, attr: Attr) {
        set_attribute(pool, attr, 0);
    }

    pub fn set_attribute(pool: sys::CUmemoryPool, attr: Attr, value: u64) {
        let mut value = value;
        // SAFETY: the attributes set here (high-water marks, release threshold) are cuuint64_t.
        let _ = unsafe { result::mem_pool::set_attribute(pool, attr, (&mut value as *mut u64).cast()) };
    }
}

/// Where in a step an error happened: attached as context, read back by `oom_report`.
#[derive(Debug, Clone, Copy)]
pub struct Phase(pub &'static str);

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "in the {} phase", self.0)
    }
}

/// Whether `e` is the device running out of memory, in the words of CUDA or candle
/// (`CUDA_ERROR_OUT_OF_MEMORY`, "out of memory"), cuBLAS (`CUBLAS_STATUS_ALLOC_FAILED`: its
/// workspace or a batched GEMM's pointer arrays) or cuDNN (`CUDNN_STATUS_ALLOC_FAILED`).
pub fn is_out_of_memory(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    ["OUT_OF_MEMORY", "out of memory", "ALLOC_FAILED"].iter().any(|words| text.contains(words))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_larger_gpu_holds_what_the_card_lacks() {
        let gib = |g: f64| (g * GIB) as u64;
        assert_eq!(beyond_card(gib(79.2), gib(24.0)), gib(79.2) - gib(24.0));
        assert_eq!(beyond_card(gib(23.6), gib(24.0)), 0);
        // nothing to hold on the CPU
        assert_eq!(HeldMemory::beyond(&Device::Cpu, 24.0).unwrap().bytes, 0);
    }

    #[test]
    fn vram_budget_defaults_by_card_size_and_reports_overruns() {
        let card24 = (24.0 * GIB) as u64;
        let b = VramBudget::new(card24, None);
        assert_eq!(b.fraction, 0.90);
        assert_eq!(b.bytes(), (card24 as f64 * 0.9) as u64);
        assert!(b.check((21.0 * GIB) as u64).is_ok());
        let err = b.check((22.0 * GIB) as u64).unwrap_err();
        assert!(err.contains("22.00 GiB") && err.contains("0.90") && err.contains("21.60 GiB"), "{err}");
        assert_eq!(VramBudget::new((48.0 * GIB) as u64, None).fraction, 0.92);
        assert_eq!(VramBudget::new((48.0 * GIB) as u64, Some(0.5)).bytes(), (24.0 * GIB) as u64);
    }
}
