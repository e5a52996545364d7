//! The fused RMSNorm and SwiGLU kernels of `src/cuda/elementwise.cu` (CUDA only).
//! `model/ops/norm.rs` and `model/ops/mlp.rs` call them for CUDA tensors and keep the composed ops
//! as the CPU path and the tests' reference.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, Result, Tensor, WithDType};

use crate::cuda::{blocks, by_dtype, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("elementwise");
const THREADS: u32 = 256;

fn rows_cols(x: &Tensor) -> Result<(usize, usize)> {
    let cols = x.dims().last().copied().unwrap_or(1).max(1);
    Ok((x.elem_count() / cols, cols))
}

/// Rows up to this long take the `_short` kernels (a group of lanes per row, many rows per
/// block); longer ones a block per row.
const SHORT_ROW: usize = 1024;

/// Lanes per row of the `_short` kernels: enough for one 16-byte load each across the row, a
/// power of two, at most a warp.
fn lanes_per_row(cols: usize, dtype_bytes: usize) -> usize {
    cols.div_ceil(16 / dtype_bytes).next_power_of_two().clamp(1, 32)
}

/// The launch of a row kernel over `rows` × `cols`: (name suffix, launch, lanes per row).
fn row_launch(rows: usize, cols: usize, dtype_bytes: usize) -> (&'static str, LaunchConfig, i32) {
    if cols > SHORT_ROW {
        return ("", blocks(rows, THREADS), 0);
    }
    let group = lanes_per_row(cols, dtype_bytes);
    let rows_per_block = THREADS as usize / group;
    ("short_", blocks(rows.div_ceil(rows_per_block), THREADS), group as i32)
}

/// y = w ⊙ round(x · rsqrt(mean(x²) + eps)) over the last dim.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    by_dtype!(x.dtype(), rms_norm_typed(x, weight, eps))
}

fn rms_norm_typed<T: CudaDType + WithDType + DeviceRepr>(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let (x, w) = (x.contiguous()?, w.to_dtype(x.dtype())?.contiguous()?);
    let (rows, cols) = rows_cols(&x)?;
    let dev = cuda_device(&x)?;
    let y = unsafe { dev.alloc::<T>(rows * cols)? };
    let (short, launch, group) = row_launch(rows, cols, T::DTYPE.size_in_bytes());
    let func = KERNELS.function(&dev, &format!("rms_norm_{short}{}", suffix(T::DTYPE)?))?;
    {
        let (xs, ws) = (x.storage_and_layout().0, w.storage_and_layout().0);
        let (xv, wv) = (view::<T>(&xs, &x)?, view::<T>(&ws, &w)?);
        let (rows_i, cols_i, eps) = (rows as i64, cols as i32, eps as f32);
        let mut l = func.builder();
        l.arg(&xv).arg(&wv).arg(&y);
        if group > 0 {
            l.arg(&rows_i).arg(&cols_i).arg(&group);
        } else {
            l.arg(&cols_i);
        }
        l.arg(&eps);
        unsafe { l.launch(launch) }.w()?;
    }
    Ok(wrap(y, &dev, x.dims()))
}

/// d(x) of `rms_norm` given d(y); the normaliser is recomputed from x. With `residual`, that
/// plus d(x), in the same pass (rounded as `residual + d(x)` would be).
pub fn rms_norm_backward(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    dy: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    by_dtype!(x.dtype(), rms_norm_backward_typed(x, weight, eps, dy, residual))
}

fn rms_norm_backward_typed<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    w: &Tensor,
    eps: f64,
    dy: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    let (x, w, dy) = (x.contiguous()?, w.to_dtype(x.dtype())?.contiguous()?, dy.contiguous()?);
    if x.dims() != dy.dims() {
        bail!("rms_norm_backward: x {:?} and dy {:?} differ", x.dims(), dy.dims());
    }
    let residual = residual.map(|r| r.contiguous()).transpose()?;
    if let Some(r) = &residual {
        if r.dims() != x.dims() || r.dtype() != x.dtype() {
            bail!(
                "rms_norm_backward: residual {:?} {:?} for x {:?} {:?}",
                r.dims(),
                r.dtype(),
                x.dims(),
                x.dtype()
            );
        }
    }
    let (rows, cols) = rows_cols(&x)?;
    let dev = cuda_device(&x)?;
    let dx = unsafe { dev.alloc::<T>(rows * cols)? };
    let (short, launch, group) = row_launch(rows, cols, T::DTYPE.size_in_bytes());
    let name = format!("rms_norm_backward_{short}{}", suffix(T::DTYPE)?);
    let func = KERNELS.function(&dev, &name)?;
    {
        let g = [&x, &w, &dy].map(|t| t.storage_and_layout().0);
        let (xv, wv, dyv) = (view::<T>(&g[0], &x)?, view::<T>(&g[1], &w)?, view::<T>(&g[2], &dy)?);
        let rs = residual.as_ref().map(|r| r.storage_and_layout().0);
        let rv = match (&rs, &residual) {
            (Some(s), Some(r)) => Some(view::<T>(s, r)?),
            _ => None,
        };
        let (rows_i, cols_i, eps) = (rows as i64, cols as i32, eps as f32);
        let null = 0u64;
        let mut l = func.builder();
        l.arg(&xv).arg(&wv).arg(&dyv);
        match &rv {
            Some(rv) => l.arg(rv),
            None => l.arg(&null),
        };
        l.arg(&dx);
        if group > 0 {
            l.arg(&rows_i).arg(&cols_i).arg(&group);
        } else {
            l.arg(&cols_i);
        }
        l.arg(&eps);
        unsafe { l.launch(launch) }.w()?;
    }
    Ok(wrap(dx, &dev, x.dims()))
}

