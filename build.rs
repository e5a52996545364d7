//! With `--features cuda`, compiles src/{quant,model,optim}/kernels/*.cu to PTX with nvcc (found through
//! `$NVCC`, `$CUDA_ROOT/bin` or `PATH`). The PTX targets `compute_$CUDA_COMPUTE_CAP` (default 80:
//! Ampere and newer, including the 24 GB RTX 3090/4090 cards); the driver JIT-compiles it once
//! and caches it. The NF4 kernels get `--use_fast_math`, as bitsandbytes' build does, which NF4
//! bit-exactness needs.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/quant/kernels");
    println!("cargo:rerun-if-changed=src/model/kernels");
    println!("cargo:rerun-if-changed=src/kernels");
    println!("cargo:rerun-if-changed=src/optim/kernels");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let nvcc = std::env::var("NVCC")
        .ok()
        .or_else(|| std::env::var("CUDA_ROOT").ok().map(|r| format!("{r}/bin/nvcc")));
    let nvcc = nvcc.unwrap_or_else(|| "nvcc".into());
    compile_ptx(&nvcc, &cap, "src/quant/kernels/nf4.cu", &out.join("nf4.ptx"), true);
    for kernel in ["softmax", "flash_attention", "elementwise", "dropout", "cross_entropy", "embedding"] {
        let src = format!("src/model/kernels/{kernel}.cu");
        compile_ptx(&nvcc, &cap, &src, &out.join(format!("{kernel}.ptx")), false);
    }
    compile_ptx(&nvcc, &cap, "src/optim/kernels/adafactor.cu", &out.join("adafactor.ptx"), false);
}

/// `fast_math`: only for the NF4 kernels, to match bitsandbytes' build.
fn compile_ptx(nvcc: &str, cap: &str, src: &str, ptx: &Path, fast_math: bool) {
    let mut args = vec!["--ptx", "-O3"];
    if fast_math {
        args.push("--use_fast_math");
    }
    let arch = format!("-arch=compute_{cap}");
    let status = Command::new(nvcc)
        .args(&args)
        .args([arch.as_str(), "-o"])
        .arg(ptx)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("running {nvcc} for {src}: {e} (set NVCC or CUDA_ROOT)"));
    assert!(status.success(), "{nvcc} failed on {src}");
}
