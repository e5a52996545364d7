//! CUDA graphs: the work a closure queues on the device's stream recorded once (nothing runs
//! while it is recorded) and replayed with one launch, so a step of thousands of small kernels
//! costs the host one call instead of a launch each. A replay reads and writes the same device
//! addresses the recording did: its inputs are buffers made before the recording and refilled
//! between replays, its outputs buffers written in place; everything allocated while recording
//! must be freed before it ends (then the graph owns that memory and reuses it each replay).

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, Device, Result};

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
