//! A sum of matrix products, accumulated in one buffer. A LoRA projection's output is
//! x·Wᵀ + h·Bᵀ, and a layer's input gradient sums such products over the projections that read
//! the same input (q, k, v; gate, up). On CUDA each product is accumulated onto the buffer by
//! cuBLAS (beta = 1), so there is no `[n, out]` temporary per product and no separate add pass;
//! on the CPU in f32 likewise by the gemm crate (cpu/gemm.rs), operands read where they lie; in
//! other dtypes (and as the tests' reference) each product is a matmul and the sum an add.

use candle_core::{bail, Result, Tensor};
use rayon::prelude::*;

use super::cpu::{
    self,
    gemm::{self, Threads, View},
};

/// alpha · op(lhs) · op(rhs), row-major: op(lhs) is `[m, k]`, stored as it is or, when
/// `lhs_transposed`, as `[k, m]` (an output gradient read for a weight's gradient); op(rhs) is
/// `[k, n]`, stored as it is or, when `rhs_transposed`, as `[n, k]` (a weight stored
/// `[out, in]`). On CUDA an operand may be a column slice of a wider tensor (rows one stride
/// apart, unit column stride): cuBLAS reads it in place.
pub struct Product<'a> {
    pub lhs: &'a Tensor,
    pub rhs: &'a Tensor,
    pub lhs_transposed: bool,
    pub rhs_transposed: bool,
    pub alpha: f64,
}

impl<'a> Product<'a> {
    /// lhs · rhs.
    pub fn nn(lhs: &'a Tensor, rhs: &'a Tensor) -> Self {
        Self { lhs, rhs, lhs_transposed: false, rhs_transposed: false, alpha: 1.0 }
    }

    /// lhs · rhsᵀ.
    pub fn nt(lhs: &'a Tensor, rhs: &'a Tensor) -> Self {
        Self { rhs_transposed: true, ..Self::nn(lhs, rhs) }
    }

    /// lhsᵀ · rhs.
    pub fn tn(lhs: &'a Tensor, rhs: &'a Tensor) -> Self {
        Self { lhs_transposed: true, ..Self::nn(lhs, rhs) }
    }

    /// The product times `alpha`.
    pub fn scaled(self, alpha: f64) -> Self {
        Self { alpha, ..self }
    }

    /// (m, k, n), checked.
    pub fn dims(&self) -> Result<(usize, usize, usize)> {
        let (l0, l1) = self.lhs.dims2()?;
        let (m, k) = if self.lhs_transposed { (l1, l0) } else { (l0, l1) };
        let (r0, r1) = self.rhs.dims2()?;
        let (rk, n) = if self.rhs_transposed { (r1, r0) } else { (r0, r1) };
        if rk != k {
            bail!(
                "product of {:?}{} and {:?}{}: inner dimensions differ",
                self.lhs.dims(),
                if self.lhs_transposed { "ᵀ" } else { "" },
                self.rhs.dims(),
                if self.rhs_transposed { "ᵀ" } else { "" }
            );
        }
        Ok((m, k, n))
    }

    /// The checked product as cuBLAS takes it.
    #[cfg(feature = "cuda")]
    fn gemm(&self) -> Result<crate::cuda::gemm::Operands<'_>> {
        let (m, k, n) = self.dims()?;
        Ok(crate::cuda::gemm::Operands {
            lhs: self.lhs,
            rhs: self.rhs,
            lhs_transposed: self.lhs_transposed,
            rhs_transposed: self.rhs_transposed,
            alpha: self.alpha,
            m,
            k,
            n,
        })
    }

    /// The product as a new tensor from candle's ops (the composed path).
    pub fn compute(&self) -> Result<Tensor> {
        self.dims()?;
        let op = |t: &Tensor, transposed: bool| if transposed { t.t() } else { Ok(t.clone()) };
        let product = op(self.lhs, self.lhs_transposed)?.matmul(&op(self.rhs, self.rhs_transposed)?)?;
        if self.alpha == 1.0 {
            Ok(product)
        } else {
            product.affine(self.alpha, 0.0)
        }
    }

    /// The product as a new tensor: one cuBLAS GEMM on CUDA, `compute` elsewhere.
    pub fn eval(self) -> Result<Tensor> {
        let mut sum = ProductSum::new();
        sum.add_product(self)?;
        sum.finish()
    }
}

#[derive(Default)]
pub struct ProductSum(Sum);

#[derive(Default)]
enum Sum {
    #[default]
    Empty,
    Composed(Tensor),
    /// f32 on the CPU: the `[m, n]` sum in a buffer of its own.
    Cpu(CpuSum),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::gemm::CudaSum),
}

