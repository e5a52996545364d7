//! Frozen-weight quantization: NF4 with optional double quantization, bit-exact with
//! bitsandbytes 0.50 (`quantize_4bit(quant_type="nf4", blocksize=64)`).
//!
//! `Nf4Tensor` keeps its parts as candle tensors on the weight's device so that device kernels can
//! replace the CPU reference (`nf4`, `dynamic`, `double`) without changing the type.

pub mod double;
pub mod dynamic;
pub mod nf4;

use candle_core::{bail, DType, Device, Result, Shape, Storage, Tensor, WithDType};
use half::{bf16, f16};

use double::DoubleQuantized;

/// How the frozen projection weights of a model are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// Dense, in the compute dtype.
    None,
    /// NF4 in blocks of 64; `double_quant` stores the absmax values as 8-bit codes.
    Nf4 { double_quant: bool },
}

/// How the per-block absmax values of an `Nf4Tensor` are stored.
#[derive(Debug, Clone)]
pub enum Absmax {
    /// One f32 per 64 values (`compress_statistics=False`).
    F32(Tensor),
    /// 8-bit dynamic-map codes (U8, one per 64 values), f32 scales (one per 256 codes) and the
    /// f32 mean subtracted before quantizing (`compress_statistics=True`).
    Double { codes: Tensor, absmax2: Tensor, offset: f32 },
}

/// Values per double-quant statistics block (256 absmax codes of 64 values each): where a slice
/// of rows may start (`Nf4Tensor::dequantize_rows`).
pub const ROW_ALIGN_VALUES: usize = 64 * 256;

/// A tensor stored as NF4: packed 4-bit codes (U8, `(n + 1) / 2` bytes) and blockwise absmax.
#[derive(Debug, Clone)]
pub struct Nf4Tensor {
    packed: Tensor,
    absmax: Absmax,
    shape: Shape,
    dtype: DType,
}

