//! RoPE on the projections' `[b, t, heads, d]` layout (`rope.cu`): the rotation candle's
//! `rope_thd` computes, with the same arithmetic, in 16-byte loads; and its backward (the
//! opposite angle) without a negated copy of the sin table.

use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{bail, Result, Tensor, WithDType};

use crate::cuda::{blocks, by_dtype, cuda_device, suffix, view, wrap};

pub static KERNELS: super::module::Kernels = super::module::kernels!("rope");
const THREADS: u32 = 256;

/// x `[b, t, heads, d]` (contiguous) rotated by the tables `cos`, `sin`: `[t, d/2]` (the same
/// positions for every row) or `[b, t, d/2]` (each token its own); by the opposite angle where
/// `inverse` (the backward).
pub fn rope_thd(x: &Tensor, cos: &Tensor, sin: &Tensor, inverse: bool) -> Result<Tensor> {
    by_dtype!(x.dtype(), rope_typed(x, cos, sin, inverse))
}

fn rope_typed<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    inverse: bool,
) -> Result<Tensor> {
    let (b, t, heads, d) = x.dims4()?;
    if !x.is_contiguous() || d % 2 != 0 {
        bail!("rope: x {:?} must be contiguous [b, t, heads, d] with an even d", x.dims());
    }
    let half = d / 2;
    let per_row = match cos.dims() {
        [ct, ch] if *ct == t && *ch == half => false,
        [cb, ct, ch] if *cb == b && *ct == t && *ch == half => true,
        dims => {
            bail!("rope: tables {dims:?} for x {:?} (want [{t}, {half}] or [{b}, {t}, {half}])", x.dims())
        }
    };
    if sin.dims() != cos.dims() || cos.dtype() != x.dtype() || sin.dtype() != x.dtype() {
        bail!(
            "rope: sin {:?} {:?} and cos {:?} {:?} for x {:?}",
            sin.dims(),
            sin.dtype(),
            cos.dims(),
            cos.dtype(),
            x.dtype()
        );
    }
    let (cos, sin) = (cos.contiguous()?, sin.contiguous()?);
    let dev = cuda_device(x)?;
    let n = x.elem_count();
    let y = unsafe { dev.alloc::<T>(n)? };
    let pairs = (n / 2) as i64;
    let vector = 16 / T::DTYPE.size_in_bytes();
    let units = (n / 2).div_ceil(vector).max(1);
    let func = KERNELS.function(&dev, &format!("rope_thd_{}", suffix(T::DTYPE)?))?;
    {
        let g = [x, &cos, &sin].map(|t| t.storage_and_layout().0);
        let (xv, cv, sv) = (view::<T>(&g[0], x)?, view::<T>(&g[1], &cos)?, view::<T>(&g[2], &sin)?);
        let (half, heads, t) = (half as i64, heads as i64, t as i64);
        let (per_row, sign) = (per_row as i32, if inverse { -1i32 } else { 1 });
        let mut l = func.builder();
        l.arg(&xv).arg(&cv).arg(&sv).arg(&y).arg(&pairs).arg(&half).arg(&heads).arg(&t);
        l.arg(&per_row).arg(&sign);
        let grid = units.div_ceil(THREADS as usize).clamp(1, 1 << 20);
        unsafe { l.launch(blocks(grid, THREADS)) }.w()?;
    }
    Ok(wrap(y, &dev, x.dims()))
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use crate::testing::assert_within_reference_error;

    /// The rotation in f64 on the CPU, of x `[b, t, h, d]` by tables `[t, d/2]` or `[b, t, d/2]`
    /// (the exact answer for the values both kernels read).
    fn exact(x: &Tensor, cos: &Tensor, sin: &Tensor, inverse: bool) -> Tensor {
        let f64 = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap();
        let (x, cos, sin) = (f64(x), f64(cos), f64(sin));
        let sin = if inverse { sin.neg().unwrap() } else { sin };
        let (b, t, _, d) = x.dims4().unwrap();
        let table = |c: &Tensor| c.broadcast_as((b, t, d / 2)).unwrap().unsqueeze(2).unwrap();
        let (c, s) = (table(&cos), table(&sin));
        let (x1, x2) = (x.narrow(3, 0, d / 2).unwrap(), x.narrow(3, d / 2, d / 2).unwrap());
        let y1 = (x1.broadcast_mul(&c).unwrap() - x2.broadcast_mul(&s).unwrap()).unwrap();
        let y2 = (x1.broadcast_mul(&s).unwrap() + x2.broadcast_mul(&c).unwrap()).unwrap();
        Tensor::cat(&[y1, y2], 3).unwrap()
    }

    /// The kernel against candle's `rope_thd` (the one it replaces), both against the rotation in
    /// f64: within the crate's multiple of candle's own error (the same arithmetic, in vectors;
    /// nvcc may fuse a product and a sum into one FMA in one kernel and not the other). Both table
    /// layouts, the forward and the backward (candle's on a negated sin table), the 16-byte path
    /// (head_dim 128, 16) and the pair-at-a-time one (head_dim 6), in f32, f16 and bf16.
    #[test]
    fn cuda_rope_matches_candles_kernel() {
        let gpu = Device::new_cuda(0).unwrap();
        for (b, t, heads, d) in [(2, 37, 3, 128), (1, 5, 4, 16), (3, 7, 2, 6)] {
            let x = Tensor::randn(0f32, 1.0, (b, t, heads, d), &Device::Cpu).unwrap();
            let angles = Tensor::randn(0f32, 3.0, (b, t, d / 2), &Device::Cpu).unwrap();
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
                let (x, cos, sin) = (on(&x), on(&angles.cos().unwrap()), on(&angles.sin().unwrap()));
                for per_row in [false, true] {
                    let (cos, sin) = match per_row {
                        true => (cos.clone(), sin.clone()),
                        false => (cos.get(0).unwrap(), sin.get(0).unwrap()),
                    };
                    for inverse in [false, true] {
                        let got = super::rope_thd(&x, &cos, &sin, inverse).unwrap();
                        let candle_sin = if inverse { sin.neg().unwrap() } else { sin.clone() };
                        let want = candle_nn::rotary_emb::rope_thd(&x, &cos, &candle_sin).unwrap();
                        let case =
                            format!("rope {:?} {dtype:?} per_row {per_row} inverse {inverse}", x.dims());
                        assert_within_reference_error(&case, &got, &want, &exact(&x, &cos, &sin, inverse));
                    }
                }
            }
        }
    }
}
