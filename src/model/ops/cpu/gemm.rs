//! Matrix products on strided f32 views through the gemm crate (candle's own CPU matmul), with
//! the destination accumulated in place: a transpose, a column slice or the heads of a
//! `[tokens, heads · d]` projection are read where they lie instead of copied first, and a sum
//! of products needs no temporary per product.

use candle_core::{bail, Result, Tensor};

use super::Read;

/// An f32 matrix inside a buffer: element (i, j) at `offset + i·rs + j·cs`.
#[derive(Clone, Copy, Debug)]
pub struct View {
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl View {
    /// A row-major `[rows, cols]` block whose rows are `rs` apart.
    pub fn rows(offset: usize, rows: usize, cols: usize, rs: usize) -> Self {
        Self { offset, rows, cols, rs, cs: 1 }
    }

    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    /// The 2-D tensor's view of its buffer (`Read::buffer`).
    pub fn of(read: &Read) -> Result<Self> {
        let layout = read.layout();
        let (dims, stride) = (layout.dims(), layout.stride());
        if dims.len() != 2 {
            bail!("a matrix view of a {}-D tensor", dims.len());
        }
        Ok(Self { offset: layout.start_offset(), rows: dims[0], cols: dims[1], rs: stride[0], cs: stride[1] })
    }

    /// One past the largest element index it reads (its offset where empty).
    fn end(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            return self.offset;
        }
        self.offset + (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1
    }
}

/// Whether a product runs on the rayon pool's threads or on the calling thread alone (inside a
/// loop that is already spread over the pool).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Threads {
    Pool,
    One,
}

impl Threads {
    fn parallelism(self) -> gemm::Parallelism {
        match (self, rayon::current_num_threads()) {
            (Threads::Pool, n) if n > 1 && rayon::current_thread_index().is_none() => {
                gemm::Parallelism::Rayon(n)
            }
            _ => gemm::Parallelism::None,
        }
    }
}

/// dst = scale · a · b, or dst += scale · a · b with `accumulate`, over f32 views: `a`, `b` in
/// `src_a`, `src_b`; `dst` in `out`. Bounds are checked; a destination that overlaps a source is
/// the caller's error (they are different buffers wherever this is called).
#[allow(clippy::too_many_arguments)]
pub fn product(
    out: &mut [f32],
    dst: View,
    (src_a, a): (&[f32], View),
    (src_b, b): (&[f32], View),
    scale: f32,
    accumulate: bool,
    threads: Threads,
) -> Result<()> {
    check(out.len(), dst, src_a.len(), a, src_b.len(), b)?;
    if a.rows <= DOT_ROWS && a.cs == 1 && b.rs == 1 && dst.cs == 1 && threads == Threads::Pool {
        dot_products(out, dst, (src_a, a), (src_b, b), scale, accumulate);
        return Ok(());
    }
    // SAFETY: every view is inside its buffer (checked), and `out` is borrowed mutably.
    unsafe {
        product_raw(
            out.as_mut_ptr(),
            dst,
            (src_a.as_ptr(), a),
            (src_b.as_ptr(), b),
            scale,
            accumulate,
            threads,
        )
    }
    Ok(())
}

/// Rows of `a` up to which a product whose columns of `b` lie contiguous (a weight stored
/// `[out, in]`, read transposed) runs as dot products instead: generation's products of one
/// token a reply, bound by reading the weight, which threads split by output columns and which
/// the rows share (gemm packs such a weight anew for every call).
const DOT_ROWS: usize = 16;

/// Output columns per thread task of `dot_products`.
const DOT_COLUMNS: usize = 64;