impl Nf4Tensor {
    /// Quantizes a float tensor (f32, f16 or bf16, any shape) in row-major order. The parts live
    /// on `x`'s device.
    pub fn quantize(x: &Tensor, double_quant: bool) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let (packed, absmax) = quantize_on_device(x, double_quant)?;
            return Ok(Self { packed, absmax, shape: x.shape().clone(), dtype: x.dtype() });
        }
        let (packed, absmax) = match x.dtype() {
            DType::F32 => with_host_slice(x, nf4::quantize::<f32>)?,
            DType::F16 => with_host_slice(x, nf4::quantize::<f16>)?,
            DType::BF16 => with_host_slice(x, nf4::quantize::<bf16>)?,
            dt => bail!("NF4 quantization needs an f32, f16 or bf16 tensor, got {dt:?}"),
        };
        let device = x.device();
        let n_packed = packed.len();
        let absmax = if double_quant {
            let dq = DoubleQuantized::compress(&absmax);
            let (n_codes, n2) = (dq.codes.len(), dq.absmax2.len());
            Absmax::Double {
                codes: Tensor::from_vec(dq.codes, n_codes, device)?,
                absmax2: Tensor::from_vec(dq.absmax2, n2, device)?,
                offset: dq.offset,
            }
        } else {
            let n = absmax.len();
            Absmax::F32(Tensor::from_vec(absmax, n, device)?)
        };
        let packed = Tensor::from_vec(packed, n_packed, device)?;
        Ok(Self { packed, absmax, shape: x.shape().clone(), dtype: x.dtype() })
    }

    /// The values in `dtype` (f32, f16 or bf16) with the original shape: `code * absmax` in f32,
    /// rounded once to `dtype`.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        let n = self.shape.elem_count();
        #[cfg(feature = "cuda")]
        if self.packed.device().is_cuda() {
            return dequantize_on_device(&self.packed, &self.absmax, n, dtype)?.reshape(self.shape.clone());
        }
        let absmax = self.absmax_f32()?;
        let dev = self.packed.device();
        match dtype {
            DType::F32 => self.dequantize_as::<f32>(&absmax, n, dev),
            DType::F16 => self.dequantize_as::<f16>(&absmax, n, dev),
            DType::BF16 => self.dequantize_as::<bf16>(&absmax, n, dev),
            dt => bail!("NF4 dequantization produces f32, f16 or bf16, not {dt:?}"),
        }
    }

    fn dequantize_as<T: nf4::Element + WithDType>(
        &self,
        absmax: &[f32],
        n: usize,
        dev: &Device,
    ) -> Result<Tensor> {
        let values: Vec<T> = with_host_slice(&self.packed, |p: &[u8]| nf4::dequantize(p, absmax, n))?;
        Tensor::from_vec(values, self.shape.clone(), dev)
    }

    /// Rows `rows` of a 2-D weight in `dtype`: the same values as those rows of `dequantize`, with
    /// only their own scratch (a GEMM can then read a large weight a slice at a time). The first
    /// row must start a double-quant statistics block: `rows.start · cols` a multiple of
    /// `ROW_ALIGN_VALUES`.
    pub fn dequantize_rows(&self, dtype: DType, rows: std::ops::Range<usize>) -> Result<Tensor> {
        let (n_rows, cols) = self.shape.dims2()?;
        let (first, last) = (rows.start, rows.end.min(n_rows));
        if first >= last || (first * cols) % ROW_ALIGN_VALUES != 0 {
            bail!("NF4 rows {rows:?} of [{n_rows}, {cols}]: empty, or not starting on a {ROW_ALIGN_VALUES}-value block");
        }
        #[cfg(feature = "cuda")]
        if self.packed.device().is_cuda() {
            let (start, n) = (first * cols, (last - first) * cols);
            let packed = self.packed.narrow(0, start / 2, n.div_ceil(2))?;
            let blocks = |size: usize| -> (usize, usize) { (start / size, n.div_ceil(size)) };
            let absmax = match &self.absmax {
                Absmax::F32(a) => Absmax::F32(a.narrow(0, blocks(64).0, blocks(64).1)?),
                Absmax::Double { codes, absmax2, offset } => Absmax::Double {
                    codes: codes.narrow(0, blocks(64).0, blocks(64).1)?,
                    absmax2: absmax2.narrow(0, blocks(ROW_ALIGN_VALUES).0, blocks(ROW_ALIGN_VALUES).1)?,
                    offset: *offset,
                },
            };
            return dequantize_on_device(&packed, &absmax, n, dtype)?.reshape((last - first, cols));
        }
        self.dequantize(dtype)?.narrow(0, first, last - first)
    }

    /// The f32 absmax per 64-value block (restored from the 8-bit codes under double quantization).
    pub fn absmax_f32(&self) -> Result<Vec<f32>> {
        match &self.absmax {
            Absmax::F32(a) => a.to_vec1(),
            Absmax::Double { codes, absmax2, offset } => {
                let dq =
                    DoubleQuantized { codes: codes.to_vec1()?, absmax2: absmax2.to_vec1()?, offset: *offset };
                Ok(dq.decompress())
            }
        }
    }

    pub fn packed(&self) -> &Tensor {
        &self.packed
    }

    pub fn absmax(&self) -> &Absmax {
        &self.absmax
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dtype of the tensor that was quantized.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        self.packed.device()
    }

    /// Bytes held: packed codes plus absmax storage (codes, scales and the offset).
    pub fn size_in_bytes(&self) -> usize {
        let absmax = match &self.absmax {
            Absmax::F32(a) => a.elem_count() * 4,
            Absmax::Double { codes, absmax2, .. } => codes.elem_count() + absmax2.elem_count() * 4 + 4,
        };
        self.packed.elem_count() + absmax
    }
}

/// The most rows of x the NF4 GEMV takes (decode batches) where `in` is a multiple of 256; 8
/// elsewhere. More go through the NF4 GEMM or dequantize + GEMM.
pub const GEMV_MAX_ROWS: usize = 64;

#[cfg(feature = "cuda")]
const _: () = assert!(GEMV_MAX_ROWS == crate::cuda::nf4_gemv::LOOKUP_MAX_ROWS);

