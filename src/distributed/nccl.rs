//! The GPU collective: NCCL on the device's own stream, so the all-reduce is ordered after the
//! backward that produced the gradients without a host synchronisation.
//!
//! libnccl is opened at run time (`libnccl.so.2`), and only by runs on several GPUs. candle's
//! `nccl` feature would turn on cudarc's NCCL bindings under candle's `dynamic-linking`, which
//! links `-lnccl` into every CUDA build: each single-GPU user would then need NCCL installed for
//! the binary to start at all. The seven functions used here are NCCL's stable C API.
//!
//! A failed peer leaves an NCCL kernel waiting for it; the liveness channel's failure hook calls
//! `ncclCommAbort`, which makes those kernels return, so the rank stops instead of hanging.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, DevicePtrMut};
use candle_core::{CudaDevice, Device, Tensor};

use super::collective::{Collective, ReduceOp};
use super::error::DistributedError;
use super::liveness::Group;

type NcclResult = c_int;
type RawComm = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

// nccl.h: ncclDataType_t and ncclRedOp_t
const NCCL_FLOAT32: c_int = 7;
const NCCL_FLOAT64: c_int = 8;
const NCCL_SUM: c_int = 0;
const NCCL_MAX: c_int = 2;
const NCCL_MIN: c_int = 3;

struct Api {
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> NcclResult,
    #[allow(clippy::type_complexity)]
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> NcclResult,
    comm_abort: unsafe extern "C" fn(RawComm) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(RawComm) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    _lib: libloading::Library,
}

fn api() -> anyhow::Result<&'static Api> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| anyhow::anyhow!("{e}"))
}

