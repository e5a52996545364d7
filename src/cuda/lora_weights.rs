//! The one-launch cast of `lora_weights.cu`: f32 tensors, each times its scale, into new tensors
//! of the compute dtype, every part of an output one after the other along dim 0 (so the q, k
//! and v adapters' A become one `[Σr, in]` tensor). `model::lora::adapter` calls it for CUDA and
//! keeps the composed casts as the CPU path and the tests' reference.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, DType, Result, Tensor, WithDType};

use super::{address, blocks, by_dtype, cuda_device, suffix, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("lora_weights");
const THREADS: u32 = 256;
const MAX_SEGMENTS: usize = 8;

/// `struct Segments` of the kernel.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Segments {
    src: [u64; MAX_SEGMENTS],
    dst: [u64; MAX_SEGMENTS],
    start: [i64; MAX_SEGMENTS + 1],
    scale: [f32; MAX_SEGMENTS],
    count: i32,
}

// SAFETY: integers and floats only, laid out as the kernel's struct (no pointers it would own).
unsafe impl DeviceRepr for Segments {}

/// Whether the kernel reads `t`: a contiguous 2-D f32 CUDA tensor.
pub fn fits(t: &Tensor) -> bool {
    t.device().is_cuda() && t.dtype() == DType::F32 && t.is_contiguous() && t.rank() == 2
}

/// For each output, its parts `(tensor, scale)` (2-D f32, one width per output) stacked along
/// dim 0, each value times its part's scale, in `dtype`.
pub fn scaled_casts(outputs: &[Vec<(&Tensor, f64)>], dtype: DType) -> Result<Vec<Tensor>> {
    by_dtype!(dtype, scaled_casts_typed(outputs))
}

fn scaled_casts_typed<T: CudaDType + WithDType + DeviceRepr>(
    outputs: &[Vec<(&Tensor, f64)>],
) -> Result<Vec<Tensor>> {
    let Some(first) = outputs.iter().flatten().next() else { return Ok(Vec::new()) };
    let dev = cuda_device(first.0)?;
    let stream = dev.cuda_stream();
    let mut tensors = Vec::with_capacity(outputs.len());
    let mut segments: Vec<(u64, u64, usize, f32)> = Vec::new();
    for parts in outputs {
        let Some((head, _)) = parts.first() else { bail!("a cast output without parts") };
        let width = head.dim(1)?;
        let rows: usize = parts.iter().map(|(t, _)| t.dim(0).unwrap_or(0)).sum();
        let out = wrap(unsafe { dev.alloc::<T>(rows * width)? }, &dev, &[rows, width]);
        let base = address(&out, &stream)?;
        let mut offset = 0u64;
        for &(t, scale) in parts {
            if !fits(t) || t.dim(1)? != width {
                bail!("the LoRA weight cast takes contiguous 2-D f32 CUDA tensors {width} wide, not {t:?}");
            }
            let n = t.elem_count();
            segments.push((address(t, &stream)?, base + offset, n, scale as f32));
            offset += (n * T::DTYPE.size_in_bytes()) as u64;
        }
        tensors.push(out);
    }
    let func = KERNELS.function(&dev, &format!("scaled_cast_{}", suffix(T::DTYPE)?))?;
    for chunk in segments.chunks(MAX_SEGMENTS) {
        let mut s = Segments { count: chunk.len() as i32, ..Default::default() };
        for (i, &(src, dst, n, scale)) in chunk.iter().enumerate() {
            (s.src[i], s.dst[i], s.scale[i]) = (src, dst, scale);
            s.start[i + 1] = s.start[i] + n as i64;
        }
        let total = s.start[chunk.len()] as usize;
        let mut launch = func.builder();
        launch.arg(&s);
        unsafe { launch.launch(blocks(total.div_ceil(THREADS as usize).clamp(1, 1024), THREADS)) }.w()?;
    }
    Ok(tensors)
}