/// Whether `nf4_gemv` takes x against w: both on one CUDA device, x `[n, in]` f16 or bf16,
/// contiguous, 1 to `GEMV_MAX_ROWS` rows (8 where `in` is not a multiple of 256), and `in` a
/// multiple of 32 (the layout the kernel's 16-byte loads need).
#[cfg(feature = "cuda")]
pub fn nf4_gemv_applies(x: &Tensor, w: &Nf4Tensor) -> bool {
    let Ok((out_dim, in_dim)) = w.shape.dims2() else { return false };
    x.device().same_device(w.device()) && crate::cuda::nf4_gemv::supports(x, out_dim, in_dim)
}

/// Whether `nf4_gemv` takes x against w: never without CUDA.
#[cfg(not(feature = "cuda"))]
pub fn nf4_gemv_applies(_x: &Tensor, _w: &Nf4Tensor) -> bool {
    false
}

/// x `[n, in]` · wᵀ `[n, out]` in x's dtype, read straight from w's NF4 codes and absmax (no
/// 16-bit copy of w), the sums in f32: where `in` is a multiple of 256 each weight is its codebook
/// value rounded to x's dtype and each block's sum is scaled by its absmax
/// (`nf4_gemv::Kernel::Lookup`), elsewhere each weight is code · absmax exact in f32. An error
/// where `nf4_gemv_applies` is false.
pub fn nf4_gemv(x: &Tensor, w: &Nf4Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if nf4_gemv_applies(x, w) {
        let (out_dim, _) = w.shape.dims2()?;
        return crate::cuda::nf4_gemv::gemv(x, &w.packed, w.gemv_scales(), out_dim);
    }
    bail!(
        "the NF4 GEMV takes a CUDA f16/bf16 x of 1 to 8 rows and a multiple of 32 columns (to {GEMV_MAX_ROWS} rows \
         with a multiple of 256), not {:?} {:?} on {:?} against {:?}",
        x.dims(),
        x.dtype(),
        x.device().location(),
        w.shape.dims()
    )
}

/// `nf4_gemv` written to device address `y` (`[n, out]`, x's dtype), or added to it with
/// `accumulate` (the sum taken in f32, rounded once): the product accumulated in place into a
/// sum of products.
///
/// # Safety
/// `y` must address `n · out` elements of x's dtype on x's device that no other work uses
/// until the launch has run on the device's stream.
#[cfg(feature = "cuda")]
pub unsafe fn nf4_gemv_into(x: &Tensor, w: &Nf4Tensor, y: u64, accumulate: bool) -> Result<()> {
    if !nf4_gemv_applies(x, w) {
        bail!("the NF4 GEMV does not take x {:?} {:?} against {:?}", x.dims(), x.dtype(), w.shape.dims());
    }
    let (out_dim, _) = w.shape.dims2()?;
    crate::cuda::nf4_gemv::gemv_into(x, &w.packed, w.gemv_scales(), out_dim, y, accumulate)
}

/// The most rows of x the NF4 GEMM takes (decode batches past the GEMV's, short prefills); more
/// go through dequantize + GEMM.
pub const GEMM_MAX_ROWS: usize = 256;

#[cfg(feature = "cuda")]
const _: () = assert!(GEMM_MAX_ROWS == crate::cuda::nf4_gemm::MAX_ROWS);

/// The most rows a forward sends through the NF4 GEMM: past 64, dequantize + cuBLAS is the faster
/// on an H200 (benches/issue38/nf4_gemm_bench.log), so the GEMM's 65-256 rows serve its tests.
pub const GEMM_ROUTED_ROWS: usize = 64;

/// Whether `nf4_gemm` takes x against w: both on one CUDA device, x `[m, in]` f16 or bf16,
/// contiguous, 1 to `GEMM_MAX_ROWS` rows, and `in` a multiple of 64 (one absmax block of each
/// row per pipeline stage of the kernel).
#[cfg(feature = "cuda")]
pub fn nf4_gemm_applies(x: &Tensor, w: &Nf4Tensor) -> bool {
    let Ok((out_dim, in_dim)) = w.shape.dims2() else { return false };
    x.device().same_device(w.device()) && crate::cuda::nf4_gemm::supports(x, out_dim, in_dim)
}