/// `product` as dot products of a's rows with b's contiguous columns (checked by the caller),
/// four rows at a time against each column.
fn dot_products(
    out: &mut [f32],
    dst: View,
    (src_a, a): (&[f32], View),
    (src_b, b): (&[f32], View),
    scale: f32,
    accumulate: bool,
) {
    use super::vector::{dot, dot4};
    use rayon::prelude::*;
    let k = a.cols;
    let rows: Vec<&[f32]> = (0..a.rows).map(|i| &src_a[a.offset + i * a.rs..][..k]).collect();
    let out = super::SharedMut::new(out);
    (0..dst.cols.div_ceil(DOT_COLUMNS)).into_par_iter().for_each(|task| {
        let columns = task * DOT_COLUMNS..((task + 1) * DOT_COLUMNS).min(dst.cols);
        let store = |i: usize, j: usize, value: f32| {
            // SAFETY: (i, j) is inside dst (checked), and column j belongs to this task alone
            let y = unsafe { &mut *out.at(dst.offset + i * dst.rs + j) };
            *y = if accumulate { *y + scale * value } else { scale * value };
        };
        for j in columns {
            let column = &src_b[b.offset + j * b.cs..][..k];
            let mut quads = rows.chunks_exact(4);
            for (q, four) in (&mut quads).enumerate() {
                let values = dot4(four[0], four[1], four[2], four[3], column);
                for (r, value) in values.into_iter().enumerate() {
                    store(q * 4 + r, j, value);
                }
            }
            let first = rows.len() - quads.remainder().len();
            for (r, row) in quads.remainder().iter().enumerate() {
                store(first + r, j, dot(row, column));
            }
        }
    });
}

/// The dimension and bounds checks of `product`.
pub fn check(out_len: usize, dst: View, a_len: usize, a: View, b_len: usize, b: View) -> Result<()> {
    if (a.rows, b.cols, a.cols) != (dst.rows, dst.cols, b.rows) {
        bail!(
            "product of [{}, {}] and [{}, {}] into [{}, {}]",
            a.rows,
            a.cols,
            b.rows,
            b.cols,
            dst.rows,
            dst.cols
        );
    }
    if dst.end() > out_len || a.end() > a_len || b.end() > b_len {
        bail!("a product's view runs past its buffer");
    }
    Ok(())
}

/// `product` on raw pointers, for the loops that write disjoint parts of one buffer from
/// several threads.
///
/// # Safety
/// Each view lies inside the buffer its pointer points into, and nothing else writes the
/// destination's elements, or reads them, while the product runs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn product_raw(
    out: *mut f32,
    dst: View,
    (a_ptr, a): (*const f32, View),
    (b_ptr, b): (*const f32, View),
    scale: f32,
    accumulate: bool,
    threads: Threads,
) {
    if dst.rows == 0 || dst.cols == 0 {
        return;
    }
    if a.cols == 0 {
        if !accumulate {
            for i in 0..dst.rows {
                for j in 0..dst.cols {
                    *out.add(dst.offset + i * dst.rs + j * dst.cs) = 0.0;
                }
            }
        }
        return;
    }
    // gemm: dst = alpha · dst + beta · a · b, dst read only where `read_dst`
    gemm::gemm(
        dst.rows,
        dst.cols,
        a.cols,
        out.add(dst.offset),
        dst.cs as isize,
        dst.rs as isize,
        accumulate,
        a_ptr.add(a.offset),
        a.cs as isize,
        a.rs as isize,
        b_ptr.add(b.offset),
        b.cs as isize,
        b.rs as isize,
        1.0f32,
        scale,
        false,
        false,
        false,
        threads.parallelism(),
    );
}

