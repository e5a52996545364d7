//! Input embeddings. On a GPU an untied table stays in host memory: a step reads only its own
//! b·t rows, and the table (250 MiB for Mistral-7B, 313 MiB for Llama-2-13B in f16) is VRAM that
//! a small card can spend on batch. The table is copied into mapped page-locked memory, which
//! the GPU reads over PCIe in one gather kernel (src/cuda/embedding.cu); where pinning fails, the
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
    Mapped(std::sync::Arc<crate::cuda::mapped::MappedTable>),
}

impl Embedding {
    pub fn new(table: Tensor, device: &Device) -> Self {
        let lookup = if table.device().same_device(device) {
            Lookup::OnDevice(table)
        } else {
            #[cfg(feature = "cuda")]
            let lookup = match crate::cuda::mapped::MappedTable::for_table(&table, device) {
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
