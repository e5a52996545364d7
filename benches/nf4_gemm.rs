//! The NF4 GEMM (`quant::nf4_gemm`, tensor cores) against the path it replaces for batches of 9
//! to 256 rows — the dequantize kernel's 16-bit weight, then one cuBLAS GEMM (`Product::nt`, as
//! the forward runs it) — on Llama-3.1-8B's projection shapes (q/o 4096×4096, k/v 1024×4096,
//! gate/up 14336×4096, down 4096×14336) at 16, 32, 64, 128 and 256 rows, bf16, double-quantized
//! absmax (as `lora-ft` quantizes by default). Prints µs per call, the GB/s of weight bytes each
//! reads (packed codes + absmax: the least a step must read; the old path's own traffic is three
//! times that and more), the GEMM's TFLOP/s (2·m·out·in per call) and the speedup. Each timing is
//! the mean over ITERS back-to-back calls between two device synchronizations.
//!
//!   cargo bench --features cuda --bench nf4_gemm [-- ITERS]

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("the nf4_gemm bench times CUDA kernels: build it with --features cuda");
}

#[cfg(feature = "cuda")]
fn main() {
    if let Err(e) = gpu::run() {
        eprintln!("nf4_gemm bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::time::Instant;

    use candle_core::{DType, Device, Result, Tensor};
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
                eprintln!("the nf4_gemm bench needs a GPU: {e}");
                return Ok(());
            }
        };
        // the launch overhead of training and chat, not the tests'
        lora_ft::cuda::order_by_stream(&dev);
        let dtype = DType::BF16;
        println!("NF4 GEMM vs dequantize + GEMM, {dtype:?}, double-quantized absmax, mean of {iters} calls");
        println!(
            "{:>12} {:>4} | {:>9} {:>7} {:>7} | {:>9} {:>7} | {:>7}",
            "[out, in]", "m", "GEMM µs", "GB/s", "TFLOP/s", "old µs", "GB/s", "speedup"
        );
        for (out_dim, in_dim) in [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)] {
            let w = Tensor::randn(0f32, 0.02, (out_dim, in_dim), &dev)?;
            let q = Nf4Tensor::quantize(&w, true)?;
            let gb = q.size_in_bytes() as f64 / 1e9;
            for m in [16, 32, 64, 128, 256] {
                let x = Tensor::randn(0f32, 1.0, (m, in_dim), &dev)?.to_dtype(dtype)?;
                let gemm = time(&dev, iters, || nf4_gemm(&x, &q).map(drop))?;
                let old = time(&dev, iters, || {
                    let w16 = q.dequantize(dtype)?;
                    Product::nt(&x, &w16).eval().map(drop)
                })?;
                let flop = 2.0 * (m * out_dim * in_dim) as f64;
                println!(
                    "{:>12} {m:>4} | {:>9.1} {:>7.0} {:>7.1} | {:>9.1} {:>7.0} | {:>6.2}x",
                    format!("{out_dim}x{in_dim}"),
                    gemm * 1e6,
                    gb / gemm,
                    flop / gemm / 1e12,
                    old * 1e6,
                    gb / old,
                    old / gemm
                );
            }
        }
        Ok(())
    }
}
