//! A table in mapped page-locked host memory and the gather kernel that reads its rows
//! (embedding.cu): the untied embedding table and the streamed lm_head.
use candle_core::cuda_backend::cudarc::driver::{sys, DeviceRepr, PinnedHostSlice, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CpuStorage, DType, Device, Result, Storage, Tensor, WithDType};

use super::{blocks, cuda_device, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("embedding");

pub struct MappedTable {
    /// The table's bytes, alive as long as the GPU reads them through `device_ptr`.
    pinned: PinnedHostSlice<u8>,
    device_ptr: sys::CUdeviceptr,
    rows: usize,
    row_bytes: usize,
    dtype: DType,
}

impl std::fmt::Debug for MappedTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedTable({} rows of {} bytes)", self.rows, self.row_bytes)
    }
}

impl MappedTable {
    /// A mapped copy of a CPU `[vocab, hidden]` table for a CUDA `device`; `None` (with a
    /// warning, the host gather then runs) when the table is not on the host, its rows are
    /// not 16-byte multiples, or the driver refuses the page-locked allocation.
    pub fn for_table(table: &Tensor, device: &Device) -> Option<std::sync::Arc<Self>> {
        let Device::Cuda(_) = device else { return None };
        if !table.device().is_cpu() {
            return None;
        }
        match Self::new(table, device) {
            Ok(mapped) => mapped.map(std::sync::Arc::new),
            Err(e) => {
                tracing::warn!("embedding table not mapped into the GPU ({e}); gathering rows on the host");
                None
            }
        }
    }

    fn new(table: &Tensor, device: &Device) -> Result<Option<Self>> {
        let (rows, hidden) = table.dims2()?;
        let row_bytes = hidden * table.dtype().size_in_bytes();
        if !row_bytes.is_multiple_of(16) {
            return Ok(None);
        }
        let Device::Cuda(dev) = device else { return Ok(None) };
        let ctx = dev.cuda_stream().context().clone();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        let bytes = rows * row_bytes;
        // SAFETY: every byte is written just below, before any read.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, flags) }.w()?;
        copy_table(table, host.as_mut_slice().w()?)?;
        let mut device_ptr: sys::CUdeviceptr = 0;
        let ptr = host.as_mut_ptr().w()? as *mut std::ffi::c_void;
        // SAFETY: `ptr` is a live allocation made with DEVICEMAP in this context; `host` keeps
        // it alive as long as `device_ptr` is used.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, ptr, 0) }.result().w()?;
        Ok(Some(Self { pinned: host, device_ptr, rows, row_bytes, dtype: table.dtype() }))
    }

    /// The page-locked bytes, `[rows, row_bytes]` (a source for asynchronous copies).
    pub fn pinned(&self) -> &PinnedHostSlice<u8> {
        &self.pinned
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Rows `ids` (u32 on the GPU) as a `[n, hidden]` tensor of the table's dtype there.
    pub fn gather(&self, ids: &Tensor) -> Result<Tensor> {
        crate::cuda::by_dtype!(self.dtype, gather_typed(self, ids))
    }
}

fn gather_typed<T: CudaDType + WithDType + DeviceRepr>(table: &MappedTable, ids: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(ids)?;
    let n = ids.elem_count();
    let hidden = table.row_bytes / T::DTYPE.size_in_bytes();
    let out = unsafe { dev.alloc::<T>(n * hidden)? };
    let func = KERNELS.function(&dev, "embedding_gather")?;
    {
        let storage = ids.storage_and_layout().0;
        let idv = view::<u32>(&storage, ids)?;
        let (vecs, rows) = ((table.row_bytes / 16) as i32, table.rows as u32);
        let mut l = func.builder();
        l.arg(&table.device_ptr).arg(&idv).arg(&out).arg(&vecs).arg(&rows);
        unsafe { l.launch(blocks(n, 128)) }.w()?;
    }
    Ok(wrap(out, &dev, &[n, hidden]))
}

/// The bytes of a CPU table, copied into `dst` (its size).
fn copy_table(table: &Tensor, dst: &mut [u8]) -> Result<()> {
    fn copy<T: WithDType>(v: &[T], dst: &mut [u8]) -> Result<()> {
        // SAFETY: f32/f16/bf16 are plain bit patterns; the slice is read as bytes, not written.
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
        if bytes.len() != dst.len() {
            candle_core::bail!("embedding table of {} bytes, {} mapped", bytes.len(), dst.len());
        }
        dst.copy_from_slice(bytes);
        Ok(())
    }
    let table = table.contiguous()?;
    let (storage, layout) = table.storage_and_layout();
    let range = layout.start_offset()..layout.start_offset() + table.elem_count();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => copy(&v[range], dst),
        Storage::Cpu(CpuStorage::F16(v)) => copy(&v[range], dst),
        Storage::Cpu(CpuStorage::BF16(v)) => copy(&v[range], dst),
        _ => candle_core::bail!("a host embedding table is f32, f16 or bf16 on the CPU"),
    }
}

/// The mapped gather equals index_select on the device, and an id past the table reads zeros.
#[cfg(test)]
#[test]
fn mapped_gather_equals_index_select() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let table = Tensor::randn(0f32, 1.0, (50, 64), &Device::Cpu)?.to_dtype(DType::F16)?;
    let mapped = MappedTable::for_table(&table, &gpu).expect("the table maps");
    let ids = Tensor::new(&[3u32, 49, 0, 7, 7, 50], &gpu)?;
    let got = mapped.gather(&ids)?.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let want = table.to_dtype(DType::F32)?.index_select(&ids.narrow(0, 0, 5)?.to_device(&Device::Cpu)?, 0)?;
    let diff = (got.narrow(0, 0, 5)? - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert_eq!(diff, 0.0);
    assert_eq!(got.get(5)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
    Ok(())
}