impl ProductSum {
    pub fn new() -> Self {
        Self::default()
    }

    /// sum += lhs · op(rhs).
    pub fn add_product(&mut self, p: Product) -> Result<()> {
        self.0 = match std::mem::take(&mut self.0) {
            #[cfg(feature = "cuda")]
            Sum::Empty if p.lhs.device().is_cuda() => {
                Sum::Cuda(crate::cuda::gemm::CudaSum::start(&p.gemm()?)?)
            }
            Sum::Empty if cpu_takes(&p) => Sum::Cpu(CpuSum::start(&p)?),
            Sum::Cpu(mut sum) if cpu_takes(&p) => {
                sum.add_product(&p, 0)?;
                Sum::Cpu(sum)
            }
            Sum::Cpu(sum) => Sum::Composed((sum.finish()? + p.compute()?)?),
            Sum::Empty => Sum::Composed(p.compute()?),
            Sum::Composed(sum) => Sum::Composed((sum + p.compute()?)?),
            #[cfg(feature = "cuda")]
            Sum::Cuda(mut sum) => {
                sum.add_product(&p.gemm()?)?;
                Sum::Cuda(sum)
            }
        };
        Ok(())
    }

    /// sum += t (`t` is `[m, n]`).
    pub fn add_tensor(&mut self, t: &Tensor) -> Result<()> {
        self.0 = match std::mem::take(&mut self.0) {
            #[cfg(feature = "cuda")]
            Sum::Empty if t.device().is_cuda() => Sum::Cuda(crate::cuda::gemm::CudaSum::from_tensor(t)?),
            Sum::Empty if cpu::takes(&[t]) => Sum::Cpu(CpuSum::from_tensor(t)?),
            Sum::Cpu(mut sum) if cpu::takes(&[t]) => {
                sum.add_tensor(t)?;
                Sum::Cpu(sum)
            }
            Sum::Cpu(sum) => Sum::Composed((sum.finish()? + t)?),
            Sum::Empty => Sum::Composed(t.clone()),
            Sum::Composed(sum) => Sum::Composed((sum + t)?),
            #[cfg(feature = "cuda")]
            Sum::Cuda(mut sum) => {
                sum.add_tensor(t)?;
                Sum::Cuda(sum)
            }
        };
        Ok(())
    }

    /// sum[:, col0 .. col0 + n] += lhs · op(rhs), in a sum `width` columns wide: the product of
    /// an input with a slice of a weight's rows (starts the sum at zero when it is empty).
    pub fn add_product_to_columns(&mut self, p: Product, col0: usize, width: usize) -> Result<()> {
        let (m, _, n) = p.dims()?;
        if col0 + n > width {
            bail!("columns {col0}..{} of a sum {width} wide", col0 + n);
        }
        if (col0, n) == (0, width) {
            return self.add_product(p);
        }
        self.0 = match std::mem::take(&mut self.0) {
            #[cfg(feature = "cuda")]
            Sum::Empty if p.lhs.device().is_cuda() => {
                let mut sum = crate::cuda::gemm::CudaSum::zeros(p.lhs, (m, width))?;
                sum.add_product_to_columns(&p.gemm()?, col0)?;
                Sum::Cuda(sum)
            }
            Sum::Empty if cpu_takes(&p) => {
                let mut sum = CpuSum { values: vec![0f32; m * width], rows: m, cols: width };
                sum.add_product(&p, col0)?;
                Sum::Cpu(sum)
            }
            Sum::Cpu(mut sum) if cpu_takes(&p) => {
                sum.add_product(&p, col0)?;
                Sum::Cpu(sum)
            }
            Sum::Cpu(sum) => Sum::Composed(add_to_columns(sum.finish()?, &p, col0)?),
            Sum::Empty => {
                let zeros = Tensor::zeros((m, width), p.lhs.dtype(), p.lhs.device())?;
                Sum::Composed(add_to_columns(zeros, &p, col0)?)
            }
            Sum::Composed(sum) => Sum::Composed(add_to_columns(sum, &p, col0)?),
            #[cfg(feature = "cuda")]
            Sum::Cuda(mut sum) => {
                sum.add_product_to_columns(&p.gemm()?, col0)?;
                Sum::Cuda(sum)
            }
        };
        Ok(())
    }

    pub fn finish(self) -> Result<Tensor> {
        match self.0 {
            Sum::Empty => bail!("an empty sum of products"),
            Sum::Composed(t) => Ok(t),
            Sum::Cpu(sum) => sum.finish(),
            #[cfg(feature = "cuda")]
            Sum::Cuda(sum) => Ok(sum.finish()),
        }
    }
}