/// Whether `nf4_gemm` takes x against w: never without CUDA.
#[cfg(not(feature = "cuda"))]
pub fn nf4_gemm_applies(_x: &Tensor, _w: &Nf4Tensor) -> bool {
    false
}

/// x `[m, in]` · wᵀ `[m, out]` in x's dtype on tensor cores, read straight from w's NF4 codes
/// and absmax (no 16-bit copy of w): each weight the value `w.dequantize(x.dtype())` holds, the
/// sums in f32. An error where `nf4_gemm_applies` is false.
pub fn nf4_gemm(x: &Tensor, w: &Nf4Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if nf4_gemm_applies(x, w) {
        let (out_dim, _) = w.shape.dims2()?;
        return crate::cuda::nf4_gemm::gemm(x, &w.packed, w.gemv_scales(), out_dim);
    }
    bail!(
        "the NF4 GEMM takes a CUDA f16/bf16 x of 1 to {GEMM_MAX_ROWS} rows and a multiple of 64 columns, not {:?} \
         {:?} on {:?} against {:?}",
        x.dims(),
        x.dtype(),
        x.device().location(),
        w.shape.dims()
    )
}

/// `nf4_gemm` written to device address `y` (`[m, out]`, x's dtype), or added to it with
/// `accumulate` (the sum taken in f32, rounded once): the product accumulated in place into a
/// sum of products.
///
/// # Safety
/// `y` must address `m · out` elements of x's dtype on x's device that no other work uses
/// until the launch has run on the device's stream.
#[cfg(feature = "cuda")]
pub unsafe fn nf4_gemm_into(x: &Tensor, w: &Nf4Tensor, y: u64, accumulate: bool) -> Result<()> {
    if !nf4_gemm_applies(x, w) {
        bail!("the NF4 GEMM does not take x {:?} {:?} against {:?}", x.dims(), x.dtype(), w.shape.dims());
    }
    let (out_dim, _) = w.shape.dims2()?;
    crate::cuda::nf4_gemm::gemm_into(x, &w.packed, w.gemv_scales(), out_dim, y, accumulate)
}

#[cfg(feature = "cuda")]
impl Nf4Tensor {
    /// This weight as one segment of an NF4 GEMV launch (`cuda::nf4_gemv::gemv_outputs`), with
    /// no bias, residual or LoRA term yet; `None` where the GEMV does not take x against it.
    pub fn gemv_segment(&self, x: &Tensor) -> Option<crate::cuda::nf4_gemv::Segment<'_>> {
        let (out_dim, _) = self.shape.dims2().ok()?;
        nf4_gemv_applies(x, self).then(|| crate::cuda::nf4_gemv::Segment {
            packed: &self.packed,
            scales: self.gemv_scales(),
            out_dim,
            y: 0,
            residual: None,
            bias: None,
            lora: None,
        })
    }

    /// The absmax parts as the GEMV and GEMM kernels read them.
    fn gemv_scales(&self) -> crate::cuda::nf4_gemv::Scales<'_> {
        use crate::cuda::nf4_gemv::Scales;
        match &self.absmax {
            Absmax::F32(a) => Scales::F32(a),
            Absmax::Double { codes, absmax2, offset } => Scales::Double { codes, absmax2, offset: *offset },
        }
    }
}

/// Runs `f` on the tensor's elements in row-major order: borrowed in place when the tensor is a
/// contiguous CPU tensor, otherwise from a host copy.
fn with_host_slice<T: WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) {
            return Ok(f(&cpu.as_slice::<T>()?[start..end]));
        }
    }
    Ok(f(&t.flatten_all()?.to_vec1::<T>()?))
}

