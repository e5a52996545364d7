//! The bottom floor of the CUDA build: every kernel (`*.cu`, the cuDNN shim `cudnn_sdpa.cpp`)
//! beside the thin Rust wrapper that loads and launches it, and the plumbing they share (this
//! file: the device slice behind a tensor, fresh outputs wrapped back into tensors, the
//! kernel-name suffix of a dtype; `dtype.cuh`, `block_reduce.cuh` and `nf4_tables.cuh` for the
//! kernels). Nothing here imports the model, the quantizer or the optimizer: they call down into
//! it.
//!
//! | kernel | wrapper | used by |
//! |---|---|---|
//! | `nf4.cu` | `nf4.rs` | `quant` (quantize, dequantize, NF4 GEMM inputs) |
//! | `nf4_gemv.cu` | `nf4_gemv.rs`, `nf4_lut_gemm.rs`, `nf4_segments.rs`, `lora_down.rs` | `quant`, `model::lora::decode` (x·Wᵀ from the NF4 parts and the LoRA term, ≤ 64 rows) |
//! | `nf4_gemm.cu` | `nf4_gemm.rs` | `quant` (x·Wᵀ from the NF4 parts on tensor cores, ≤ 256 rows) |
//! | `adafactor.cu` | `adafactor.rs` | `optim` (the fused Adafactor step, the global norm) |
//! | `adamw.cu`, `adamw8bit.cu` | `adamw.rs` | `optim` (the fused AdamW and 8-bit AdamW steps) |
//! | `flash_attention.cu` | `flash.rs` | `model::ops::attention` |
//! | `cudnn_sdpa.cpp` | `cudnn_sdpa.rs` | `model::ops::attention` (cuDNN's fused SDPA) |
//! | `softmax.cu` | `softmax.rs` | `model::ops::attention` (the composed path's softmax) |
//! | `elementwise.cu` | `elementwise.rs` | `model::ops::{norm, mlp}` (RMSNorm, SwiGLU) |
//! | `rope.cu` | `rope.rs` | `model::ops::rope` (RoPE on the projections' layout) |
//! | `cross_entropy.cu` | `cross_entropy.rs` | `model::ops::{loss, lm_head}` |
//! | `dropout.cu` | `dropout.rs` | `model::lora::dropout` |
//! | `greedy.cu` | `greedy.rs` | `generate::engine` (greedy's argmax and log-prob per row) |
//! | `embedding.cu` | `mapped.rs` | `model::ops::{embedding, lm_head}` (tables in mapped host memory) |
//! | (all of the above) | `module.rs` | every wrapper: fatbins loaded once per device |
//! | candle-kernels' `.cu` | `candle_modules.rs` | candle's ops: its step modules from machine code |
//! | (cuBLAS) | `gemm.rs` | `model::ops::product_sum` (GEMMs summed into one buffer) |
//! | (launch plumbing) | `programmatic_launch.rs`, `stream_workspace.rs` | the NF4 lookup kernels and `lora_down` (overlapped launches, scratch for blocks' partial sums) |

pub mod adafactor;
pub mod adamw;
pub mod candle_modules;
pub mod cross_entropy;
pub mod cudnn_sdpa;
pub mod decode_attention;
pub mod dropout;
pub mod elementwise;
pub mod flash;
pub mod gemm;
pub mod graph;
pub mod greedy;
pub mod lora_down;
pub mod lora_weights;
pub mod mapped;
pub mod module;
pub mod nf4;
pub mod nf4_gemm;
pub mod nf4_gemv;
pub mod nf4_lut_gemm;
pub mod nf4_segments;
pub mod programmatic_launch;
pub mod rope;
pub mod softmax;
pub mod stream_workspace;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, LaunchConfig};
use candle_core::cuda_backend::CudaDType;
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, DType, Device, Result, Storage, Tensor, WithDType};

