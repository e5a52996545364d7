//! `LoraLinear`: a frozen base weight plus an optional trained low-rank update,
//! y = x Wᵀ + scale · dropout(x) Aᵀ Bᵀ, with a hand-written backward that never computes the
//! frozen weight's gradient.

use crate::profile::section;
use candle_core::{DType, Device, Result, Tensor};

use super::adapter::LoraAdapter;
use super::dropout::dropout;
pub use super::dropout::DropoutSeed;
use crate::model::ops::product_sum::{Product, ProductSum};

use crate::quant::Nf4Tensor;

/// The frozen weight of a projection, `[out, in]`: dense, or NF4 dequantized per use.
#[derive(Debug, Clone)]
pub enum BaseWeight {
    Dense(Tensor),
    /// 4-bit storage only; each use dequantizes to the compute dtype and drops the result, so no
    /// full-precision copy outlives one matmul.
    Nf4(Nf4Tensor),
}

impl BaseWeight {
    pub fn dims(&self) -> (usize, usize) {
        match self {
            BaseWeight::Dense(w) => (w.dim(0).unwrap_or(0), w.dim(1).unwrap_or(0)),
            BaseWeight::Nf4(q) => q.shape().dims2().unwrap_or((0, 0)),
        }
    }

    /// Bytes the stored weight occupies.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            BaseWeight::Dense(w) => w.elem_count() * w.dtype().size_in_bytes(),
            BaseWeight::Nf4(q) => q.size_in_bytes(),
        }
    }

    /// The weight in `dtype` for one use: the stored tensor, or NF4 dequantized (dropped after
    /// the product that reads it).
    fn for_use(&self, dtype: DType, device: &Device) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => Ok(w.clone()),
            BaseWeight::Nf4(q) => section("nf4.dequantize", device, || q.dequantize(dtype)),
        }
    }

    /// Rows `rows` of the weight in `dtype` for one use (NF4: only those rows dequantized).
    fn rows_for_use(&self, dtype: DType, device: &Device, rows: std::ops::Range<usize>) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => w.narrow(0, rows.start, rows.len()),
            BaseWeight::Nf4(q) => section("nf4.dequantize", device, || q.dequantize_rows(dtype, rows)),
        }
    }

    /// Rows of the weight to dequantize at once when a GEMM's activation operand is `tokens` ×
    /// `activation / tokens`: all of them from `WHOLE_WEIGHT_TOKENS` tokens on or when the weight
    /// is no larger than max(activation, 2^24 values), else slices that are (starting on NF4
    /// statistics blocks). At small batches the f16 copy of a 14336 × 4096 weight (112 MiB) is
    /// otherwise a visible part of peak memory; at large ones the activations dwarf it, and the
    /// slices' extra launches and narrower GEMMs cost more time than their memory is worth.
    fn rows_per_slice(&self, tokens: usize, activation: usize) -> usize {
        let (out_dim, in_dim) = self.dims();
        if tokens >= WHOLE_WEIGHT_TOKENS {
            return out_dim;
        }
        let budget = activation.max(MIN_SLICE_VALUES);
        let slices = (out_dim * in_dim).div_ceil(budget).max(1);
        if slices == 1 {
            return out_dim;
        }
        let align = crate::quant::ROW_ALIGN_VALUES / gcd(in_dim.max(1), crate::quant::ROW_ALIGN_VALUES);
        out_dim.div_ceil(slices).div_ceil(align) * align
    }

    /// The weight as a dense tensor (for merging and for the autograd oracle); NF4 dequantizes to
    /// the dtype it was quantized from.
    pub fn dense(&self) -> Result<Tensor> {
        match self {
            BaseWeight::Dense(w) => Ok(w.clone()),
            BaseWeight::Nf4(q) => q.dequantize(q.dtype()),
        }
    }
}

/// The smallest dequantized slice (values) a GEMM reads a large weight in (the memory planner
/// counts it as workspace).
pub const MIN_SLICE_VALUES: usize = 1 << 24;

/// From this many tokens a step's GEMMs read each weight whole: slicing costs a few percent of a
/// 512 × 8 step, which has memory to spare (benches/code_notes.md).
pub const WHOLE_WEIGHT_TOKENS: usize = 4096;

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[derive(Debug, Clone)]
pub struct LoraLinear {
    pub base: BaseWeight,
    /// The frozen bias `[out]` in the compute dtype (Qwen2's q/k/v), added after the product.
    pub bias: Option<Tensor>,
    pub lora: Option<LoraAdapter>,
}

/// Gradients of one adapter.
pub struct LoraGrad {
    pub lora_a: Tensor,
    pub lora_b: Tensor,
}