/// Quantizes a CUDA tensor with the kernels of `crate::cuda::nf4`: packed codes and absmax, both
/// on its device, bit-exact with the CPU reference.
#[cfg(feature = "cuda")]
fn quantize_on_device(x: &Tensor, double_quant: bool) -> Result<(Tensor, Absmax)> {
    use crate::cuda::nf4;
    let x = x.contiguous()?.flatten_all()?;
    let absmax = nf4::absmax(&x)?;
    let packed = nf4::pack(&x, &absmax)?;
    if !double_quant {
        return Ok((packed, Absmax::F32(absmax)));
    }
    // The mean on the host, exactly as the CPU reference takes it (a few MB per tensor).
    let offset = double::mean_offset(&absmax.to_vec1::<f32>()?);
    let (codes, absmax2) = nf4::double_quantize(&absmax, offset)?;
    Ok((packed, Absmax::Double { codes, absmax2, offset }))
}

/// Dequantizes `n` values to `dtype` on the GPU (flat; the caller reshapes).
#[cfg(feature = "cuda")]
fn dequantize_on_device(packed: &Tensor, absmax: &Absmax, n: usize, dtype: DType) -> Result<Tensor> {
    use crate::cuda::nf4;
    match absmax {
        Absmax::F32(a) => nf4::dequantize(packed, a, n, dtype),
        Absmax::Double { codes, absmax2, offset } => {
            nf4::dequantize_double(packed, codes, absmax2, *offset, n, dtype)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(shape: (usize, usize), dtype: DType) -> Result<Tensor> {
        let n = shape.0 * shape.1;
        let v: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.08).collect();
        Tensor::from_vec(v, shape, &Device::Cpu)?.to_dtype(dtype)
    }

    #[test]
    fn requantizing_the_dequantized_tensor_gives_the_same_codes() -> Result<()> {
        for double_quant in [false, true] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let q = Nf4Tensor::quantize(&weight((24, 40), dtype)?, double_quant)?;
                let w = q.dequantize(DType::F32)?;
                assert_eq!(w.dims(), &[24, 40]);
                let q2 = Nf4Tensor::quantize(&w, false)?;
                assert_eq!(q.packed.to_vec1::<u8>()?, q2.packed.to_vec1::<u8>()?, "{dtype:?} {double_quant}");
                assert_eq!(q.absmax_f32()?, q2.absmax_f32()?);
            }
        }
        Ok(())
    }

    #[test]
    fn non_contiguous_input_is_read_in_row_major_order() -> Result<()> {
        let w = weight((40, 24), DType::F32)?;
        let a = Nf4Tensor::quantize(&w.t()?, true)?;
        let b = Nf4Tensor::quantize(&w.t()?.contiguous()?, true)?;
        assert_eq!(a.packed.to_vec1::<u8>()?, b.packed.to_vec1::<u8>()?);
        assert_eq!(a.shape().dims(), &[24, 40]);
        Ok(())
    }

    #[test]
    fn size_counts_packed_codes_and_statistics() -> Result<()> {
        let w = weight((64, 64), DType::F16)?;
        // 4096 values: 2048 bytes, 64 absmax → 64 codes + 1 scale + offset, or 64 f32
        assert_eq!(Nf4Tensor::quantize(&w, true)?.size_in_bytes(), 2048 + 64 + 4 + 4);
        assert_eq!(Nf4Tensor::quantize(&w, false)?.size_in_bytes(), 2048 + 256);
        Ok(())
    }

    #[test]
    fn integer_tensors_are_rejected() -> Result<()> {
        let t = Tensor::zeros((2, 64), DType::U8, &Device::Cpu)?;
        assert!(Nf4Tensor::quantize(&t, true).is_err());
        Ok(())
    }
}

#[cfg(test)]
mod kernel_tests {
    /// The kernel's constant dynamic map is bnb's map, value for value.
    #[test]
    fn kernel_dynamic_map_matches_the_reference() {
        let src = include_str!("../cuda/nf4_tables.cuh");
        let body = src.split("DYNAMIC_MAP[256] = {").nth(1).unwrap().split("};").next().unwrap();
        let values: Vec<f32> = body
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.trim_end_matches('f').parse().unwrap())
            .collect();
        assert_eq!(values.as_slice(), super::dynamic::dynamic_map().as_slice());
    }
}
