//! CUDA graphs: the work a closure queues on the device's stream recorded once (nothing runs
//! while it is recorded) and replayed with one launch, so a step of thousands of small kernels
//! costs the host one call instead of a launch each. A replay reads and writes the same device
//! addresses the recording did: its inputs are buffers made before the recording and refilled
//! between replays, its outputs buffers written in place; everything allocated while recording
//! must be freed before it ends (then the graph owns that memory and reuses it each replay).

use std::collections::HashMap;
use std::sync::Mutex;

use candle_core::cuda_backend::cudarc::cublas::sys as cublas;
use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph, CudaSlice, DevicePtr};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CudaDevice, Device, Result};

pub struct Graph {
    graph: CudaGraph,
}

impl Graph {
    /// Records the work `record` queues on `device`'s stream. Relaxed capture mode: the
    /// recording thread may call the driver for things outside the stream (loading a module).
    /// Anything that waits for the device inside `record` (a copy to the host) makes the
    /// recording fail; so does a device whose buffers track events across streams (see
    /// `order_by_stream`): those waits cannot be recorded.
    pub fn capture<T>(device: &Device, record: impl FnOnce() -> Result<T>) -> Result<(Self, T)> {
        let Device::Cuda(dev) = device else { bail!("CUDA graphs record CUDA work only") };
        if dev.is_event_tracking() && dev.cuda_stream().context().is_in_multi_stream_mode() {
            bail!("the device tracks buffers with events across streams, which a graph cannot record");
        }
        pin_cublas_workspace(dev)?;
        let stream = dev.cuda_stream();
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).w()?;
        let recorded = record();
        // the capture always ends, whatever `record` did, so the stream runs work again
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        let out = recorded?;
        match ended.w()? {
            Some(graph) => {
                graph.upload().w()?;
                Ok((Self { graph }, out))
            }
            None => bail!("the recording held no work"),
        }
    }

    /// Queues the recorded work on the stream it was recorded on.
    pub fn launch(&self) -> Result<()> {
        self.graph.launch().w()
    }
}

/// Bytes of cuBLAS's workspace (PyTorch's default on Hopper).
const CUBLAS_WORKSPACE: usize = 32 << 20;

/// Gives the device's cuBLAS handle a workspace allocated outside any recording and never freed.
/// Without one, cuBLAS allocates its own the first time it runs while a graph records: memory
/// the graph owns, which replays and the calls after it then reach at an address that is no
/// longer theirs (an illegal address). PyTorch sets one for the same reason.
fn pin_cublas_workspace(dev: &CudaDevice) -> Result<()> {
    static WORKSPACES: Mutex<Option<HashMap<usize, CudaSlice<u8>>>> = Mutex::new(None);
    let blas = dev.cublas_handle();
    let handle = *blas.handle();
    let stream = dev.cuda_stream();
    let mut workspaces =
        WORKSPACES.lock().map_err(|_| candle_core::Error::Msg("cuBLAS workspaces poisoned".into()))?;
    let workspaces = workspaces.get_or_insert_with(HashMap::new);
    let buffer = match workspaces.entry(handle as usize) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        // SAFETY: cuBLAS writes the workspace before it reads it.
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(unsafe { stream.alloc::<u8>(CUBLAS_WORKSPACE) }.w()?)
        }
    };
    let (ptr, _ordered) = buffer.device_ptr(&stream);
    // SAFETY: the buffer lives as long as the program (never removed from the map).
    let status =
        unsafe { cublas::cublasSetWorkspace_v2(handle, ptr as *mut std::ffi::c_void, CUBLAS_WORKSPACE) };
    if status != cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        bail!("setting cuBLAS's workspace: {status:?}");
    }
    Ok(())
}