impl LoraLinear {
    /// x `[n, in]` → `[n, out]`. `dropout` is `None` in eval mode.
    pub fn forward(&self, x: &Tensor, dropout: Option<DropoutSeed>) -> Result<Tensor> {
        let mut out = ProductSum::new();
        self.forward_into(x, dropout, &mut out)?;
        out.finish()
    }

    /// out += x·Wᵀ + scale · dropout(x)·Aᵀ·Bᵀ: the low-rank product first, then the base GEMM
    /// onto it (one buffer on CUDA).
    pub fn forward_into(&self, x: &Tensor, dropout: Option<DropoutSeed>, out: &mut ProductSum) -> Result<()> {
        let dev = x.device();
        if let Some(lora) = &self.lora {
            let xd = self.dropped_input(x, dropout)?;
            let (a, b) = section("lora.weights", dev, || lora.weights(x.dtype()))?;
            let h = section("lora.x_a", dev, || Product::nt(&xd, &a).eval())?;
            section("lora.h_b", dev, || out.add_product(Product::nt(&h, &b)))?;
        }
        self.base_forward_into(x, out)
    }

    /// out += x·Wᵀ (+ bias), the frozen part alone (a `LoraGroup` adds the low-rank part).
    pub fn base_forward_into(&self, x: &Tensor, out: &mut ProductSum) -> Result<()> {
        if !self.nf4_direct_into(x, out)? {
            self.base_forward_sliced(x, out, self.rows_per_slice(x))?;
        }
        match &self.bias {
            // a rank-1 product, ones·biasᵀ, so it accumulates in the same buffer as the GEMMs
            Some(bias) => {
                let ones = Tensor::ones((x.dim(0)?, 1), x.dtype(), x.device())?;
                let bias = bias.to_dtype(x.dtype())?.reshape((1, bias.elem_count()))?;
                out.add_product(Product::nn(&ones, &bias))
            }
            None => Ok(()),
        }
    }

    /// out += x·Wᵀ straight from an NF4 base's codes on CUDA, where a kernel takes x: the NF4
    /// GEMV for a decode batch of at most `GEMV_MAX_ROWS` rows, the NF4 GEMM (tensor cores) for
    /// up to `GEMM_ROUTED_ROWS`; each reads the 4-bit weight instead of writing and reading a 16-bit
    /// copy. Returns whether one did (else the dequantize + GEMM path runs).
    fn nf4_direct_into(&self, x: &Tensor, out: &mut ProductSum) -> Result<bool> {
        #[cfg(feature = "cuda")]
        if let BaseWeight::Nf4(q) = &self.base {
            use crate::quant::{
                nf4_gemm_applies, nf4_gemm_into, nf4_gemv_applies, nf4_gemv_into, GEMM_ROUTED_ROWS,
            };
            type Launch = unsafe fn(&Tensor, &crate::quant::Nf4Tensor, u64, bool) -> Result<()>;
            let kernel: Option<(&'static str, Launch)> = if nf4_gemv_applies(x, q) {
                Some(("nf4.gemv", nf4_gemv_into))
            } else if x.dim(0)? <= GEMM_ROUTED_ROWS && nf4_gemm_applies(x, q) {
                Some(("nf4.gemm", nf4_gemm_into))
            } else {
                None
            };
            if let Some((name, launch)) = kernel.filter(|_| out.takes_in_place(x.device())) {
                let dims = (x.dim(0)?, q.shape().dims2()?.0);
                section(name, x.device(), || {
                    out.add_in_place(x, dims, |y, accumulate| {
                        // SAFETY: `y` is the sum's own [n, out] buffer in x's dtype (checked by
                        // add_in_place), which nothing else touches until the launch has run.
                        unsafe { launch(x, q, y, accumulate) }
                    })
                })?;
                return Ok(true);
            }
        }
        let _ = (x, out);
        Ok(false)
    }

    /// dx += dy·W, the frozen part's input gradient alone.
    pub fn base_backward_into(&self, dy: &Tensor, dx: &mut ProductSum) -> Result<()> {
        self.base_backward_sliced(dy, dx, self.rows_per_slice(dy))
    }

    /// Rows of an NF4 weight dequantized at once for a product with `activation`; a dense
    /// weight is read whole (a slice of it would save no memory).
    fn rows_per_slice(&self, activation: &Tensor) -> usize {
        match self.base {
            BaseWeight::Dense(_) => usize::MAX,
            BaseWeight::Nf4(_) => {
                self.base.rows_per_slice(activation.dim(0).unwrap_or(0), activation.elem_count())
            }
        }
    }