/// `[m, n]` = scale · op(a) · op(b) of two 2-D f32 CPU tensors, as a new tensor (op: transposed
/// where asked), reading both in place.
pub fn matmul(a: &Tensor, a_t: bool, b: &Tensor, b_t: bool, scale: f32) -> Result<Tensor> {
    let (ra, rb) = (Read::new(a)?, Read::new(b)?);
    let (va, vb) = (View::of(&ra)?, View::of(&rb)?);
    let (va, vb) = (if a_t { va.t() } else { va }, if b_t { vb.t() } else { vb });
    let mut out = vec![0f32; va.rows * vb.cols];
    let dst = View::rows(0, va.rows, vb.cols, vb.cols);
    product(&mut out, dst, (ra.buffer(), va), (rb.buffer(), vb), scale, false, Threads::Pool)?;
    super::tensor(out, (va.rows, vb.cols))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::test_util::randn;

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// Transposed, column-sliced and accumulated products equal candle's matmul of the same
    /// operands made contiguous, to rounding.
    #[test]
    fn strided_products_equal_candles_matmul() -> Result<()> {
        let a = randn(&[13, 40], 1);
        let b = randn(&[40, 7], 2);
        let wide = randn(&[13, 90], 3); // a column slice 40 wide at column 25
        let slice = wide.narrow(1, 25, 40)?;
        for (lhs, lhs_t) in [(a.clone(), false), (a.t()?.contiguous()?, true), (slice.clone(), false)] {
            let got = matmul(&lhs, lhs_t, &b, false, 0.5)?;
            let op = if lhs_t { lhs.t()? } else { lhs.clone() };
            let want = (op.contiguous()?.matmul(&b)? * 0.5)?;
            let err = crate::testing::rel_err(&got, &want);
            assert!(err < 1e-6, "{err}");
        }
        // accumulated: dst += a · bᵀ over a dst that holds values
        let bt = b.t()?.contiguous()?;
        let (ra, rb) = (Read::new(&a)?, Read::new(&bt)?);
        let mut out = values(&randn(&[13, 7], 4));
        let start = out.clone();
        let (va, vb) = (View::of(&ra)?, View::of(&rb)?.t());
        product(
            &mut out,
            View::rows(0, 13, 7, 7),
            (ra.buffer(), va),
            (rb.buffer(), vb),
            1.0,
            true,
            Threads::One,
        )?;
        let want = (Tensor::from_vec(start, (13, 7), &candle_core::Device::Cpu)? + a.matmul(&b)?)?;
        let err = crate::testing::rel_err(&Tensor::from_vec(out, (13, 7), &candle_core::Device::Cpu)?, &want);
        assert!(err < 1e-6, "{err}");
        Ok(())
    }

    /// Few rows against a weight read transposed take the dot products: against candle's matmul
    /// in f32 (the reference) and f64 (exact), set and accumulated, 1 to 16 rows (whole fours and
    /// the rest), a width that is not a multiple of the lanes.
    #[test]
    fn dot_products_of_few_rows_match_the_matmul() -> Result<()> {
        let w = randn(&[150, 37], 5); // [out, in]
        for rows in [1, 2, 3, 4, 5, 8, 13, 16] {
            let x = randn(&[rows, 37], 6 + rows as u64);
            let got = matmul(&x, false, &w, true, 0.5)?;
            let f64 = |t: &Tensor| t.to_dtype(candle_core::DType::F64).unwrap();
            let want = (x.matmul(&w.t()?)? * 0.5)?;
            let exact = (f64(&x).matmul(&f64(&w).t()?)? * 0.5)?;
            crate::testing::assert_within_reference_error(&format!("{rows} rows"), &got, &want, &exact);
            let (rx, rw) = (Read::new(&x)?, Read::new(&w)?);
            let mut out = values(&got);
            let dst = View::rows(0, rows, 150, 150);
            product(
                &mut out,
                dst,
                (rx.buffer(), View::of(&rx)?),
                (rw.buffer(), View::of(&rw)?.t()),
                0.5,
                true,
                Threads::Pool,
            )?;
            let twice = Tensor::from_vec(out, (rows, 150), &candle_core::Device::Cpu)?;
            crate::testing::assert_within_reference_error(
                "accumulated",
                &twice,
                &(&want * 2.0)?,
                &(exact * 2.0)?,
            );
        }
        Ok(())
    }

    #[test]
    fn a_view_past_its_buffer_is_an_error() {
        let mut out = vec![0f32; 4];
        let a = vec![0f32; 4];
        let v = View::rows(0, 2, 2, 2);
        assert!(
            product(&mut out, v, (&a, v), (&a, View::rows(1, 2, 2, 2)), 1.0, false, Threads::One).is_err()
        );
        assert!(product(&mut out, v, (&a, v), (&a, v), 1.0, false, Threads::One).is_ok());
    }
}
