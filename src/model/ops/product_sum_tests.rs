//! `ProductSum` against the composed matmuls, on the CPU and (with CUDA) the GPU.

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
        (((h.matmul(&b.t().unwrap()).unwrap() + &res).unwrap() + x.matmul(&w.t().unwrap()).unwrap()).unwrap()
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