    /// This projection with its base weight dequantized to `dtype` once, for a pass that reads
    /// it several times (the tiled MLP); a dense base is shared as it is.
    pub fn dequantized(&self, dtype: DType, device: &Device) -> Result<LoraLinear> {
        match &self.base {
            BaseWeight::Dense(_) => Ok(self.clone()),
            BaseWeight::Nf4(_) => {
                let base = BaseWeight::Dense(self.base.for_use(dtype, device)?);
                Ok(LoraLinear { base, bias: self.bias.clone(), lora: self.lora.clone() })
            }
        }
    }

    /// `base_forward_into` reading W `rows` rows at a time: each slice of rows is a slice of
    /// output columns.
    fn base_forward_sliced(&self, x: &Tensor, out: &mut ProductSum, rows: usize) -> Result<()> {
        let dev = x.device();
        let (out_dim, _) = self.base.dims();
        if rows >= out_dim {
            let w = self.base.for_use(x.dtype(), dev)?;
            return section("gemm.base", dev, || out.add_product(Product::nt(x, &w)));
        }
        for r0 in (0..out_dim).step_by(rows.max(1)) {
            let w = self.base.rows_for_use(x.dtype(), dev, r0..(r0 + rows).min(out_dim))?;
            let p = Product::nt(x, &w);
            section("gemm.base", dev, || out.add_product_to_columns(p, r0, out_dim))?;
        }
        Ok(())
    }

    /// `base_backward_into` reading W `rows` rows at a time: each slice of rows is a slice of
    /// dy's columns, its product accumulated onto dx.
    fn base_backward_sliced(&self, dy: &Tensor, dx: &mut ProductSum, rows: usize) -> Result<()> {
        let dev = dy.device();
        let (out_dim, _) = self.base.dims();
        if rows >= out_dim {
            let w = self.base.for_use(dy.dtype(), dev)?;
            return section("gemm.base", dev, || dx.add_product(Product::nn(dy, &w)));
        }
        for r0 in (0..out_dim).step_by(rows.max(1)) {
            let len = rows.min(out_dim - r0);
            let w = self.base.rows_for_use(dy.dtype(), dev, r0..r0 + len)?;
            let dy_slice = dy.narrow(1, r0, len)?.contiguous()?;
            section("gemm.base", dev, || dx.add_product(Product::nn(&dy_slice, &w)))?;
        }
        Ok(())
    }

    fn dropped_input(&self, x: &Tensor, seed: Option<DropoutSeed>) -> Result<Tensor> {
        match (&self.lora, seed) {
            (Some(l), Some(seed)) => dropout(x, seed, l.dropout),
            _ => Ok(x.clone()),
        }
    }

    /// Given the forward's input x and the output gradient dy, returns dx and the adapter's
    /// gradients (f32). The base weight only ever appears as dy·W.
    pub fn backward(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dropout: Option<DropoutSeed>,
    ) -> Result<(Tensor, Option<LoraGrad>)> {
        let mut dx = ProductSum::new();
        let grad = self.backward_into(x, dy, dropout, &mut dx)?;
        Ok((dx.finish()?, grad))
    }

    /// dx += dy·W + dropout(scale · dy·B·A) (the input gradient, accumulated with those of other
    /// projections that read the same input); returns the adapter's gradients (f32).
    pub fn backward_into(
        &self,
        x: &Tensor,
        dy: &Tensor,
        dropout: Option<DropoutSeed>,
        dx: &mut ProductSum,
    ) -> Result<Option<LoraGrad>> {
        let dev = x.device();
        let grad = match &self.lora {
            None => None,
            Some(lora) => {
                Some(section("lora.backward", dev, || self.lora_backward(lora, x, dy, dropout, dx))?)
            }
        };
        self.base_backward_into(dy, dx)?;
        Ok(grad)
    }

