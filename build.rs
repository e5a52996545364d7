//! With `--features cuda`, compiles src/cuda/*.cu to PTX with nvcc (found through
//! `$NVCC`, `$CUDA_ROOT/bin` or `PATH`). The PTX targets `compute_$CUDA_COMPUTE_CAP` (default 80:
//! Ampere and newer, including the 24 GB RTX 3090/4090 cards); the driver JIT-compiles it once
//! and caches it. The NF4 kernels and the 8-bit AdamW step get `--use_fast_math`, as
//! bitsandbytes' build does, which bit-exactness with its NF4 codes and 8-bit optimizer state needs.
//!
//! With the cuDNN and cudnn-frontend headers (`CUDNN_INCLUDE`: a `:`-separated list of include
//! folders, as scripts/cuda-toolchain.sh exports it) it also compiles src/cuda/cudnn_sdpa.cpp and
//! sets `cfg(lora_ft_cudnn)`; cuDNN itself is opened when the program runs. Without them the
//! build has the flash kernels only.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernels of src/cuda/, each compiled to `$OUT_DIR/<name>.ptx`.
const KERNELS: [&str; 10] = [
    "nf4",
    "adafactor",
    "adamw",
    "adamw8bit",
    "softmax",
    "flash_attention",
    "elementwise",
    "dropout",
    "cross_entropy",
    "embedding",
];
const CUDA_HEADERS: [&str; 5] = [
    "src/cuda/dtype.cuh",
    "src/cuda/block_reduce.cuh",
    "src/cuda/mma.cuh",
    "src/cuda/flash_common.cuh",
    "src/cuda/flash_backward.cuh",
];

fn main() {
    for source in KERNELS.iter().map(|k| format!("src/cuda/{k}.cu")).chain(CUDA_HEADERS.map(String::from)) {
        println!("cargo:rerun-if-changed={source}");
    }
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDNN_INCLUDE");
    println!("cargo:rerun-if-changed=src/cuda/cudnn_sdpa.cpp");
    println!("cargo:rustc-check-cfg=cfg(lora_ft_cudnn)");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let nvcc = std::env::var("NVCC")
        .ok()
        .or_else(|| std::env::var("CUDA_ROOT").ok().map(|r| format!("{r}/bin/nvcc")));
    let nvcc = nvcc.unwrap_or_else(|| "nvcc".into());
    for kernel in KERNELS {
        let src = format!("src/cuda/{kernel}.cu");
        // as bitsandbytes builds its kernels: the NF4 ones and the 8-bit optimizer's
        let fast_math = matches!(kernel, "nf4" | "adamw8bit");
        compile_ptx(&nvcc, &cap, &src, &out.join(format!("{kernel}.ptx")), fast_math);
    }
    compile_cudnn_shim();
}

/// The cuDNN attention shim, where the headers are given; dynamic loading keeps cuDNN, cudart and
/// NVRTC out of the link.
fn compile_cudnn_shim() {
    let Ok(includes) = std::env::var("CUDNN_INCLUDE") else {
        println!("cargo:warning=CUDNN_INCLUDE unset: building without cuDNN attention (see scripts/cuda-toolchain.sh)");
        return;
    };
    let mut build = cc::Build::new();
    build.cpp(true).std("c++17").opt_level(2).file("src/cuda/cudnn_sdpa.cpp").warnings(false);
    for dir in includes.split(':').filter(|d| !d.is_empty()) {
        build.include(dir);
    }
    if let Ok(root) = std::env::var("CUDA_ROOT") {
        build.include(format!("{root}/include"));
    }
    build.compile("lora_ft_cudnn_sdpa");
    println!("cargo:rustc-link-lib=dylib=dl");
    println!("cargo:rustc-cfg=lora_ft_cudnn");
}

/// `fast_math`: only for the kernels that match bitsandbytes' (NF4, 8-bit AdamW), as its build.
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
