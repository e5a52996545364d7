//! The weights of one NF4 decode-projection launch (`nf4_gemv`, `nf4_lut_gemm`) and what each
//! output row adds — bias, residual, the LoRA term — as the caller gives them ([`Segment`]) and
//! as the kernels read them (`RawSegments`, nf4_segments.cuh's structs field for field).

use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::Tensor;

/// The most weights one launch takes (`MAX_SEGMENTS` in nf4_segments.cuh).
pub const MAX_SEGMENTS: usize = 3;

/// The absmax of W's 64-value blocks, as `quant::Absmax` stores them.
pub enum Scales<'a> {
    /// One f32 per block.
    F32(&'a Tensor),
    /// 8-bit codes (one per block), f32 scales (one per 256 codes) and the offset added back.
    Double { codes: &'a Tensor, absmax2: &'a Tensor, offset: f32 },
}

/// One weight of a launch and where its rows go.
pub struct Segment<'a> {
    /// W's packed codes (U8, two per byte, the first value in the high nibble).
    pub packed: &'a Tensor,
    pub scales: Scales<'a>,
    /// W's rows (`[out_dim, in]`).
    pub out_dim: usize,
    /// The device address of y `[n, out_dim]`, x's dtype, row-major.
    pub y: u64,
    /// Added to y: `[n, out_dim]` in x's dtype, contiguous.
    pub residual: Option<&'a Tensor>,
    /// Added to every row: `[out_dim]` in x's dtype, contiguous.
    pub bias: Option<&'a Tensor>,
    /// The LoRA term: h `[n, width]` f32 from `lora_down` (this weight's columns from `col`)
    /// times B `[out_dim, rank]` f32.
    pub lora: Option<LoraUp<'a>>,
}

/// A weight's LoRA term in a launch: columns `col .. col + rank` of h times Bᵀ.
pub struct LoraUp<'a> {
    pub h: &'a Tensor,
    pub col: usize,
    pub b: &'a Tensor,
}

/// `Nf4Segment` of nf4_gemv.cu, field for field.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct RawSegment {
    pub(super) packed: u64,
    pub(super) absmax: u64,
    pub(super) codes: u64,
    pub(super) absmax2: u64,
    pub(super) y: u64,
    pub(super) residual: u64,
    pub(super) bias: u64,
    pub(super) lora_h: u64,
    pub(super) lora_b: u64,
    pub(super) offset: f32,
    pub(super) out: i32,
    pub(super) block0: i32,
    pub(super) h_stride: i32,
    pub(super) h_col: i32,
    pub(super) rank: i32,
}

/// `Nf4Segments` of nf4_gemv.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct RawSegments {
    pub(super) s: [RawSegment; MAX_SEGMENTS],
    pub(super) count: i32,
    pub(super) pad: i32,
}

// SAFETY: plain-old-data laid out as the kernel's parameter struct (repr(C), the same fields).
unsafe impl DeviceRepr for RawSegments {}
