//! Input embeddings. On a GPU an untied table stays in host memory: a step reads only its own
//! b·t rows, and the table (250 MiB for Mistral-7B, 313 MiB for Llama-2-13B in f16) is VRAM that
//! a small card can spend on batch. The table is copied into mapped page-locked memory, which
//! the GPU reads over PCIe in one gather kernel (kernels/embedding.cu); where pinning fails, the
//! rows are gathered on the host in parallel and uploaded. A table tied to lm_head lives on the
//! device, where the loss needs it anyway.

use candle_core::{bail, CpuStorage, DType, Device, Result, Storage, Tensor, WithDType};
use rayon::prelude::*;

/// `[vocab, hidden]` rows looked up by token id, output on `device`.
#[derive(Debug, Clone)]
pub struct Embedding {
    lookup: Lookup,
    device: Device,
}

/// Where the table is, which decides how a step's rows are read; one copy of it either way.
#[derive(Debug, Clone)]
enum Lookup {
    /// On the compute device (a tied table, or a CPU run): index_select.
    OnDevice(Tensor),
    /// In pageable host memory: gathered on the host and uploaded (where pinning failed).
    HostGather(Tensor),
    /// In mapped page-locked host memory the GPU reads itself.
    #[cfg(feature = "cuda")]
    Mapped(std::sync::Arc<mapped::MappedTable>),
}

impl Embedding {
    pub fn new(table: Tensor, device: &Device) -> Self {
        let lookup = if table.device().same_device(device) {
            Lookup::OnDevice(table)
        } else {
            #[cfg(feature = "cuda")]
            let lookup = match mapped::MappedTable::for_table(&table, device) {
                Some(mapped) => Lookup::Mapped(mapped),
                None => Lookup::HostGather(table),
            };
            #[cfg(not(feature = "cuda"))]
            let lookup = Lookup::HostGather(table);
            lookup
        };
        Self { lookup, device: device.clone() }
    }

    /// Whether `t` is this table (a tied lm_head).
    pub fn is_table(&self, t: &Tensor) -> bool {
        matches!(&self.lookup, Lookup::OnDevice(table) if table.id() == t.id())
    }

    /// Bytes of the table on the compute device (0 when it is held on the host).
    pub fn device_bytes(&self) -> usize {
        match &self.lookup {
            Lookup::OnDevice(t) => t.elem_count() * t.dtype().size_in_bytes(),
            _ => 0,
        }
    }

    /// ids `[b, t]` (u32, any device) → `[b, t, hidden]` on the compute device.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let rows = match &self.lookup {
            Lookup::OnDevice(table) => table.index_select(&ids.flatten_all()?, 0)?,
            Lookup::HostGather(table) => {
                let ids = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1::<u32>()?;
                let hidden = table.dim(1)?;
                gather_host_rows(table, &ids, &self.device)?.reshape(((), hidden))?
            }
            #[cfg(feature = "cuda")]
            Lookup::Mapped(mapped) => {
                mapped.gather(&ids.flatten_all()?.to_dtype(DType::U32)?.to_device(&self.device)?)?
            }
        };
        let hidden = rows.dim(1)?;
        rows.reshape((b, t, hidden))
    }
}

/// Rows `ids` of a `[vocab, hidden]` CPU table, on `device` (flat).
fn gather_host_rows(table: &Tensor, ids: &[u32], device: &Device) -> Result<Tensor> {
    let hidden = table.dim(1)?;
    let table = table.contiguous()?;
    let (storage, layout) = table.storage_and_layout();
    let start = layout.start_offset();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => gather(&v[start..], ids, hidden, device),
        Storage::Cpu(CpuStorage::F16(v)) => gather(&v[start..], ids, hidden, device),
        Storage::Cpu(CpuStorage::BF16(v)) => gather(&v[start..], ids, hidden, device),
        _ => bail!("a host embedding table is f32, f16 or bf16 on the CPU"),
    }
}

/// Rows `ids` of a contiguous `[vocab, hidden]` table, copied in parallel into one buffer and
/// uploaded to `device`.
fn gather<T: WithDType>(table: &[T], ids: &[u32], hidden: usize, device: &Device) -> Result<Tensor> {
    let vocab = table.len() / hidden.max(1);
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("token id {bad} is outside the embedding table ({vocab} rows)");
    }
    let mut out: Vec<T> = Vec::with_capacity(ids.len() * hidden);
    out.spare_capacity_mut().par_chunks_mut(hidden).zip(ids.par_iter()).for_each(|(row, &id)| {
        let src = &table[id as usize * hidden..][..hidden];
        for (dst, &v) in row.iter_mut().zip(src) {
            dst.write(v);
        }
    });
    // SAFETY: the loop above wrote all ids.len() · hidden elements.
    unsafe { out.set_len(ids.len() * hidden) };
    Tensor::from_vec(out, ids.len() * hidden, device)
}

#[cfg(feature = "cuda")]
pub(crate) mod mapped {
    //! The table in mapped page-locked host memory and the gather kernel that reads it.
    use candle_core::cuda_backend::cudarc::driver::{sys, DeviceRepr, PinnedHostSlice, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CpuStorage, DType, Device, Result, Storage, Tensor, WithDType};

    use crate::kernels::{blocks, cuda_device, view, wrap};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/embedding.ptx"));
    const MODULE: &str = "lora_ft_embedding";

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
                    tracing::warn!(
                        "embedding table not mapped into the GPU ({e}); gathering rows on the host"
                    );
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
            crate::kernels::by_dtype!(self.dtype, gather_typed(self, ids))
        }
    }

    fn gather_typed<T: CudaDType + WithDType + DeviceRepr>(
        table: &MappedTable,
        ids: &Tensor,
    ) -> Result<Tensor> {
        let dev = cuda_device(ids)?;
        let n = ids.elem_count();
        let hidden = table.row_bytes / T::DTYPE.size_in_bytes();
        let out = unsafe { dev.alloc::<T>(n * hidden)? };
        let func = dev.get_or_load_custom_func("embedding_gather", MODULE, PTX)?;
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
            let bytes =
                unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
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
        let want =
            table.to_dtype(DType::F32)?.index_select(&ids.narrow(0, 0, 5)?.to_device(&Device::Cpu)?, 0)?;
        let diff = (got.narrow(0, 0, 5)? - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        assert_eq!(got.get(5)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host gather equals index_select, in each dtype, and a bad id is an error, not a panic.
    #[test]
    fn host_gather_equals_index_select() -> Result<()> {
        let table = Tensor::randn(0f32, 1.0, (50, 12), &Device::Cpu)?;
        let ids = Tensor::new(&[[3u32, 49, 0], [7, 7, 21]], &Device::Cpu)?;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let table = table.to_dtype(dtype)?;
            let want = table.index_select(&ids.flatten_all()?, 0)?.reshape((2, 3, 12))?;
            let rows = gather_host_rows(&table, &ids.flatten_all()?.to_vec1()?, &Device::Cpu)?;
            let diff = (rows.reshape((2, 3, 12))?.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?;
            assert_eq!(diff.abs()?.max_all()?.to_scalar::<f32>()?, 0.0, "{dtype:?}");
            let same_device = Embedding::new(table.clone(), &Device::Cpu).forward(&ids)?;
            assert_eq!(same_device.dims(), &[2, 3, 12]);
        }
        let err = gather(&[0f32; 24], &[1, 2], 12, &Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("token id 2"), "{err}");
        Ok(())
    }
}
