//! GPU memory accounting: what the device reports as used, so loads and training steps can log
//! it and benchmarks can compare it with the reference stack's numbers.

use candle_core::Device;

/// Device-wide memory from the driver (`cuMemGetInfo`): every allocation of this process and of
/// any other on the same GPU, plus the CUDA context itself.
#[derive(Debug, Clone, Copy)]
pub struct DeviceMemory {
    pub used: usize,
    pub total: usize,
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

pub const GIB: f64 = (1u64 << 30) as f64;
