//! Page-locked host memory as an overflow of the GPU's: tensors go out on a second CUDA stream
//! while the compute stream goes on, and come back ahead of their use. Every copy is ordered
//! against the compute stream with events, never by blocking the host, and a copy's device
//! tensor stays alive (`InFlight`) until the compute stream has been made to wait for the copy:
//! the memory pool is stream-ordered on the compute stream, so nothing queued after that wait
//! can reuse the memory while the copy engine still reads or writes it.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{sys, CudaEvent, CudaStream, DeviceRepr, PinnedHostSlice};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, CudaDevice, DType, Device, Result, Shape, Tensor, WithDType};

use crate::cuda::{address, by_dtype, wrap};

/// The compute stream (candle's) and the copy stream beside it.
pub struct CopyStream {
    device: CudaDevice,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
}

/// A tensor whose copy may still run: waited for by the compute stream when finished or dropped.
pub struct InFlight {
    tensor: Option<Tensor>,
    done: CudaEvent,
    compute: Arc<CudaStream>,
}

impl InFlight {
    /// The tensor, once the compute stream has been ordered after the copy (nothing blocks).
    pub fn finish(mut self) -> Result<Tensor> {
        self.compute.wait(&self.done).w()?;
        Ok(self.tensor.take().expect("taken once"))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.tensor.is_some() {
            // an abandoned copy (an error mid-step) must still finish before its memory is reused
            let _ = self.compute.wait(&self.done);
        }
    }
}

impl CopyStream {
    pub fn new(device: &Device) -> Result<Self> {
        let Device::Cuda(dev) = device else { bail!("host offload needs a CUDA device") };
        let compute = dev.cuda_stream();
        let copy = compute.context().new_stream().w()?;
        Ok(Self { device: dev.clone(), compute, copy })
    }

    /// The device the copies go to and from.
    pub fn device(&self) -> Device {
        Device::Cuda(self.device.clone())
    }

    /// The compute stream (candle's), which the copies are ordered against.
    pub fn compute_stream(&self) -> Arc<CudaStream> {
        self.compute.clone()
    }

    /// `bytes` of page-locked host memory (plain: the copy engine both writes and reads it).
    pub fn host_buffer(&self, bytes: usize) -> Result<PinnedHostSlice<u8>> {
        // SAFETY: the bytes are only read back after a copy has written them.
        unsafe { self.compute.context().alloc_pinned_with_flags::<u8>(bytes, 0) }.w()
    }

    /// Starts copying `t` (contiguous) into `host` once the compute stream's queued work is done.
    pub fn to_host(&self, t: Tensor, host: &mut PinnedHostSlice<u8>) -> Result<InFlight> {
        let bytes = t.elem_count() * t.dtype().size_in_bytes();
        if !t.is_contiguous() || bytes > host.len() {
            bail!(
                "offload: a {:?} {:?} tensor does not fit a {} byte host buffer",
                t.dtype(),
                t.dims(),
                host.len()
            );
        }
        let src = address(&t, &self.compute)?;
        let dst = host.as_mut_ptr().w()? as *mut std::ffi::c_void;
        self.copy.join(&self.compute).w()?;
        // SAFETY: `host` holds `bytes`; `t` stays alive in the InFlight until the compute stream
        // waits for `done`.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, self.copy.cu_stream()) }.result().w()?;
        self.in_flight(t)
    }

    /// Starts copying the whole buffer `t` views (f32, f16 or bf16), whatever the view, into
    /// `host`; `t` stays alive in the `InFlight` until the compute stream has waited for it.
    pub fn buffer_to_host(&self, t: Tensor, host: &mut PinnedHostSlice<u8>) -> Result<InFlight> {
        let (src, elems) = crate::cuda::buffer_span(&t, &self.compute)?;
        let bytes = elems * t.dtype().size_in_bytes();
        if bytes > host.len() {
            bail!("offload: a {bytes} byte buffer does not fit a {} byte host buffer", host.len());
        }
        let dst = host.as_mut_ptr().w()? as *mut std::ffi::c_void;
        self.copy.join(&self.compute).w()?;
        // SAFETY: `host` holds `bytes`; `t` keeps the buffer alive in the InFlight until the
        // compute stream waits for `done`.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, self.copy.cu_stream()) }.result().w()?;
        self.in_flight(t)
    }

    /// Starts filling a new `[shape]` tensor of `dtype` from `host[offset..]`; the memory comes
    /// from the compute stream's pool, so the copy waits for the compute stream's queued work.
    pub fn to_device(
        &self,
        host: &PinnedHostSlice<u8>,
        offset: usize,
        shape: &Shape,
        dtype: DType,
    ) -> Result<InFlight> {
        let bytes = shape.elem_count() * dtype.size_in_bytes();
        if offset + bytes > host.len() {
            bail!("offload: {bytes} bytes at {offset} are outside a {} byte host buffer", host.len());
        }
        let t = by_dtype!(dtype, uninit(&self.device, shape))?;
        let dst = address(&t, &self.compute)?;
        // SAFETY: in bounds (checked above); the host buffer outlives the copy (its owner waits
        // for the copy stream before freeing it).
        let src = unsafe { (host.as_ptr().w()?).add(offset) } as *const std::ffi::c_void;
        self.copy.join(&self.compute).w()?;
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, self.copy.cu_stream()) }.result().w()?;
        self.in_flight(t)
    }

    /// Blocks the host until every queued copy is done (before a host buffer is freed).
    pub fn synchronize(&self) -> Result<()> {
        self.copy.synchronize().w()
    }

    fn in_flight(&self, t: Tensor) -> Result<InFlight> {
        let done = self.copy.record_event(None).w()?;
        Ok(InFlight { tensor: Some(t), done, compute: self.compute.clone() })
    }
}

fn uninit<T: CudaDType + WithDType + DeviceRepr>(dev: &CudaDevice, shape: &Shape) -> Result<Tensor> {
    // SAFETY: written by the copy before anything reads it (the reader waits for the copy).
    let slice = unsafe { dev.alloc::<T>(shape.elem_count()) }?;
    Ok(wrap(slice, dev, shape.dims()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Out to the host and back, in every dtype, with the source freed while the compute stream
    /// queues more work: the round trip is exact — without cudarc's event tracking, as training
    /// runs (`cuda::order_by_stream`): the explicit events alone order the copies.
    #[test]
    fn a_tensor_comes_back_from_the_host_unchanged() {
        let gpu = Device::new_cuda(0).unwrap();
        crate::cuda::order_by_stream(&gpu);
        let copies = CopyStream::new(&gpu).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let want = Tensor::randn(0f32, 1.0, (37, 129), &gpu).unwrap().to_dtype(dtype).unwrap();
            let mut host = copies.host_buffer(37 * 129 * 4 + 64).unwrap();
            let out = copies.to_host(want.clone(), &mut host).unwrap();
            // more compute-stream work reusing freed memory
            let _noise = (Tensor::randn(0f32, 1.0, (37, 129), &gpu).unwrap() * 3.0).unwrap();
            out.finish().unwrap();
            let back = copies.to_device(&host, 0, want.shape(), dtype).unwrap().finish().unwrap();
            let diff = (back.to_dtype(DType::F32).unwrap() - want.to_dtype(DType::F32).unwrap()).unwrap();
            assert_eq!(diff.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap(), 0.0, "{dtype:?}");
        }
    }
}
