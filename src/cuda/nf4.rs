//! The NF4 kernels of `nf4.cu` (compiled to a fatbin by build.rs) as candle custom ops, so the
//! packed weight, its absmax and the dequantized output all stay on the GPU. Bit-exact with the
//! CPU reference in `nf4`, `dynamic` and `double`, and with bitsandbytes (tests/nf4_golden.rs).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
    WithDType,
};
use half::{bf16, f16};

use super::suffix;

pub static KERNELS: super::module::Kernels = super::module::kernels!("nf4");
const THREADS: u32 = 256; // a multiple of 32: one warp covers one 64-value block

/// Per-block absmax (blocks of 64) of a flat CUDA tensor, f32.
pub fn absmax(x: &Tensor) -> Result<Tensor> {
    x.apply_op1_no_bwd(&Nf4Absmax)
}

/// The packed NF4 codes (two per byte) of a flat CUDA tensor, given its absmax.
pub fn pack(x: &Tensor, absmax: &Tensor) -> Result<Tensor> {
    x.apply_op2_no_bwd(absmax, &Nf4Pack)
}

/// Double quantization of the absmax values around `offset` (their mean): the absmax of each
/// block of 256 (`absmax2`), then the 8-bit codes.
pub fn double_quantize(absmax: &Tensor, offset: f32) -> Result<(Tensor, Tensor)> {
    let absmax2 = absmax.apply_op1_no_bwd(&DqAbsmax2 { offset })?;
    let codes = absmax.apply_op2_no_bwd(&absmax2, &DqCodes { offset })?;
    Ok((codes, absmax2))
}

/// Dequantizes `n` values to `dtype` (flat) with one f32 absmax per block.
pub fn dequantize(packed: &Tensor, absmax: &Tensor, n: usize, dtype: DType) -> Result<Tensor> {
    packed.apply_op2_no_bwd(absmax, &Nf4Dequantize { n, dtype, offset: 0.0 })
}

/// Dequantizes `n` values to `dtype` (flat) with double-quantized absmax values.
pub fn dequantize_double(
    packed: &Tensor,
    codes: &Tensor,
    absmax2: &Tensor,
    offset: f32,
    n: usize,
    dtype: DType,
) -> Result<Tensor> {
    packed.apply_op3_no_bwd(codes, absmax2, &Nf4Dequantize { n, dtype, offset })
}

fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    if !l.is_contiguous() {
        bail!("NF4 kernels need contiguous inputs");
    }
    Ok(s.as_cuda_slice::<T>()?.slice(l.start_offset()..))
}

fn grid(threads: usize) -> LaunchConfig {
    let blocks = threads.div_ceil(THREADS as usize).max(1) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

fn cpu_unsupported(name: &str) -> Result<(CpuStorage, Shape)> {
    bail!("{name} is a CUDA kernel; on the CPU quant::nf4 is used")
}

fn wrap<T: CudaDType>(slice: CudaSlice<T>, like: &CudaStorage, len: usize) -> (CudaStorage, Shape) {
    (CudaStorage::wrap_cuda_slice(slice, like.device().clone()), Shape::from(len))
}

/// Per-64-block max |x| (f32).
struct Nf4Absmax;

fn absmax_typed<T: CudaDType + DeviceRepr + WithDType>(
    x: &CudaStorage,
    l: &Layout,
) -> Result<CudaSlice<f32>> {
    let (dev, n) = (x.device(), l.shape().elem_count());
    let src = view::<T>(x, l)?;
    let out = unsafe { dev.alloc::<f32>(n.div_ceil(64))? };
    let func = KERNELS.function(dev, &format!("nf4_absmax_{}", suffix(T::DTYPE)?))?;
    let n = n as i64;
    let mut b = func.builder();
    b.arg(&src).arg(&out).arg(&n);
    unsafe { b.launch(grid((n as usize).div_ceil(2))) }.w()?;
    Ok(out)
}

impl CustomOp1 for Nf4Absmax {
    fn name(&self) -> &'static str {
        "nf4-absmax"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }
    fn cuda_fwd(&self, x: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let out = match x.dtype() {
            DType::F32 => absmax_typed::<f32>(x, l)?,
            DType::F16 => absmax_typed::<f16>(x, l)?,
            DType::BF16 => absmax_typed::<bf16>(x, l)?,
            dt => bail!("NF4 quantizes f32, f16 or bf16, not {dt:?}"),
        };
        let len = out.len();
        Ok(wrap(out, x, len))
    }
}

/// Two 4-bit codes per byte, given the absmax.
struct Nf4Pack;

fn pack_typed<T: CudaDType + DeviceRepr + WithDType>(
    x: &CudaStorage,
    l: &Layout,
    absmax: &CudaStorage,
    la: &Layout,
) -> Result<CudaSlice<u8>> {
    let (dev, n) = (x.device(), l.shape().elem_count());
    let (src, amax) = (view::<T>(x, l)?, view::<f32>(absmax, la)?);
    let out = unsafe { dev.alloc::<u8>(n.div_ceil(2))? };
    let func = KERNELS.function(dev, &format!("nf4_pack_{}", suffix(T::DTYPE)?))?;
    let n = n as i64;
    let mut b = func.builder();
    b.arg(&src).arg(&amax).arg(&out).arg(&n);
    unsafe { b.launch(grid((n as usize).div_ceil(2))) }.w()?;
    Ok(out)
}