    fn lora_backward(
        &self,
        lora: &LoraAdapter,
        x: &Tensor,
        dy: &Tensor,
        dropout: Option<DropoutSeed>,
        dx: &mut ProductSum,
    ) -> Result<LoraGrad> {
        let (a, b) = lora.weights(x.dtype())?;
        // the forward's mask, drawn again from its seed
        let xd = self.dropped_input(x, dropout)?;
        // each product one GEMM on operands read where they lie (the scale folded into grad_B's)
        let h = Product::nt(&xd, &a).eval()?; // [n, r]
        let grad_b = Product::tn(dy, &h).scaled(lora.scale).eval()?; // [out, r]
        let dh = Product::nn(dy, &b).eval()?; // [n, r], b already scaled
        let grad_a = Product::tn(&dh, &xd).eval()?; // [r, in]
        if dropout.is_some() && lora.dropout > 0.0 {
            // the mask applies to the low-rank part alone: materialize it
            dx.add_tensor(&self.dropped_input(&Product::nn(&dh, &a).eval()?, dropout)?)?;
        // same mask
        } else {
            dx.add_product(Product::nn(&dh, &a))?;
        }
        Ok(LoraGrad { lora_a: grad_a, lora_b: grad_b })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layer::{DecoderLayer, LayerInput};
    use crate::model::ops::attention::{causal_mask, ScoreRule};
    use crate::model::ops::Rope;
    use crate::model::reference::{linear_f64, random_layer};
    use crate::testing::assert_within_reference_error;

    fn bits(t: &Tensor) -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The same layer twice: NF4 bases, and dense bases holding those NF4 weights dequantized.
    fn nf4_and_dequantized(layer: &DecoderLayer) -> (DecoderLayer, DecoderLayer) {
        let (mut nf4, mut dense) = (layer.clone(), layer.clone());
        for (q, d) in nf4.proj.iter_mut().zip(dense.proj.iter_mut()) {
            let t = Nf4Tensor::quantize(&q.base.dense().unwrap(), true).unwrap();
            d.base = BaseWeight::Dense(t.dequantize(DType::F32).unwrap());
            q.base = BaseWeight::Nf4(t);
        }
        (nf4, dense)
    }

    #[test]
    fn nf4_linear_equals_dense_linear_on_the_dequantized_weight() -> Result<()> {
        let dev = Device::Cpu;
        let layer = random_layer(32, 48, 4, 4, 3, 5);
        let (nf4, dense) = nf4_and_dequantized(&layer);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for p in [0, 4, 6] {
                let (q, d) = (&nf4.proj[p], &dense.proj[p]);
                let (out_dim, in_dim) = q.base.dims();
                assert_eq!((out_dim, in_dim), d.base.dims());
                // the dense reference holds the weight in the compute dtype, as NF4 produces it
                let d = LoraLinear { base: BaseWeight::Dense(d.base.dense()?.to_dtype(dtype)?), ..d.clone() };
                let x = Tensor::randn(0f32, 1.0, (5, in_dim), &dev)?.to_dtype(dtype)?;
                let dy = Tensor::randn(0f32, 1.0, (5, out_dim), &dev)?.to_dtype(dtype)?;
                assert_eq!(bits(&q.forward(&x, None)?), bits(&d.forward(&x, None)?), "{dtype:?} forward {p}");
                let (dx_q, g_q) = q.backward(&x, &dy, None)?;
                let (dx_d, g_d) = d.backward(&x, &dy, None)?;
                assert_eq!(bits(&dx_q), bits(&dx_d), "{dtype:?} dx {p}");
                let (g_q, g_d) = (g_q.unwrap(), g_d.unwrap());
                assert_eq!(bits(&g_q.lora_a), bits(&g_d.lora_a), "{dtype:?} grad A {p}");
                assert_eq!(bits(&g_q.lora_b), bits(&g_d.lora_b), "{dtype:?} grad B {p}");
            }
        }
        Ok(())
    }

