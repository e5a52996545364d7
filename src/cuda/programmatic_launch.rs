//! Programmatic dependent launch (sm_90 and later), for a kernel queued right after the one that
//! makes part of its input: launched with the programmatic-stream-serialization attribute, it may
//! start while that kernel's blocks still run and waits for it (`griddepcontrol.wait`, nf4_gemv.cu's
//! `wait_for_prior_grid`) only before it reads what it made; the kernel before lets it start
//! (`griddepcontrol.launch_dependents`). The NF4 lookup kernels use it after `lora_down`: their
//! weights stream in while lora_down runs. CUDA graphs record it as a programmatic edge.
//! cudarc 0.19 has no launch with attributes, so this calls `cuLaunchKernelEx` itself.

use std::ffi::c_void;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, Result};

/// Whether `stream`'s device takes programmatic dependent launches (compute capability 9.0 and
/// later), unless `LORA_FT_PDL=off` (read once; a diagnostic, for measuring what the overlap gains).
pub fn available(stream: &CudaStream) -> Result<bool> {
    use sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR;
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *OFF.get_or_init(|| std::env::var("LORA_FT_PDL").is_ok_and(|v| v == "off")) {
        return Ok(false);
    }
    Ok(stream.context().attribute(MAJOR).w()? >= 9)
}

/// A kernel argument as `cuLaunchKernelEx` takes it: the address of its value.
pub fn arg<A>(value: &A) -> *mut c_void {
    value as *const A as *mut c_void
}

/// Launches `func` on `stream` as `cfg` with `params`; with `programmatic` (and where
/// `available`), with the programmatic-stream-serialization attribute, else as an ordinary launch.
///
/// # Safety
/// `params` must point at the kernel's arguments, each of its parameter's type, alive across the
/// call; with `programmatic`, the kernel must wait before it reads what the kernel queued before
/// it writes, and write nothing that kernel reads.
pub unsafe fn launch(
    func: &CudaFunction,
    cfg: LaunchConfig,
    stream: &Arc<CudaStream>,
    params: &mut [*mut c_void],
    programmatic: bool,
) -> Result<()> {
    stream.context().bind_to_thread().w()?;
    // SAFETY: a zeroed attribute is a valid value of the C union; its id and value are then set.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let on = programmatic && available(stream)?;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: on as u32,
    };
    // SAFETY: the caller's contract on `params`; the function belongs to the stream's context.
    let status = unsafe {
        sys::cuLaunchKernelEx(&config, func.cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
    };
    if status != sys::CUresult::CUDA_SUCCESS {
        bail!("launching a kernel (programmatic: {on}): {status:?}");
    }
    Ok(())
}
