//! `model::ops::product_sum` on CUDA: one output buffer that cuBLAS GEMMs accumulate onto (beta = 1) and
//! tensors are added to in place (cublasAxpyEx), f32 / f16 / bf16 with f32 accumulation.

use std::ffi::c_void;

use candle_core::cuda_backend::cudarc::cublas::sys::{self as blas, cublasOperation_t, cudaDataType};
use candle_core::cuda_backend::cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, CudaDevice, DType, Result, Tensor, WithDType};
use half::{bf16, f16};

use super::{cuda_device, view, wrap};

/// `alpha · op(lhs) · op(rhs)`, row-major, its dims checked by the caller
/// (`model::ops::product_sum`): `lhs` `[m, k]`, or `[k, m]` when `lhs_transposed`; `rhs`
/// `[k, n]`, or `[n, k]` when `rhs_transposed`.
pub struct Operands<'a> {
    pub lhs: &'a Tensor,
    pub rhs: &'a Tensor,
    pub lhs_transposed: bool,
    pub rhs_transposed: bool,
    pub alpha: f64,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl Operands<'_> {
    fn dims(&self) -> Result<(usize, usize, usize)> {
        Ok((self.m, self.k, self.n))
    }
}

/// An element type cuBLAS sums in f32.
pub trait BlasElement: CudaDType + WithDType {
    const DATA_TYPE: cudaDataType;
}
impl BlasElement for f32 {
    const DATA_TYPE: cudaDataType = cudaDataType::CUDA_R_32F;
}
impl BlasElement for f16 {
    const DATA_TYPE: cudaDataType = cudaDataType::CUDA_R_16F;
}
impl BlasElement for bf16 {
    const DATA_TYPE: cudaDataType = cudaDataType::CUDA_R_16BF;
}

enum Buffer {
    F32(CudaSlice<f32>),
    F16(CudaSlice<f16>),
    BF16(CudaSlice<bf16>),
}

/// Runs `$body` with `$out` bound to the typed buffer.
macro_rules! with_buffer {
    ($buffer:expr, $out:ident => $body:expr) => {
        match $buffer {
            Buffer::F32($out) => $body,
            Buffer::F16($out) => $body,
            Buffer::BF16($out) => $body,
        }
    };
}

pub struct CudaSum {
    dev: CudaDevice,
    dims: (usize, usize),
    dtype: DType,
    out: Buffer,
}

impl CudaSum {
    /// A buffer holding `p` (written with beta = 0, so it need not be zeroed).
    pub fn start(p: &Operands) -> Result<Self> {
        let (m, _, n) = p.dims()?;
        let mut sum = Self::alloc(p.lhs, (m, n))?;
        with_buffer!(&mut sum.out, out => gemm_into(p, out, 0.0))?;
        Ok(sum)
    }

    /// A buffer holding a copy of `t`.
    pub fn from_tensor(t: &Tensor) -> Result<Self> {
        let mut sum = Self::alloc(t, t.dims2()?)?;
        let t = t.contiguous()?;
        let storage = t.storage_and_layout().0;
        with_buffer!(&mut sum.out, out => {
            // the tensor's own values: a view runs to the end of its storage (a row tile's
            // storage holds the rows after it too)
            let src = view(&storage, &t)?;
            sum.dev.memcpy_dtod(&src.slice(..t.elem_count()), out)
        })?;
        Ok(sum)
    }

    /// A zeroed buffer.
    pub fn zeros(like: &Tensor, dims: (usize, usize)) -> Result<Self> {
        let dev = cuda_device(like)?;
        let len = dims.0 * dims.1;
        let out = match like.dtype() {
            DType::F32 => Buffer::F32(dev.alloc_zeros::<f32>(len)?),
            DType::F16 => Buffer::F16(dev.alloc_zeros::<f16>(len)?),
            DType::BF16 => Buffer::BF16(dev.alloc_zeros::<bf16>(len)?),
            dt => bail!("sums of products take f32, f16 or bf16, not {dt:?}"),
        };
        Ok(Self { dev, dims, dtype: like.dtype(), out })
    }

    /// A buffer of `dims` in `like`'s dtype that `write` fills through its device address.
    pub fn written(
        like: &Tensor,
        dims: (usize, usize),
        write: impl FnOnce(u64) -> Result<()>,
    ) -> Result<Self> {
        let mut sum = Self::alloc(like, dims)?;
        sum.write_in_place(like.dtype(), dims, write)?;
        Ok(sum)
    }

    /// Hands the buffer's device address (row-major `dims` of `dtype`, checked against the sum)
    /// to `write`, a kernel launch that adds its result there in place.
    pub fn write_in_place(
        &mut self,
        dtype: DType,
        dims: (usize, usize),
        write: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        self.check("kernel output", dtype, dims)?;
        let stream = self.dev.cuda_stream();
        with_buffer!(&mut self.out, out => {
            let (address, _sync) = out.device_ptr_mut(&stream);
            write(address)
        })
    }

    fn alloc(like: &Tensor, dims: (usize, usize)) -> Result<Self> {
        let dev = cuda_device(like)?;
        let len = dims.0 * dims.1;
        // every element is written (beta = 0 GEMM or a copy) before it is read
        let out = unsafe {
            match like.dtype() {
                DType::F32 => Buffer::F32(dev.alloc::<f32>(len)?),
                DType::F16 => Buffer::F16(dev.alloc::<f16>(len)?),
                DType::BF16 => Buffer::BF16(dev.alloc::<bf16>(len)?),
                dt => bail!("sums of products take f32, f16 or bf16, not {dt:?}"),
            }
        };
        Ok(Self { dev, dims, dtype: like.dtype(), out })
    }

