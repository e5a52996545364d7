//! The NF4 GEMV's three kernels (`cuda::nf4_gemv::Kernel`: CUDA cores, tensor cores, codebook
//! lookup) against the paths they replace for decode batches — the NF4 GEMM past 8 rows, and the
//! dequantize kernel's 16-bit weight then one cuBLAS GEMM (`Product::nt`, as the forward runs it)
//! — on Llama-3.1-8B's projection shapes (q/o 4096×4096, k/v 1024×4096, gate/up 14336×4096, down
//! 4096×14336) at 1 to 64 rows, bf16, double-quantized and plain absmax. Prints µs per call, the
//! GB/s of weight bytes each reads (packed codes + absmax: the least a decode step must read; the
//! old path's own traffic is three times that and more), and the lookup kernel's speedup over the
//! best of the others and over the old path. Each
//! timing is the mean over ITERS back-to-back calls between two device synchronizations.
//!
//!   cargo bench --features cuda --bench nf4_gemv [-- ITERS]

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("the nf4_gemv bench times CUDA kernels: build it with --features cuda");
}

#[cfg(feature = "cuda")]
fn main() {
    if let Err(e) = gpu::run() {
        eprintln!("nf4_gemv bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::time::Instant;

    use candle_core::{DType, Device, Result, Tensor};
    use lora_ft::cuda::nf4_gemv::{gemv_outputs_on, Kernel};
    use lora_ft::model::ops::product_sum::Product;
    use lora_ft::quant::{nf4_gemm, Nf4Tensor};

    /// Seconds per call of `f`: a warm-up, then the mean over `iters` calls queued back to back.
    fn time(dev: &Device, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        for _ in 0..10 {
            f()?;
        }
        dev.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        dev.synchronize()?;
        Ok(t0.elapsed().as_secs_f64() / iters as f64)
    }

    pub fn run() -> Result<()> {
        let iters: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(200).max(1);
        let dev = match Device::new_cuda(0) {
            Ok(dev) => dev,
            Err(e) => {
                eprintln!("the nf4_gemv bench needs a GPU: {e}");
                return Ok(());
            }
        };
        // the launch overhead of training and chat, not the tests'
        lora_ft::cuda::order_by_stream(&dev);
        let dtype = DType::BF16;
        println!(
            "NF4 GEMV kernels (CUDA cores, tensor cores, codebook lookup) vs the NF4 GEMM and dequantize + GEMM, \
             {dtype:?}, mean of {iters} calls (µs, GB/s of weight bytes; - where a kernel does not take the rows)"
        );
        println!(
            "{:>12} {:>6} {:>2} | {:>14} | {:>14} | {:>14} | {:>14} | {:>14} | {:>14} | {:>8} {:>8} {:>9}",
            "[out, in]",
            "absmax",
            "n",
            "lanes",
            "mma",
            "lut",
            "lut_gemm",
            "nf4_gemm",
            "old",
            "lut/best",
            "lut/old",
            "gemm/lut"
        );
        // NF4_GEMV_BENCH_SHAPES=28672x4096,4096x14336 and NF4_GEMV_BENCH_ROWS=8,64 narrow the
        // table (to profile one kernel on one shape)
        let list =
            |var: &str| std::env::var(var).ok().map(|v| v.split(',').map(str::to_owned).collect::<Vec<_>>());
        let shapes = list("NF4_GEMV_BENCH_SHAPES");
        let rows = list("NF4_GEMV_BENCH_ROWS");
        for (out_dim, in_dim) in
            [(4096, 4096), (1024, 4096), (6144, 4096), (14336, 4096), (28672, 4096), (4096, 14336)]
        {
            if shapes.as_ref().is_some_and(|s| !s.contains(&format!("{out_dim}x{in_dim}"))) {
                continue;
            }
            let w = Tensor::randn(0f32, 0.02, (out_dim, in_dim), &dev)?;
            for double_quant in [true, false] {
                let q = Nf4Tensor::quantize(&w, double_quant)?;
                let gb = q.size_in_bytes() as f64 / 1e9;
                for n in [1, 4, 8, 12, 16, 24, 32, 48, 64] {
                    if rows.as_ref().is_some_and(|r| !r.contains(&n.to_string())) {
                        continue;
                    }
                    let x = Tensor::randn(0f32, 1.0, (n, in_dim), &dev)?.to_dtype(dtype)?;
                    let on = |kernel: Kernel| -> Result<Option<f64>> {
                        if n > kernel.max_rows() {
                            return Ok(None);
                        }
                        let run = || -> Result<()> {
                            let segment = q.gemv_segment(&x).expect("the GEMV takes x");
                            gemv_outputs_on(kernel, &x, vec![segment]).map(drop)
                        };
                        time(&dev, iters, run).map(Some)
                    };
                    let lanes = on(Kernel::Lanes)?;
                    let mma = on(Kernel::TensorCores)?;
                    let lut = on(Kernel::Lookup)?.expect("the lookup kernel takes 64 rows");
                    let lut_gemm = on(Kernel::LookupGemm)?.expect("the lookup GEMM takes 64 rows");
                    let gemm = match n > 8 {
                        true => Some(time(&dev, iters, || nf4_gemm(&x, &q).map(drop))?),
                        false => None,
                    };
                    let old = time(&dev, iters, || {
                        let w16 = q.dequantize(dtype)?;
                        Product::nt(&x, &w16).eval().map(drop)
                    })?;
                    let cell = |t: Option<f64>| match t {
                        Some(t) => format!("{:>7.1} {:>6.0}", t * 1e6, gb / t),
                        None => format!("{:>14}", "-"),
                    };
                    let best = [lanes, mma, gemm].into_iter().flatten().fold(old, f64::min);
                    println!(
                        "{:>12} {:>6} {n:>2} | {} | {} | {} | {} | {} | {} | {:>7.2}x {:>7.2}x {:>8.2}x",
                        format!("{out_dim}x{in_dim}"),
                        if double_quant { "double" } else { "f32" },
                        cell(lanes),
                        cell(mma),
                        cell(Some(lut)),
                        cell(Some(lut_gemm)),
                        cell(gemm),
                        cell(Some(old)),
                        best / lut,
                        old / lut,
                        lut / lut_gemm
                    );
                }
            }
        }
        Ok(())
    }
}