/// Turns off cudarc's per-buffer event tracking for the buffers `device` allocates from now on
/// (the training, bench and chat devices; tests keep it). candle opens its device with a stream
/// of its own, which puts cudarc in multi-stream mode: every buffer then gets two CUDA events,
/// and every kernel launch waits on and records them for each argument — about ten driver calls
/// per launch, thousands of launches per step, host time the GPU spends idle between small
/// kernels. This program orders its work itself: every kernel, cuBLAS, cuDNN and NCCL call runs
/// on the device's one compute stream, which orders them; the one other stream, the copy stream
/// of model/activations/offload.rs, is ordered against it by explicit events, and keeps each
/// copy's buffer alive until the compute stream has waited for the copy (`InFlight`).
pub fn order_by_stream(device: &Device) {
    if let Device::Cuda(d) = device {
        // SAFETY: the orderings listed above are the only cross-stream uses of device memory.
        unsafe { d.disable_event_tracking() }
    }
}

/// The CUDA device a tensor lives on.
pub fn cuda_device(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        _ => bail!("this kernel runs on CUDA tensors only"),
    }
}

/// The device memory of `t` from its first element (`storage` is `t.storage_and_layout().0`,
/// held by the caller for as long as the view is used).
pub fn view<'a, T: CudaDType>(storage: &'a Storage, t: &Tensor) -> Result<CudaView<'a, T>> {
    let Storage::Cuda(s) = storage else { bail!("this kernel runs on CUDA tensors only") };
    Ok(s.as_cuda_slice::<T>()?.slice(t.layout().start_offset()..))
}

/// A kernel's freshly written output as a (contiguous, untracked) tensor.
pub fn wrap<T: CudaDType + WithDType>(out: CudaSlice<T>, dev: &CudaDevice, shape: &[usize]) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, dev.clone()));
    Tensor::from_storage(storage, shape, BackpropOp::none(), false)
}

/// Runs `f::<T>(args)` with T the element type of `dtype` (f32, f16 or bf16; others are an error).
macro_rules! by_dtype {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            candle_core::DType::F32 => $f::<f32>($($arg),*),
            candle_core::DType::F16 => $f::<half::f16>($($arg),*),
            candle_core::DType::BF16 => $f::<half::bf16>($($arg),*),
            dt => candle_core::bail!("the CUDA kernels take f32, f16 or bf16, not {dt:?}"),
        }
    };
}
pub(crate) use by_dtype;

/// The device address of `t`'s first element (f32, f16, bf16, u32 or u8), for kernels and copies
/// that take raw pointers; the caller keeps `t` alive until the work that uses it is queued and
/// ordered before any free.
pub fn address(t: &Tensor, stream: &std::sync::Arc<CudaStream>) -> Result<u64> {
    match t.dtype() {
        DType::U32 => address_typed::<u32>(t, stream),
        DType::U8 => address_typed::<u8>(t, stream),
        dtype => by_dtype!(dtype, address_typed(t, stream)),
    }
}

/// The device address and length in elements of the whole buffer `t` views (f32, f16 or
/// bf16), for copies of the buffer whatever the view.
pub fn buffer_span(t: &Tensor, stream: &std::sync::Arc<CudaStream>) -> Result<(u64, usize)> {
    by_dtype!(t.dtype(), buffer_span_typed(t, stream))
}

fn buffer_span_typed<T: CudaDType>(t: &Tensor, stream: &std::sync::Arc<CudaStream>) -> Result<(u64, usize)> {
    let (storage, _) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else { bail!("this copy runs on CUDA tensors only") };
    let slice = s.as_cuda_slice::<T>()?;
    let (ptr, _record) = slice.device_ptr(stream);
    Ok((ptr, slice.len()))
}

fn address_typed<T: CudaDType>(t: &Tensor, stream: &std::sync::Arc<CudaStream>) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else { bail!("this kernel runs on CUDA tensors only") };
    let view = s.as_cuda_slice::<T>()?.slice(layout.start_offset()..);
    let (ptr, _record) = view.device_ptr(stream);
    Ok(ptr)
}

/// The device's multiprocessors, which kernels size their grids by (two blocks each, splits of
/// a row or of `in` to fill them).
pub fn multiprocessors(dev: &CudaDevice) -> Result<usize> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as SM_COUNT;
    use candle_core::cuda_backend::WrapErr;
    Ok(dev.cuda_stream().context().attribute(SM_COUNT).w()?.max(1) as usize)
}

/// The suffix of a kernel instantiated for `dtype`.
pub fn suffix(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        dt => bail!("the CUDA kernels take f32, f16 or bf16, not {dt:?}"),
    })
}

/// `blocks` blocks of `threads` threads, no dynamic shared memory.
pub fn blocks(blocks: usize, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}
