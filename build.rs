//! With `--features cuda`, compiles each src/cuda/*.cu with nvcc (found through `$NVCC`,
//! `$CUDA_ROOT/bin` or `PATH`) to one fatbin (`$OUT_DIR/<name>.fatbin`, loaded by
//! src/cuda/module.rs): machine code for sm_80, sm_86, sm_89, sm_90, sm_100 and sm_120 (the
//! GPUs users train on: A100, RTX 3090/A6000, RTX 4090/L40, H100/H200, B200, RTX 5090; a GPU of a
//! listed major runs the code of the nearest listed minor below it), and compute_80 PTX that the
//! driver compiles only for a GPU none of those fit. `LORA_FT_CUDA_ARCHS=90` (a comma-separated
//! list) builds fewer, for a quicker development build. The NF4 kernels (and the NF4 GEMV and
//! GEMM, which decode weights as they do) and the 8-bit AdamW step get `--use_fast_math`, as
//! bitsandbytes' build does, which bit-exactness with its NF4 codes and 8-bit optimizer state
//! needs.
//!
//! It also compiles the eight modules of candle-kernels a training step loads (affine, binary,
//! cast, fill, indexing, reduce, ternary, unary; from its source in the cargo registry, or
//! `LORA_FT_CANDLE_KERNELS_SRC`) to `candle_<name>.fatbin` with the flags candle's build uses:
//! src/cuda/candle_modules.rs loads them in place of candle's PTX.
//!
//! With the cuDNN and cudnn-frontend headers (`CUDNN_INCLUDE`: a `:`-separated list of include
//! folders, as scripts/cuda-toolchain.sh exports it) it also compiles src/cuda/cudnn_sdpa.cpp and
//! sets `cfg(lora_ft_cudnn)`; cuDNN itself is opened when the program runs. Without them the
//! build has the flash kernels only.
use std::path::{Path, PathBuf};
use std::process::Command;

/// Architectures with machine code in every fatbin (`LORA_FT_CUDA_ARCHS` overrides).
const ARCHS: &str = "80,86,89,90,100,120";

/// The kernels of src/cuda/, each compiled to `$OUT_DIR/<name>.fatbin`.
const KERNELS: [&str; 16] = [
    "nf4",
    "nf4_gemv",
    "nf4_gemm",
    "adafactor",
    "adamw",
    "adamw8bit",
    "softmax",
    "flash_attention",
    "elementwise",
    "dropout",
    "cross_entropy",
    "embedding",
    "rope",
    "lora_weights",
    "decode_attention",
    "greedy",
];
const CUDA_HEADERS: [&str; 7] = [
    "src/cuda/dtype.cuh",
    "src/cuda/nf4_segments.cuh",
    "src/cuda/nf4_tables.cuh",
    "src/cuda/block_reduce.cuh",
    "src/cuda/mma.cuh",
    "src/cuda/flash_common.cuh",
    "src/cuda/flash_backward.cuh",
];