    fn check(&self, what: &str, dtype: DType, dims: (usize, usize)) -> Result<()> {
        if dtype != self.dtype || dims != self.dims {
            bail!("adding a {dtype:?} {what} of {dims:?} to a {:?} sum of {:?}", self.dtype, self.dims);
        }
        Ok(())
    }

    pub fn add_product(&mut self, p: &Operands) -> Result<()> {
        let (m, _, n) = p.dims()?;
        self.check("product", p.lhs.dtype(), (m, n))?;
        with_buffer!(&mut self.out, out => gemm_into(p, out, 1.0))
    }

    /// Columns [col0, col0 + n) += the product.
    pub fn add_product_to_columns(&mut self, p: &Operands, col0: usize) -> Result<()> {
        let (m, _, n) = p.dims()?;
        if p.lhs.dtype() != self.dtype || m != self.dims.0 || col0 + n > self.dims.1 {
            bail!(
                "adding a {:?} product of {:?} at column {col0} to a {:?} sum of {:?}",
                p.lhs.dtype(),
                (m, n),
                self.dtype,
                self.dims
            );
        }
        let width = self.dims.1;
        with_buffer!(&mut self.out, out => gemm_into_columns(p, out, 1.0, col0, width))
    }

    pub fn add_tensor(&mut self, t: &Tensor) -> Result<()> {
        self.check("tensor", t.dtype(), t.dims2()?)?;
        let t = t.contiguous()?;
        let storage = t.storage_and_layout().0;
        let dev = &self.dev;
        with_buffer!(&mut self.out, out => axpy_into(dev, &storage, &t, out))
    }

    pub fn finish(self) -> Tensor {
        let dims = [self.dims.0, self.dims.1];
        with_buffer!(self.out, out => wrap(out, &self.dev, &dims))
    }
}

/// out = lhs · op(rhs) + beta · out, row-major, as a column-major cuBLAS call on the transposes:
/// outᵀ = op(rhs)ᵀ · lhsᵀ.
fn gemm_into<T: BlasElement>(p: &Operands, out: &mut CudaSlice<T>, beta: f64) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let n = p.dims()?.2;
    gemm_into_columns(p, out, beta, 0, n)
}

/// The same into columns [col0, col0 + n) of a row-major output `width` columns wide.
fn gemm_into_columns<T: BlasElement>(
    p: &Operands,
    out: &mut CudaSlice<T>,
    beta: f64,
    col0: usize,
    width: usize,
) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let (m, k, n) = p.dims()?;
    let ((lhs, ldl), (rhs, ldr)) = (operand(p.lhs)?, operand(p.rhs)?);
    let dev = cuda_device(&lhs)?;
    let op = |transposed: bool| {
        if transposed {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    // a row-major [r, c] operand with row stride s is the column-major [c, r] with ld s
    let cfg = GemmConfig {
        transa: op(p.rhs_transposed),
        transb: op(p.lhs_transposed),
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: T::from_f64(p.alpha),
        lda: ldr,
        ldb: ldl,
        beta: T::from_f64(beta),
        ldc: width as i32,
    };
    let (ls, rs) = (lhs.storage_and_layout().0, rhs.storage_and_layout().0);
    let (lv, rv) = (view::<T>(&ls, &lhs)?, view::<T>(&rs, &rhs)?);
    let mut dst = out.slice_mut(col0..);
    unsafe { dev.cublas_handle().gemm(cfg, &rv, &lv, &mut dst) }.w()?;
    Ok(())
}

/// A 2-D operand as cuBLAS reads it and its row stride: in place when its columns are adjacent
/// (a column slice of a wider tensor included), else a contiguous copy.
fn operand(t: &Tensor) -> Result<(Tensor, i32)> {
    let (_, cols) = t.dims2()?;
    let (row_stride, col_stride) = (t.stride()[0], t.stride()[1]);
    if (col_stride == 1 || cols == 1) && row_stride >= cols.max(1) {
        return Ok((t.clone(), row_stride as i32));
    }
    Ok((t.contiguous()?, cols.max(1) as i32))
}

/// out += t, in f32 arithmetic.
fn axpy_into<T: BlasElement>(
    dev: &CudaDevice,
    storage: &candle_core::Storage,
    t: &Tensor,
    out: &mut CudaSlice<T>,
) -> Result<()>
where
    CudaBlas: Gemm<T>,
{
    let src = view::<T>(storage, t)?;
    let stream = dev.cuda_stream();
    let blas = dev.cublas_handle();
    let alpha = 1f32;
    let (x, _x_sync) = src.device_ptr(&stream);
    let (y, _y_sync) = out.device_ptr_mut(&stream);
    let status = unsafe {
        blas::cublasAxpyEx_64(
            *blas.handle(),
            t.elem_count() as i64,
            (&alpha as *const f32).cast::<c_void>(),
            cudaDataType::CUDA_R_32F,
            x as *const c_void,
            T::DATA_TYPE,
            1,
            y as *mut c_void,
            T::DATA_TYPE,
            1,
            cudaDataType::CUDA_R_32F,
        )
    };
    status.result().w()?;
    Ok(())
}