fn load() -> Result<Api, String> {
    let mut tried = Vec::new();
    for name in ["libnccl.so.2", "libnccl.so"] {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return symbols(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(format!(
        "training on several GPUs needs NCCL, and libnccl.so.2 could not be loaded ({}); install NCCL \
         (e.g. `pip install nvidia-nccl-cu13` and add its nvidia/nccl/lib to LD_LIBRARY_PATH)",
        tried.join("; ")
    ))
}

fn symbols(lib: libloading::Library) -> Result<Api, libloading::Error> {
    // SAFETY: the signatures are nccl.h's; the library stays loaded inside `Api`.
    unsafe {
        Ok(Api {
            get_unique_id: *lib.get(b"ncclGetUniqueId\0")?,
            comm_init_rank: *lib.get(b"ncclCommInitRank\0")?,
            all_reduce: *lib.get(b"ncclAllReduce\0")?,
            comm_abort: *lib.get(b"ncclCommAbort\0")?,
            comm_destroy: *lib.get(b"ncclCommDestroy\0")?,
            get_error_string: *lib.get(b"ncclGetErrorString\0")?,
            _lib: lib,
        })
    }
}

fn check(api: &Api, result: NcclResult, what: &str) -> anyhow::Result<()> {
    if result == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static NUL-terminated string for every result code.
    let text = unsafe { CStr::from_ptr((api.get_error_string)(result)) }.to_string_lossy();
    anyhow::bail!("NCCL {what}: {text} (error {result})")
}

/// A new NCCL unique id (rank 0), as the bytes the rendezvous sends to the other ranks.
pub fn unique_id() -> anyhow::Result<Vec<u8>> {
    let api = api()?;
    let mut id = UniqueId { internal: [0; 128] };
    // SAFETY: writes one ncclUniqueId into `id`.
    check(api, unsafe { (api.get_unique_id)(&mut id) }, "creating the unique id")?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// The communicator, taken by whoever aborts it: the main thread holds the lock only while it
/// enqueues an operation, so the failure hook can abort while a kernel waits on a dead peer.
struct CommSlot(Mutex<Option<SendComm>>);

struct SendComm(RawComm);
// SAFETY: NCCL communicators may be used from any thread; the mutex orders the uses.
unsafe impl Send for SendComm {}

impl CommSlot {
    fn abort(&self) {
        // never wait for ever: a call blocked in NCCL (connection set-up to a dead peer) holds
        // the lock, and the process ends soon anyway
        for _ in 0..100 {
            if let Ok(mut slot) = self.0.try_lock() {
                if let (Some(comm), Ok(api)) = (slot.take(), api()) {
                    // SAFETY: the communicator is live, and taken out so nothing uses it again.
                    unsafe { (api.comm_abort)(comm.0) };
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

pub struct NcclCollective {
    group: Group,
    comm: Arc<CommSlot>,
    device: CudaDevice,
}

impl NcclCollective {
    /// Joins the NCCL communicator of the run (every rank calls this at the same time) on
    /// `device`'s stream; a failure of the run from then on aborts it.
    /// A failure here is told to the other ranks before it is returned.
    pub fn new(group: Group, device: &Device, id: &[u8]) -> anyhow::Result<Self> {
        match Self::open(&group, device, id) {
            Ok((comm, device)) => Ok(Self { group, comm, device }),
            Err(e) => {
                group.fail_self(&format!("failed: {e:#}"));
                Err(e)
            }
        }
    }

    fn open(group: &Group, device: &Device, id: &[u8]) -> anyhow::Result<(Arc<CommSlot>, CudaDevice)> {
        let Device::Cuda(device) = device else { anyhow::bail!("NCCL needs a CUDA device") };
        let api = api()?;
        anyhow::ensure!(id.len() == 128, "the NCCL unique id from rank 0 has {} bytes, not 128", id.len());
        let mut unique = UniqueId { internal: [0; 128] };
        for (d, s) in unique.internal.iter_mut().zip(id) {
            *d = *s as c_char;
        }
        // NCCL creates the communicator on the thread's current device
        device.cuda_stream().context().bind_to_thread().context("making the GPU current for NCCL")?;
        let mut comm: RawComm = std::ptr::null_mut();
        let (n, r) = (group.world_size() as c_int, group.rank() as c_int);
        // SAFETY: `comm` receives a new communicator; the id is the one every rank holds.
        check(api, unsafe { (api.comm_init_rank)(&mut comm, n, unique, r) }, "joining the communicator")?;
        let slot = Arc::new(CommSlot(Mutex::new(Some(SendComm(comm)))));
        let hook = Arc::clone(&slot);
        group.on_failure(move |_| hook.abort());
        tracing::info!("NCCL communicator of {n} ranks");
        Ok((slot, device.clone()))
    }

    fn stopped(&self) -> anyhow::Error {
        match self.group.failure() {
            Some(f) => DistributedError::PeerFailed(f).into(),
            None => anyhow::anyhow!("the NCCL communicator was aborted"),
        }
    }

    /// All-reduces `n` elements of `dtype` from `src` into `dst` on the device's stream.
    fn enqueue(&self, src: u64, dst: u64, n: usize, dtype: c_int, op: c_int) -> anyhow::Result<()> {
        let api = api()?;
        let slot = self.comm.0.lock().unwrap_or_else(|e| e.into_inner());
        let Some(comm) = slot.as_ref() else { return Err(self.stopped()) };
        let stream = self.device.cuda_stream();
        // SAFETY: src and dst hold n elements of dtype on this device, alive until the stream
        // reaches the operation (the caller keeps them); the stream is the device's own.
        let result = unsafe {
            (api.all_reduce)(src as _, dst as _, n, dtype, op, comm.0, stream.cu_stream() as *mut c_void)
        };
        check(api, result, "all-reduce")
    }

    /// The all-reduce of a contiguous f32/f64 tensor into a new one.
    fn all_reduce<T>(&self, t: &Tensor, dtype: c_int, op: c_int) -> anyhow::Result<Tensor>
    where
        T: candle_core::cuda_backend::CudaDType
            + candle_core::WithDType
            + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
    {
        let t = t.contiguous()?;
        let n = t.elem_count();
        let stream = self.device.cuda_stream();
        // SAFETY: every element is written by the all-reduce before anything reads it.
        let mut out = unsafe { self.device.alloc::<T>(n) }?;
        {
            let (storage, _) = t.storage_and_layout();
            let src = crate::cuda::view::<T>(&storage, &t)?;
            let (src_ptr, _read) = src.device_ptr(&stream);
            let (dst_ptr, _write) = out.device_ptr_mut(&stream);
            self.enqueue(src_ptr, dst_ptr, n, dtype, op)?;
        }
        Ok(crate::cuda::wrap(out, &self.device, &[n]))
    }
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn world_size(&self) -> usize {
        self.group.world_size()
    }

    fn all_reduce_bucket(&self, bucket: &Tensor) -> anyhow::Result<Tensor> {
        self.all_reduce::<f32>(bucket, NCCL_FLOAT32, NCCL_SUM)
    }

    fn all_reduce_scalars(&self, values: &mut [f64], op: ReduceOp) -> anyhow::Result<()> {
        let op = match op {
            ReduceOp::Sum => NCCL_SUM,
            ReduceOp::Max => NCCL_MAX,
            ReduceOp::Min => NCCL_MIN,
        };
        let t = Tensor::from_slice(values, values.len(), &Device::Cuda(self.device.clone()))?;
        let reduced = self.all_reduce::<f64>(&t, NCCL_FLOAT64, op)?.to_vec1::<f64>()?;
        // the copy back waited for the kernel: an abort while it ran leaves these numbers wrong
        if self.comm.0.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
            return Err(self.stopped());
        }
        values.copy_from_slice(&reduced);
        Ok(())
    }

    fn abort(&self, message: &str) {
        self.group.fail_self(message);
        // an all-reduce this rank enqueued waits for peers that now stop: end it, so the
        // process exits without a kernel of its own in flight
        self.comm.abort();
    }

    fn finish(&self) -> anyhow::Result<()> {
        Ok(self.group.finish()?)
    }
}

impl Drop for NcclCollective {
    fn drop(&mut self) {
        let comm = self.comm.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let (Some(comm), Ok(api)) = (comm, api()) {
            // SAFETY: the communicator is live and nothing else holds it.
            unsafe { (api.comm_destroy)(comm.0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where libnccl.so.2 can be loaded (a GPU machine, or LD_LIBRARY_PATH at a NCCL wheel), the
    /// unique id rank 0 sends is 128 bytes and not all zero; where it cannot, the error says how
    /// to install it. Neither needs a GPU.
    #[test]
    fn the_unique_id_comes_from_libnccl_or_the_error_says_how_to_get_it() {
        match unique_id() {
            Ok(id) => {
                assert_eq!(id.len(), 128);
                assert!(id.iter().any(|&b| b != 0), "{id:?}");
                assert_ne!(unique_id().unwrap(), id, "a new id each time");
            }
            Err(e) => {
                let text = e.to_string();
                assert!(
                    text.contains("libnccl.so.2 could not be loaded") && text.contains("pip install"),
                    "{text}"
                );
            }
        }
    }
}
