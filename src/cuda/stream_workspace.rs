//! Device scratch for kernels whose blocks hand each other partial sums (`nf4_lut_gemm`'s tile
//! fragments, `lora_down_split`'s k splits): f32 sums and i32 counts, one pair a stream and
//! kernel, allocated the first time (outside any recording, as cuBLAS's workspace in graph.rs)
//! and never freed, so a recorded graph's addresses stay theirs. The counts start at zero and
//! each launch leaves them zero (its last block resets what it counted).

use std::collections::HashMap;
use std::sync::Mutex;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CudaDevice, Result};

/// A stream's sums and counts for one kernel.
type Workspace = (CudaSlice<f32>, CudaSlice<i32>);

/// The device addresses of `kernel`'s workspace on `dev`'s stream: at least `sums` f32 and
/// `counts` i32 (the first call for a stream and kernel sets the sizes).
pub fn get(dev: &CudaDevice, kernel: &'static str, sums: usize, counts: usize) -> Result<(u64, u64)> {
    static WORKSPACES: Mutex<Option<HashMap<(usize, &'static str), Workspace>>> = Mutex::new(None);
    let stream = dev.cuda_stream();
    let mut map =
        WORKSPACES.lock().map_err(|_| candle_core::Error::Msg("kernel workspaces poisoned".into()))?;
    let map = map.get_or_insert_with(HashMap::new);
    let (ws, count) = match map.entry((stream.cu_stream() as usize, kernel)) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            // SAFETY: the kernels write every sum before they read it.
            let ws = unsafe { stream.alloc::<f32>(sums.max(1)) }.w()?;
            e.insert((ws, stream.alloc_zeros::<i32>(counts.max(1)).w()?))
        }
    };
    if ws.len() < sums || count.len() < counts {
        bail!(
            "{kernel}'s workspace holds {} sums and {} counts, not {sums} and {counts}",
            ws.len(),
            count.len()
        );
    }
    let ws_ptr = ws.device_ptr(&stream).0;
    let count_ptr = count.device_ptr(&stream).0;
    Ok((ws_ptr, count_ptr))
}
