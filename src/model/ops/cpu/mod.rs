//! The CPU path's fused f32 loops: what the composed candle ops compute for attention, RMSNorm,
//! the gated activation, LoRA dropout and the cross-entropy, in one pass over each row (threads
//! over rows), reading strided operands in place. The composed ops stay as the other dtypes' path
//! and as these loops' reference in the tests; each op file sends f32 CPU tensors here.

pub mod attention;
pub mod cross_entropy;
pub mod elementwise;
pub mod gemm;
pub mod vector;

use candle_core::{CpuStorage, DType, Device, Layout, Result, Shape, Storage, StorageRef, Tensor};

/// Whether the fused CPU loops take these tensors: all f32 on the CPU.
pub fn takes(tensors: &[&Tensor]) -> bool {
    tensors.iter().all(|t| t.device().is_cpu() && t.dtype() == DType::F32)
}

/// Read access to an f32 CPU tensor's buffer and its layout, held for the guard's life.
pub struct Read<'a> {
    storage: StorageRef<'a>,
    layout: &'a Layout,
}

impl<'a> Read<'a> {
    pub fn new(t: &'a Tensor) -> Result<Self> {
        let (storage, layout) = t.storage_and_layout();
        match &*storage {
            Storage::Cpu(CpuStorage::F32(_)) => Ok(Self { storage, layout }),
            _ => candle_core::bail!("the fused CPU loops read f32 CPU tensors"),
        }
    }

    /// The whole buffer (the layout says where the tensor is in it).
    pub fn buffer(&self) -> &[f32] {
        match &*self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => v,
            _ => unreachable!("checked in new"),
        }
    }

    pub fn layout(&self) -> &Layout {
        self.layout
    }

    /// The tensor's elements in order, where its layout is contiguous.
    pub fn contiguous(&self) -> Option<&[f32]> {
        self.layout.contiguous_offsets().map(|(start, end)| &self.buffer()[start..end])
    }
}

/// `f` on the elements of `t` in order: in place where `t` is contiguous, else on a copy.
pub fn with_rows<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
    let read = Read::new(t)?;
    if let Some(values) = read.contiguous() {
        return f(values);
    }
    drop(read);
    let copy = t.contiguous()?;
    let read = Read::new(&copy)?;
    f(read.contiguous().expect("made contiguous"))
}

/// A new CPU tensor of `shape` over `values`.
pub fn tensor(values: Vec<f32>, shape: impl Into<Shape>) -> Result<Tensor> {
    Tensor::from_vec(values, shape, &Device::Cpu)
}

/// A raw pointer that threads share to write disjoint parts of one buffer (each loop says why
/// its parts are disjoint).
#[derive(Clone, Copy)]
pub struct SharedMut(*mut f32);

// SAFETY: the loops that share one write only parts no other thread reads or writes.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    pub fn new(values: &mut [f32]) -> Self {
        Self(values.as_mut_ptr())
    }

    /// The pointer `offset` elements in.
    ///
    /// # Safety
    /// `offset` is inside the buffer the pointer came from.
    pub unsafe fn at(self, offset: usize) -> *mut f32 {
        self.0.add(offset)
    }

    /// `len` elements from `offset` as a slice.
    ///
    /// # Safety
    /// The range is inside the buffer, and no other thread touches it while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &mut [f32] {
        std::slice::from_raw_parts_mut(self.0.add(offset), len)
    }
}
