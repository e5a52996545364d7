//! The attention softmax kernels of `src/cuda/softmax.cu` as candle custom ops (CUDA only; the
//! CPU path and the tests' reference are the composed ops in `attention.rs`).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{
    bail, CpuStorage, CudaStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, WithDType,
};
use half::{bf16, f16};

use super::suffix;

pub static KERNELS: super::module::Kernels = super::module::kernels!("softmax");

/// Softmax over the last dim of chunk scores `[b, h, len, kv]` with the causal (and window)
/// mask of queries at positions `q_pos0..q_pos0 + len`.
pub fn causal_softmax(scores: &Tensor, q_pos0: usize, window: Option<usize>) -> Result<Tensor> {
    let len = scores.dim(2)?;
    scores.contiguous()?.apply_op1_no_bwd(&CausalSoftmax { len, q_pos0, window: window.unwrap_or(0) })
}

/// dS = P ⊙ (dP − rowsum(P ⊙ dP)) over the last dim.
pub fn softmax_backward(probs: &Tensor, d_probs: &Tensor) -> Result<Tensor> {
    probs.contiguous()?.apply_op2_no_bwd(&d_probs.contiguous()?, &SoftmaxBackward)
}

fn rows_cols(l: &Layout) -> Result<(usize, usize)> {
    if !l.is_contiguous() {
        bail!("attention softmax needs contiguous scores");
    }
    let cols = l.dims().last().copied().unwrap_or(1);
    Ok((l.shape().elem_count() / cols.max(1), cols))
}

fn row_grid(rows: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

struct CausalSoftmax {
    len: usize,
    q_pos0: usize,
    window: usize,
}

impl CausalSoftmax {
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        &self,
        s: &CudaStorage,
        l: &Layout,
    ) -> Result<CudaSlice<T>> {
        let dev = s.device();
        let (rows, cols) = rows_cols(l)?;
        let src = s.as_cuda_slice::<T>()?.slice(l.start_offset()..);
        let out = unsafe { dev.alloc::<T>(rows * cols)? };
        let func = KERNELS.function(dev, &format!("causal_softmax_{}", suffix(T::DTYPE)?))?;
        let (rows_i, cols_i, len, q_pos0, window) =
            (rows as i64, cols as i32, self.len as i32, self.q_pos0 as i32, self.window as i32);
        let mut b = func.builder();
        b.arg(&src).arg(&out).arg(&rows_i).arg(&cols_i).arg(&len).arg(&q_pos0).arg(&window);
        unsafe { b.launch(row_grid(rows)) }.w()?;
        Ok(out)
    }
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("causal-softmax is a CUDA kernel; the CPU uses the composed ops")
    }
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = s.device().clone();
        let storage = match s.dtype() {
            DType::F32 => CudaStorage::wrap_cuda_slice(self.run::<f32>(s, l)?, dev),
            DType::F16 => CudaStorage::wrap_cuda_slice(self.run::<f16>(s, l)?, dev),
            DType::BF16 => CudaStorage::wrap_cuda_slice(self.run::<bf16>(s, l)?, dev),
            dt => bail!("attention softmax takes f32, f16 or bf16, not {dt:?}"),
        };
        Ok((storage, l.shape().clone()))
    }
}

struct SoftmaxBackward;

impl SoftmaxBackward {
    fn run<T: CudaDType + DeviceRepr + WithDType>(
        p: &CudaStorage,
        lp: &Layout,
        dp: &CudaStorage,
        ldp: &Layout,
    ) -> Result<CudaSlice<T>> {
        let dev = p.device();
        let (rows, cols) = rows_cols(lp)?;
        if rows_cols(ldp)? != (rows, cols) {
            bail!(
                "softmax backward: probabilities {:?} and their gradient {:?} differ",
                lp.dims(),
                ldp.dims()
            );
        }
        let p_view = p.as_cuda_slice::<T>()?.slice(lp.start_offset()..);
        let dp_view = dp.as_cuda_slice::<T>()?.slice(ldp.start_offset()..);
        let out = unsafe { dev.alloc::<T>(rows * cols)? };
        let func = KERNELS.function(dev, &format!("softmax_backward_{}", suffix(T::DTYPE)?))?;
        let (rows_i, cols_i) = (rows as i64, cols as i32);
        let mut b = func.builder();
        b.arg(&p_view).arg(&dp_view).arg(&out).arg(&rows_i).arg(&cols_i);
        unsafe { b.launch(row_grid(rows)) }.w()?;
        Ok(out)
    }
}

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "softmax-backward"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("softmax-backward is a CUDA kernel; the CPU uses the composed ops")
    }
    fn cuda_fwd(
        &self,
        p: &CudaStorage,
        lp: &Layout,
        dp: &CudaStorage,
        ldp: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = p.device().clone();
        let storage = match p.dtype() {
            DType::F32 => CudaStorage::wrap_cuda_slice(Self::run::<f32>(p, lp, dp, ldp)?, dev),
            DType::F16 => CudaStorage::wrap_cuda_slice(Self::run::<f16>(p, lp, dp, ldp)?, dev),
            DType::BF16 => CudaStorage::wrap_cuda_slice(Self::run::<bf16>(p, lp, dp, ldp)?, dev),
            dt => bail!("attention softmax takes f32, f16 or bf16, not {dt:?}"),
        };
        Ok((storage, lp.shape().clone()))
    }
}