/// Enough blocks to fill the GPU; the kernels stride over the rest.
fn elementwise_blocks(n: usize) -> usize {
    n.div_ceil(THREADS as usize).clamp(1, 65_535)
}

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// silu (SwiGLU).
    Silu,
    /// gelu, tanh approximation (GeGLU).
    GeluTanh,
}

/// a = act(g) ⊙ u.
pub fn gated(gate: &Tensor, up: &Tensor, act: Gate) -> Result<Tensor> {
    by_dtype!(gate.dtype(), gated_typed(gate, up, act))
}

fn gated_typed<T: CudaDType + WithDType + DeviceRepr>(
    gate: &Tensor,
    up: &Tensor,
    act: Gate,
) -> Result<Tensor> {
    let (gate, up) = (gate.contiguous()?, up.contiguous()?);
    if gate.dims() != up.dims() {
        bail!("gated: gate {:?} and up {:?} differ", gate.dims(), up.dims());
    }
    let n = gate.elem_count();
    let dev = cuda_device(&gate)?;
    let a = unsafe { dev.alloc::<T>(n)? };
    let func = KERNELS.function(&dev, &format!("gated_{}", suffix(T::DTYPE)?))?;
    {
        let g = [&gate, &up].map(|t| t.storage_and_layout().0);
        let (gv, uv) = (view::<T>(&g[0], &gate)?, view::<T>(&g[1], &up)?);
        let n_i = n as i64;
        let mut l = func.builder();
        let gelu = i32::from(act == Gate::GeluTanh);
        l.arg(&gv).arg(&uv).arg(&a).arg(&n_i).arg(&gelu);
        unsafe { l.launch(blocks(elementwise_blocks(n), THREADS)) }.w()?;
    }
    Ok(wrap(a, &dev, gate.dims()))
}

/// (d_gate, d_up) of `gated` given d(a), from one kernel pass.
pub fn gated_backward(gate: &Tensor, up: &Tensor, da: &Tensor, act: Gate) -> Result<(Tensor, Tensor)> {
    by_dtype!(gate.dtype(), gated_backward_typed(gate, up, da, act, false))
}

/// (d_gate, d_up, a) from one kernel pass: `gated_backward`'s gradients, and `gated`'s a, its
/// bits, written over `da`, which the caller gives up: it must be the only tensor on a
/// contiguous buffer of its own (`model::ops::mlp::gated_backward_with_act` says where it is).
pub fn gated_backward_act(
    gate: &Tensor,
    up: &Tensor,
    da: Tensor,
    act: Gate,
) -> Result<(Tensor, Tensor, Tensor)> {
    if !da.is_contiguous() || da.layout().start_offset() != 0 {
        bail!("gated_backward_act: d(a) must be a contiguous buffer of its own");
    }
    let (d_gate, d_up) = by_dtype!(gate.dtype(), gated_backward_typed(gate, up, &da, act, true))?;
    Ok((d_gate, d_up, da))
}

fn gated_backward_typed<T: CudaDType + WithDType + DeviceRepr>(
    gate: &Tensor,
    up: &Tensor,
    da: &Tensor,
    act: Gate,
    write_act: bool,
) -> Result<(Tensor, Tensor)> {
    let (gate, up, da) = (gate.contiguous()?, up.contiguous()?, da.contiguous()?);
    if gate.dims() != up.dims() || gate.dims() != da.dims() {
        bail!("gated_backward: gate {:?}, up {:?} and da {:?} differ", gate.dims(), up.dims(), da.dims());
    }
    let n = gate.elem_count();
    let dev = cuda_device(&gate)?;
    let d_gate_up = unsafe { dev.alloc::<T>(2 * n)? };
    let name = if write_act { "gated_backward_act" } else { "gated_backward" };
    let func = KERNELS.function(&dev, &format!("{name}_{}", suffix(T::DTYPE)?))?;
    {
        let g = [&gate, &up, &da].map(|t| t.storage_and_layout().0);
        let (gv, uv, dav) = (view::<T>(&g[0], &gate)?, view::<T>(&g[1], &up)?, view::<T>(&g[2], &da)?);
        let n_i = n as i64;
        let mut l = func.builder();
        let gelu = i32::from(act == Gate::GeluTanh);
        l.arg(&gv).arg(&uv).arg(&dav).arg(&d_gate_up).arg(&n_i).arg(&gelu);
        unsafe { l.launch(blocks(elementwise_blocks(n), THREADS)) }.w()?;
    }
    let mut shape = vec![2];
    shape.extend_from_slice(gate.dims());
    let both = wrap(d_gate_up, &dev, &shape);
    Ok((both.get(0)?, both.get(1)?))
}