    /// Reading the weight a slice of rows at a time (what small batches do to bound the
    /// dequantization scratch) gives the whole-weight products: the forward exactly (column
    /// slices), the input gradient up to summation order; and the slices start on NF4 blocks.
    #[test]
    fn sliced_weight_products_equal_whole_weight_products() -> Result<()> {
        let dev = Device::Cpu;
        // 600 rows of 64: slices of 256 rows start on 16384-value blocks, the last is short
        let w = Tensor::randn(0f32, 0.05, (600, 64), &dev)?;
        let x = Tensor::randn(0f32, 1.0, (5, 64), &dev)?;
        let dy = Tensor::randn(0f32, 1.0, (5, 600), &dev)?;
        for base in [BaseWeight::Dense(w.clone()), BaseWeight::Nf4(Nf4Tensor::quantize(&w, true)?)] {
            let linear = LoraLinear { base, bias: None, lora: None };
            let (mut whole, mut sliced) = (ProductSum::new(), ProductSum::new());
            linear.base_forward_sliced(&x, &mut whole, 600)?;
            linear.base_forward_sliced(&x, &mut sliced, 256)?;
            assert_eq!(bits(&whole.finish()?), bits(&sliced.finish()?));
            let (mut whole, mut sliced) = (ProductSum::new(), ProductSum::new());
            linear.base_backward_sliced(&dy, &mut whole, 600)?;
            linear.base_backward_sliced(&dy, &mut sliced, 256)?;
            // the exact answer: the whole-weight product in f64 (NF4: on its dequantized weight)
            let (mut exact, exact_linear) = (ProductSum::new(), linear_f64(&linear));
            exact_linear.base_backward_sliced(&dy.to_dtype(DType::F64)?, &mut exact, 600)?;
            let what = format!(
                "sliced dx, {} base",
                if matches!(linear.base, BaseWeight::Nf4(_)) { "NF4" } else { "dense" }
            );
            assert_within_reference_error(&what, &sliced.finish()?, &whole.finish()?, &exact.finish()?);
        }
        // 14336 x 4096 at 1024 tokens: four slices of 3584 rows, each a whole number of
        // 16384-value statistics blocks; from 4096 tokens on the weight goes whole
        let big = BaseWeight::Dense(Tensor::zeros((14336, 4096), DType::F16, &dev)?);
        assert_eq!(big.rows_per_slice(1024, 1024 * 4096), 3584);
        assert_eq!(3584 * 4096 % crate::quant::ROW_ALIGN_VALUES, 0);
        assert_eq!(big.rows_per_slice(2048, 2048 * 4096), 3584);
        assert_eq!(big.rows_per_slice(4096, 4096 * 4096), 14336);
        assert_eq!(big.rows_per_slice(16384, 16384 * 4096), 14336);
        let down = BaseWeight::Dense(Tensor::zeros((4096, 14336), DType::F16, &dev)?);
        assert_eq!(down.rows_per_slice(1024, 1024 * 4096) * 14336 % crate::quant::ROW_ALIGN_VALUES, 0);
        Ok(())
    }

    #[test]
    fn nf4_base_is_frozen_storage_and_dense_view_is_its_dequantization() -> Result<()> {
        let w = Tensor::randn(0f32, 0.05, (48, 32), &Device::Cpu)?.to_dtype(DType::F16)?;
        let q = Nf4Tensor::quantize(&w, true)?;
        let base = BaseWeight::Nf4(q.clone());
        assert_eq!(base.dims(), (48, 32));
        let dense = base.dense()?;
        assert_eq!(dense.dtype(), DType::F16);
        assert_eq!(bits(&dense), bits(&q.dequantize(DType::F16)?));
        // 4-bit codes + 8-bit absmax: well under a quarter of the f16 weight's 3072 bytes
        assert!(q.size_in_bytes() < 48 * 32 * 2 / 3, "{}", q.size_in_bytes());
        Ok(())
    }

    #[test]
    fn lora_gradients_through_an_nf4_layer_equal_the_dense_dequantized_layer() -> Result<()> {
        let dev = Device::Cpu;
        let (nf4, dense) = nf4_and_dequantized(&random_layer(32, 48, 4, 2, 3, 13));
        let rope = Rope::new(8, 10000.0, 64, DType::F32, &dev)?;
        let x = Tensor::randn(0f32, 1.0, (2, 7, 32), &dev)?;
        let d_out = Tensor::randn(0f32, 1.0, (2, 7, 32), &dev)?;
        let mask = causal_mask(7, 7, 0, None, &dev)?;
        let input = LayerInput {
            rope: &rope,
            mask: Some(&mask),
            offset: 0,
            scores: ScoreRule::causal(8, None),
            dropout_seed: None,
            packed: None,
            mlp_tile_values: crate::model::layer::tiles::MLP_TILE_VALUES,
        };
        let (out_q, saved_q) = nf4.forward_saving(&x, &input)?;
        let (out_d, saved_d) = dense.forward_saving(&x, &input)?;
        assert_eq!(bits(&out_q), bits(&out_d));
        let (dx_q, grads_q) = nf4.backward(saved_q, &d_out, &input)?;
        let (dx_d, grads_d) = dense.backward(saved_d, &d_out, &input)?;
        assert_eq!(bits(&dx_q), bits(&dx_d));
        for (p, (gq, gd)) in grads_q.iter().zip(grads_d.iter()).enumerate() {
            let (gq, gd) = (gq.as_ref().unwrap(), gd.as_ref().unwrap());
            assert_eq!(bits(&gq.lora_a), bits(&gd.lora_a), "proj {p} A");
            assert_eq!(bits(&gq.lora_b), bits(&gd.lora_b), "proj {p} B");
        }
        // and the quantization changed the layer: NF4 is not a silent no-op
        let (out_orig, _) = random_layer(32, 48, 4, 2, 3, 13).forward_saving(&x, &input)?;
        assert_ne!(bits(&out_orig), bits(&out_q));
        Ok(())
    }
}

#[cfg(all(test, feature = "cuda"))]
#[path = "linear_gemv_tests.rs"]
mod gemv_tests;
