//! Zeroed u32 counters a kernel's blocks meet by within one launch: the blocks of a group count
//! themselves in, and the last to arrive finishes the group's work (`decode_attention` merging
//! its splits, `nf4_lut` waiting for its grid's LoRA products). Every kernel that uses them
//! leaves them zero when it ends, so the launches of one stream, which run one after another,
//! share one buffer. Made once a stream, outside any graph recording (`Graph::capture` makes it
//! first, so the graph does not own it), and kept, with the stream it belongs to, for the
//! program's life.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::cudarc::driver::sys::CUstreamCaptureStatus;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, Result};

/// The counters a stream has.
pub const GRID_COUNTERS: usize = 4096;

/// The device address of `stream`'s counters (`GRID_COUNTERS` u32, zero between launches).
pub fn grid_counters(stream: &Arc<CudaStream>) -> Result<u64> {
    static COUNTERS: Mutex<Option<HashMap<usize, CudaSlice<u32>>>> = Mutex::new(None);
    let mut counters =
        COUNTERS.lock().map_err(|_| candle_core::Error::Msg("grid counters poisoned".into()))?;
    let counters = counters.get_or_insert_with(HashMap::new);
    let buffer = match counters.entry(stream.cu_stream() as usize) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => {
            if stream.capture_status().w()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                bail!("a stream's grid counters must be made before a graph records (Graph::capture makes them)");
            }
            e.insert(stream.alloc_zeros::<u32>(GRID_COUNTERS).w()?)
        }
    };
    let (ptr, _ordered) = buffer.device_ptr(stream);
    Ok(ptr)
}