impl CustomOp2 for Nf4Pack {
    fn name(&self) -> &'static str {
        "nf4-pack"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        l: &Layout,
        absmax: &CudaStorage,
        la: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let out = match x.dtype() {
            DType::F32 => pack_typed::<f32>(x, l, absmax, la)?,
            DType::F16 => pack_typed::<f16>(x, l, absmax, la)?,
            DType::BF16 => pack_typed::<bf16>(x, l, absmax, la)?,
            dt => bail!("NF4 quantizes f32, f16 or bf16, not {dt:?}"),
        };
        let len = out.len();
        Ok(wrap(out, x, len))
    }
}

/// Double quantization, step 1: max |absmax - offset| per 256 values.
struct DqAbsmax2 {
    offset: f32,
}

impl CustomOp1 for DqAbsmax2 {
    fn name(&self) -> &'static str {
        "nf4-dq-absmax2"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }
    fn cuda_fwd(&self, absmax: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let (dev, n) = (absmax.device(), l.shape().elem_count());
        let src = view::<f32>(absmax, l)?;
        let blocks = n.div_ceil(256);
        let out = unsafe { dev.alloc::<f32>(blocks)? };
        let func = KERNELS.function(dev, "dq_absmax2")?;
        let n = n as i64;
        let mut b = func.builder();
        b.arg(&src).arg(&self.offset).arg(&out).arg(&n);
        let cfg =
            LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        unsafe { b.launch(cfg) }.w()?;
        Ok(wrap(out, absmax, blocks))
    }
}

/// Double quantization, step 2: the 8-bit dynamic-map code of each absmax value.
struct DqCodes {
    offset: f32,
}

impl CustomOp2 for DqCodes {
    fn name(&self) -> &'static str {
        "nf4-dq-codes"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(self.name())
    }
    fn cuda_fwd(
        &self,
        absmax: &CudaStorage,
        l: &Layout,
        absmax2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (dev, n) = (absmax.device(), l.shape().elem_count());
        let (src, scale) = (view::<f32>(absmax, l)?, view::<f32>(absmax2, l2)?);
        let out = unsafe { dev.alloc::<u8>(n)? };
        let func = KERNELS.function(dev, "dq_codes")?;
        let n_i = n as i64;
        let mut b = func.builder();
        b.arg(&src).arg(&self.offset).arg(&scale).arg(&out).arg(&n_i);
        unsafe { b.launch(grid(n)) }.w()?;
        Ok(wrap(out, absmax, n))
    }
}

/// Packed codes → values in `dtype`; absmax either f32 (op2) or double-quantized (op3).
struct Nf4Dequantize {
    n: usize,
    dtype: DType,
    offset: f32,
}

/// Device pointers of the absmax parts; 0 stands for the null pointer of the unused form.
struct AbsmaxArgs<'a> {
    absmax: Option<CudaView<'a, f32>>,
    codes: Option<CudaView<'a, u8>>,
    absmax2: Option<CudaView<'a, f32>>,
}

impl Nf4Dequantize {
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        packed: &CudaStorage,
        lp: &Layout,
        a: AbsmaxArgs,
    ) -> Result<CudaSlice<T>> {
        let dev = packed.device();
        let src = view::<u8>(packed, lp)?;
        let out = unsafe { dev.alloc::<T>(self.n)? };
        let func = KERNELS.function(dev, &format!("nf4_dequantize_{}", suffix(T::DTYPE)?))?;
        let (null, n) = (0u64, self.n as i64);
        let mut b = func.builder();
        b.arg(&src);
        match &a.absmax {
            Some(v) => b.arg(v),
            None => b.arg(&null),
        };
        match (&a.codes, &a.absmax2) {
            (Some(c), Some(s)) => b.arg(c).arg(s),
            _ => b.arg(&null).arg(&null),
        };
        b.arg(&self.offset).arg(&out).arg(&n);
        // sixteen values per thread (nf4_dequantize in cuda/nf4.cu)
        unsafe { b.launch(grid(self.n.div_ceil(16))) }.w()?;
        Ok(out)
    }

    fn dispatch(&self, packed: &CudaStorage, lp: &Layout, a: AbsmaxArgs) -> Result<(CudaStorage, Shape)> {
        let storage = match self.dtype {
            DType::F32 => {
                CudaStorage::wrap_cuda_slice(self.run::<f32>(packed, lp, a)?, packed.device().clone())
            }
            DType::F16 => {
                CudaStorage::wrap_cuda_slice(self.run::<f16>(packed, lp, a)?, packed.device().clone())
            }
            DType::BF16 => {
                CudaStorage::wrap_cuda_slice(self.run::<bf16>(packed, lp, a)?, packed.device().clone())
            }
            dt => bail!("NF4 dequantizes to f32, f16 or bf16, not {dt:?}"),
        };
        Ok((storage, Shape::from(self.n)))
    }
}

impl CustomOp2 for Nf4Dequantize {
    fn name(&self) -> &'static str {
        "nf4-dequantize"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(CustomOp2::name(self))
    }
    fn cuda_fwd(
        &self,
        packed: &CudaStorage,
        lp: &Layout,
        absmax: &CudaStorage,
        la: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let args = AbsmaxArgs { absmax: Some(view::<f32>(absmax, la)?), codes: None, absmax2: None };
        self.dispatch(packed, lp, args)
    }
}

impl CustomOp3 for Nf4Dequantize {
    fn name(&self) -> &'static str {
        "nf4-dequantize-double"
    }
    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_unsupported(CustomOp3::name(self))
    }
    fn cuda_fwd(
        &self,
        packed: &CudaStorage,
        lp: &Layout,
        codes: &CudaStorage,
        lc: &Layout,
        absmax2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let args = AbsmaxArgs {
            absmax: None,
            codes: Some(view::<u8>(codes, lc)?),
            absmax2: Some(view::<f32>(absmax2, l2)?),
        };
        self.dispatch(packed, lp, args)
    }
}