/// Whether the CPU's in-place sum takes the product: both operands f32 on the CPU.
fn cpu_takes(p: &Product) -> bool {
    cpu::takes(&[p.lhs, p.rhs])
}

/// An f32 sum of products on the CPU, each accumulated in place by the gemm crate.
struct CpuSum {
    values: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl CpuSum {
    /// The sum holding `p` alone.
    fn start(p: &Product) -> Result<Self> {
        let (m, _, n) = p.dims()?;
        let mut sum = Self { values: vec![0f32; m * n], rows: m, cols: n };
        sum.product(p, 0, false)?;
        Ok(sum)
    }

    fn from_tensor(t: &Tensor) -> Result<Self> {
        let (rows, cols) = t.dims2()?;
        let values = cpu::with_rows(t, |v| Ok(v.to_vec()))?;
        Ok(Self { values, rows, cols })
    }

    /// Columns `col0..` += p.
    fn add_product(&mut self, p: &Product, col0: usize) -> Result<()> {
        self.product(p, col0, true)
    }

    /// Columns `col0..` of the sum set to p, or added to with `accumulate`.
    fn product(&mut self, p: &Product, col0: usize, accumulate: bool) -> Result<()> {
        let (m, _, n) = p.dims()?;
        if m != self.rows || col0 + n > self.cols {
            bail!("a [{m}, {n}] product at column {col0} of a [{}, {}] sum", self.rows, self.cols);
        }
        let (ra, rb) = (cpu::Read::new(p.lhs)?, cpu::Read::new(p.rhs)?);
        let (a, b) = (View::of(&ra)?, View::of(&rb)?);
        let a = if p.lhs_transposed { a.t() } else { a };
        let b = if p.rhs_transposed { b.t() } else { b };
        let dst = View::rows(col0, m, n, self.cols);
        let operands = ((ra.buffer(), a), (rb.buffer(), b));
        gemm::product(
            &mut self.values,
            dst,
            operands.0,
            operands.1,
            p.alpha as f32,
            accumulate,
            Threads::Pool,
        )
    }

    /// sum += t.
    fn add_tensor(&mut self, t: &Tensor) -> Result<()> {
        if t.dims2()? != (self.rows, self.cols) {
            bail!("a {:?} tensor added to a [{}, {}] sum", t.dims(), self.rows, self.cols);
        }
        cpu::with_rows(t, |v| {
            self.values.par_chunks_mut(1 << 15).zip(v.par_chunks(1 << 15)).for_each(|(s, v)| {
                for (s, v) in s.iter_mut().zip(v) {
                    *s += v;
                }
            });
            Ok(())
        })
    }

    fn finish(self) -> Result<Tensor> {
        cpu::tensor(self.values, (self.rows, self.cols))
    }
}

/// The composed `add_product_to_columns`.
fn add_to_columns(sum: Tensor, p: &Product, col0: usize) -> Result<Tensor> {
    let product = p.compute()?;
    let (m, n) = product.dims2()?;
    let updated = (sum.narrow(1, col0, n)? + product)?;
    sum.slice_assign(&[0..m, col0..col0 + n], &updated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn randn(shape: &[usize], seed: u64) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let v: Vec<f32> = (0..shape.iter().product()).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    #[cfg(feature = "cuda")]
    fn max_abs(t: &Tensor) -> f32 {
        t.abs().unwrap().max_all().unwrap().to_dtype(DType::F32).unwrap().to_scalar::<f32>().unwrap()
    }

    /// x·Wᵀ + h·Bᵀ + dh·A + r with the shapes of a LoRA projection, `rhs` both ways round.
    fn terms(dev: &Device, dtype: DType) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) {
        let on = |t: Tensor| t.to_dtype(dtype).unwrap().to_device(dev).unwrap();
        let (n, d_in, d_out, r) = (37, 96, 80, 8);
        (
            on(randn(&[n, d_in], 1)),     // x
            on(randn(&[d_out, d_in], 2)), // w, stored [out, in]
            on(randn(&[n, r], 3)),        // h
            on(randn(&[d_out, r], 4)),    // b, stored [out, r]
            on(randn(&[n, r], 5)),        // dh
            on(randn(&[r, d_out], 6)),    // a, [r, out] (not transposed)
            on(randn(&[n, d_out], 7)),    // residual
        )
    }

    fn sum(dev: &Device, dtype: DType) -> Tensor {
        let (x, w, h, b, dh, a, res) = terms(dev, dtype);
        let mut s = ProductSum::new();
        s.add_product(Product::nt(&h, &b)).unwrap();
        s.add_tensor(&res).unwrap();
        s.add_product(Product::nt(&x, &w)).unwrap();
        s.add_product(Product::nn(&dh, &a)).unwrap();
        s.finish().unwrap().to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap()
    }

    /// The CPU's in-place f32 sum against the composed one (candle's matmuls and adds) in f32,
    /// and in f64 (the composed path there), the exact answer.
    #[test]
    fn sum_is_the_sum_of_the_matmuls() {
        let composed = |dtype: DType| {
            let (x, w, h, b, dh, a, res) = terms(&Device::Cpu, dtype);
            (((h.matmul(&b.t().unwrap()).unwrap() + &res).unwrap() + x.matmul(&w.t().unwrap()).unwrap())
                .unwrap()
                + dh.matmul(&a).unwrap())
            .unwrap()
        };
        crate::testing::assert_within_reference_error(
            "sum of products",
            &sum(&Device::Cpu, DType::F32),
            &composed(DType::F32),
            &composed(DType::F64),
        );
    }

    /// Column products and transposed, scaled, sliced operands on the CPU's in-place sum
    /// against the composed products, in f32 and f64.
    #[test]
    fn cpu_sum_reads_transposed_scaled_and_sliced_operands() {
        let (dy, h, b) = (randn(&[37, 90], 21), randn(&[37, 48], 22), randn(&[90, 16], 23));
        let run = |dy: &Tensor, h: &Tensor, b: &Tensor| {
            let h_i = h.narrow(1, 16, 16).unwrap();
            let grad_b = Product::tn(dy, &h_i).scaled(0.5).eval().unwrap();
            let out = Product::nt(&h_i, b).eval().unwrap();
            let mut dh = ProductSum::new();
            dh.add_product_to_columns(Product::nn(dy, b), 16, 48).unwrap();
            dh.add_product_to_columns(Product::nn(dy, b).scaled(2.0), 0, 48).unwrap();
            (grad_b, out, dh.finish().unwrap())
        };
        let composed = |dy: &Tensor, h: &Tensor, b: &Tensor| {
            let h_i = h.narrow(1, 16, 16).unwrap();
            let grad_b = Product::tn(dy, &h_i).scaled(0.5).compute().unwrap();
            let out = Product::nt(&h_i, b).compute().unwrap();
            let p = Product::nn(dy, b).compute().unwrap();
            (grad_b, out, Tensor::cat(&[(&p * 2.0).unwrap(), p.clone(), p.zeros_like().unwrap()], 1).unwrap())
        };
        let f64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let ours = run(&dy, &h, &b);
        let want = composed(&dy, &h, &b);
        let exact = composed(&f64(&dy), &f64(&h), &f64(&b));
        for (what, ours, want, exact) in [
            ("scale·dyᵀ·h_i", &ours.0, &want.0, &exact.0),
            ("h_i·bᵀ", &ours.1, &want.1, &exact.1),
            ("dh columns", &ours.2, &want.2, &exact.2),
        ] {
            crate::testing::assert_within_reference_error(what, ours, want, exact);
        }
    }

    #[test]
    fn mismatched_inner_dimensions_are_an_error() {
        let (x, w, ..) = terms(&Device::Cpu, DType::F32);
        let mut s = ProductSum::new();
        let err = s.add_product(Product::nn(&x, &w)).unwrap_err();
        assert!(err.to_string().contains("inner dimensions differ"), "{err}");
        assert!(ProductSum::new().finish().is_err());
    }

    /// cuBLAS accumulation (beta = 1, axpy) against the composed CPU sum.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_sum_matches_the_composed_cpu_sum() {
        let gpu = Device::new_cuda(0).unwrap();
        let want = sum(&Device::Cpu, DType::F32);
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-3), (DType::BF16, 1e-2)] {
            let err = max_abs(&(sum(&gpu, dtype) - &want).unwrap()) / max_abs(&want);
            println!("{dtype:?}: {err:.2e}");
            assert!(err < tol, "{dtype:?}: {err}");
        }
    }

    /// A sum started from a tile of rows holds that tile alone (its storage runs on past it), and
    /// a tile added to it adds those rows.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_sum_of_row_tiles_reads_the_tiles_alone() {
        let gpu = Device::new_cuda(0).unwrap();
        let whole = randn(&[10, 6], 3);
        let on_gpu = whole.to_device(&gpu).unwrap();
        let mut s = ProductSum::new();
        s.add_tensor(&on_gpu.narrow(0, 2, 3).unwrap()).unwrap();
        s.add_tensor(&on_gpu.narrow(0, 5, 3).unwrap()).unwrap();
        let got = s.finish().unwrap().to_device(&Device::Cpu).unwrap();
        let want = (whole.narrow(0, 2, 3).unwrap() + whole.narrow(0, 5, 3).unwrap()).unwrap();
        assert_eq!(got.to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
    }

    /// Products into column slices (a weight read a slice of rows at a time), starting from an
    /// empty sum, on cuBLAS against the plain product on the CPU.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_column_products_match_the_whole_product() {
        let gpu = Device::new_cuda(0).unwrap();
        let (x, w) = (randn(&[37, 64], 11), randn(&[90, 64], 12));
        let want = x.matmul(&w.t().unwrap()).unwrap();
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 2e-3), (DType::BF16, 1e-2)] {
            let on = |t: &Tensor| t.to_dtype(dtype).unwrap().to_device(&gpu).unwrap();
            let (xg, wg) = (on(&x), on(&w));
            let mut s = ProductSum::new();
            for (r0, len) in [(50, 40), (0, 50)] {
                let rows = wg.narrow(0, r0, len).unwrap();
                s.add_product_to_columns(Product::nt(&xg, &rows), r0, 90).unwrap();
            }
            let got = s.finish().unwrap().to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
            let err = max_abs(&(got - &want).unwrap()) / max_abs(&want);
            assert!(err < tol, "{dtype:?}: {err}");
        }
    }

    /// The operand forms the LoRA backward uses, on cuBLAS: a transposed lhs with a factor
    /// (grad_B = scale·dyᵀ·h_i), column slices of a wider tensor read in place (h_i of h), and a
    /// product into columns of a sum (dh_i of dh). Each dtype's inputs are rounded to it first;
    /// the exact answer is the f64 product of those, the reference the CPU's f32 product rounded
    /// to the dtype (what a correct kernel with f32 accumulation can do at best), and ours is held
    /// to a small multiple of the reference's error (`assert_within_reference_error`).
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_transposed_scaled_and_sliced_operands_match_the_composed_products() {
        use crate::testing::assert_within_reference_error;
        let gpu = Device::new_cuda(0).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let rounded = |shape: &[usize], seed| randn(shape, seed).to_dtype(dtype).unwrap();
            let (dy, h, b) = (rounded(&[37, 90], 21), rounded(&[37, 48], 22), rounded(&[90, 16], 23));
            let in_f = |t: &Tensor, d: DType| t.to_dtype(d).unwrap();
            let products = |dy: &Tensor, h: &Tensor, b: &Tensor| {
                let h_i = h.narrow(1, 16, 16).unwrap();
                let grad_b = Product::tn(dy, &h_i).scaled(0.5).compute().unwrap();
                (grad_b, Product::nt(&h_i, b).compute().unwrap(), Product::nn(dy, b).compute().unwrap())
            };
            let exact = products(&in_f(&dy, DType::F64), &in_f(&h, DType::F64), &in_f(&b, DType::F64));
            let reference = products(&in_f(&dy, DType::F32), &in_f(&h, DType::F32), &in_f(&b, DType::F32));
            let (dy_g, h_g, b_g) =
                (dy.to_device(&gpu).unwrap(), h.to_device(&gpu).unwrap(), b.to_device(&gpu).unwrap());
            let h_ig = h_g.narrow(1, 16, 16).unwrap();
            let grad_b = Product::tn(&dy_g, &h_ig).scaled(0.5).eval().unwrap();
            let out = Product::nt(&h_ig, &b_g).eval().unwrap();
            let mut dh = ProductSum::new();
            dh.add_product_to_columns(Product::nn(&dy_g, &b_g), 16, 48).unwrap();
            let dh = dh.finish().unwrap().to_device(&Device::Cpu).unwrap();
            for (what, ours, reference, exact) in [
                ("scale·dyᵀ·h_i", grad_b, &reference.0, &exact.0),
                ("h_i·bᵀ", out, &reference.1, &exact.1),
                ("dh columns", dh.narrow(1, 16, 16).unwrap(), &reference.2, &exact.2),
            ] {
                let stored = in_f(&in_f(reference, dtype), DType::F32);
                assert_within_reference_error(
                    &format!("{dtype:?} {what}"),
                    &in_f(&ours, DType::F32),
                    &stored,
                    exact,
                );
            }
            let others = dh.narrow(1, 0, 16).unwrap();
            assert_eq!(max_abs(&in_f(&others, DType::F32)), 0.0, "{dtype:?}: the other columns stay zero");
        }
    }
}
