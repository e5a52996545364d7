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

    /// sum += a CUDA kernel's `[m, n]` result (`dims`, in `like`'s dtype, on its device),
    /// written by `write(address, accumulate)` straight into the sum's buffer: the result alone
    /// when the sum is empty (`accumulate` false), added to what it holds otherwise. A sum held
    /// off the GPU is an error (`takes_in_place` says which sums take it).
    #[cfg(feature = "cuda")]
    pub fn add_in_place(
        &mut self,
        like: &Tensor,
        dims: (usize, usize),
        write: impl FnOnce(u64, bool) -> Result<()>,
    ) -> Result<()> {
        match &mut self.0 {
            Sum::Cuda(sum) => sum.write_in_place(like.dtype(), dims, |y| write(y, true)),
            Sum::Empty if like.device().is_cuda() => {
                self.0 = Sum::Cuda(crate::cuda::gemm::CudaSum::written(like, dims, |y| write(y, false))?);
                Ok(())
            }
            _ => bail!("a CUDA kernel's result added in place to a sum held off the GPU"),
        }
    }

    /// Whether `add_in_place` takes a result on `device`: the sum is empty or on CUDA.
    pub fn takes_in_place(&self, device: &candle_core::Device) -> bool {
        match &self.0 {
            Sum::Empty => device.is_cuda(),
            #[cfg(feature = "cuda")]
            Sum::Cuda(_) => true,
            _ => false,
        }
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
#[path = "product_sum_tests.rs"]
mod tests;