fn main() {
    for source in KERNELS.iter().map(|k| format!("src/cuda/{k}.cu")).chain(CUDA_HEADERS.map(String::from)) {
        println!("cargo:rerun-if-changed={source}");
    }
    println!("cargo:rerun-if-env-changed=LORA_FT_CUDA_ARCHS");
    println!("cargo:rerun-if-env-changed=CUDNN_INCLUDE");
    println!("cargo:rerun-if-changed=src/cuda/cudnn_sdpa.cpp");
    println!("cargo:rustc-check-cfg=cfg(lora_ft_cudnn)");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let archs = std::env::var("LORA_FT_CUDA_ARCHS").unwrap_or_else(|_| ARCHS.into());
    let archs: Vec<&str> = archs.split(',').map(str::trim).filter(|a| !a.is_empty()).collect();
    let nvcc = std::env::var("NVCC")
        .ok()
        .or_else(|| std::env::var("CUDA_ROOT").ok().map(|r| format!("{r}/bin/nvcc")));
    let nvcc = nvcc.unwrap_or_else(|| "nvcc".into());
    for kernel in KERNELS {
        let src = format!("src/cuda/{kernel}.cu");
        // as bitsandbytes builds its kernels: the NF4 ones and the 8-bit optimizer's
        let flags: &[&str] = if matches!(kernel, "nf4" | "nf4_gemv" | "nf4_gemm" | "adamw8bit") {
            &["--use_fast_math"]
        } else {
            &[]
        };
        compile_fatbin(&nvcc, (&archs, None), &src, &out.join(format!("{kernel}.fatbin")), flags);
    }
    let candle = candle_kernels_src();
    println!("cargo:rerun-if-env-changed=LORA_FT_CANDLE_KERNELS_SRC");
    for module in CANDLE_MODULES {
        let src = candle.join(format!("{module}.cu"));
        let fatbin = out.join(format!("candle_{module}.fatbin"));
        // candle's flags, and every architecture's code from the compute_80 PTX, as the driver
        // would have made it from candle's own PTX
        let flags = ["--expt-relaxed-constexpr", "-std=c++17"];
        compile_fatbin(&nvcc, (&archs, Some("80")), &src.to_string_lossy(), &fatbin, &flags);
    }
    compile_cudnn_shim();
}

/// candle-kernels' modules that a training step loads (src/cuda/candle_modules.rs).
const CANDLE_MODULES: [&str; 8] =
    ["affine", "binary", "cast", "fill", "indexing", "reduce", "ternary", "unary"];

/// The `src` folder of the candle-kernels version in Cargo.lock, in the cargo registry
/// (`$CARGO_HOME`, default ~/.cargo), or `LORA_FT_CANDLE_KERNELS_SRC`.
fn candle_kernels_src() -> PathBuf {
    if let Ok(dir) = std::env::var("LORA_FT_CANDLE_KERNELS_SRC") {
        return PathBuf::from(dir);
    }
    let lock = std::fs::read_to_string("Cargo.lock").expect("reading Cargo.lock");
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"candle-kernels\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_string())
        .expect("candle-kernels in Cargo.lock");
    let home = std::env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cargo"));
    let registry = home.join("registry").join("src");
    let found = std::fs::read_dir(&registry).ok().into_iter().flatten().flatten().find_map(|index| {
        let src = index.path().join(format!("candle-kernels-{version}")).join("src");
        src.join("binary.cu").exists().then_some(src)
    });
    found.unwrap_or_else(|| {
        panic!(
            "candle-kernels {version}'s source is not under {} (set LORA_FT_CANDLE_KERNELS_SRC)",
            registry.display()
        )
    })
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

/// One fatbin of `src` with machine code for `archs` and compute_80 PTX; `flags` beside -O3
/// (`--use_fast_math` only for the kernels that match bitsandbytes': NF4, 8-bit AdamW). With a
/// `virtual_arch`, every architecture's code is compiled from that one PTX (else each from its
/// own). nvcc compiles the architectures on two threads.
fn compile_fatbin(
    nvcc: &str,
    (archs, virtual_arch): (&[&str], Option<&str>),
    src: &str,
    fatbin: &Path,
    flags: &[&str],
) {
    let mut args: Vec<String> = vec!["--fatbin".into(), "-O3".into(), "--threads".into(), "2".into()];
    args.extend(flags.iter().map(|f| f.to_string()));
    for arch in archs {
        let from = virtual_arch.unwrap_or(arch);
        args.push(format!("-gencode=arch=compute_{from},code=sm_{arch}"));
    }
    args.push("-gencode=arch=compute_80,code=compute_80".into());
    let status = Command::new(nvcc)
        .args(&args)
        .arg("-o")
        .arg(fatbin)
        .arg(src)
        .status()
        .unwrap_or_else(|e| panic!("running {nvcc} for {src}: {e} (set NVCC or CUDA_ROOT)"));
    assert!(status.success(), "{nvcc} failed on {src}");
}
