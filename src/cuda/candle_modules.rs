//! candle's kernels as machine code. candle-kernels ships its modules as PTX only, and candle-core
//! hands that text to the driver (`cuModuleLoadData`), which compiles it at the first use of each
//! module: with an empty JIT cache that is most of a fresh machine's first step (`lora-ft bench
//! kernels`; timings in benches/code_notes.md).
//!
//! build.rs compiles the same eight `.cu` files of candle-kernels (from its source in the cargo
//! registry) to fatbins with machine code for our architectures, as it does our own kernels. This
//! module defines `cuModuleLoadData`, which the executable's calls (cudarc's, candle's) bind to
//! ahead of the driver's: an image that is byte for byte one of those modules' PTX is swapped
//! for its fatbin, every other image goes to the driver as it is. The kernels and their names are
//! the same, compiled by the same nvcc from the same source, so nothing else changes; a GPU the
//! fatbins have no machine code for compiles their compute_80 PTX as before.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use candle_core::cuda_backend::cudarc::driver::sys::{CUmodule, CUresult};

/// A fatbin, aligned as the driver reads it.
#[repr(C, align(64))]
pub struct Aligned<T: ?Sized>(pub T);

/// The fatbin build.rs made of `candle-kernels/src/<file>.cu`.
macro_rules! candle_fatbin {
    ($file:literal) => {
        &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/candle_", $file, ".fatbin")))
    };
}

/// One of candle's modules a training step loads: its name, candle's module (PTX), one of its
/// kernels (to load it by), and our fatbin of its source.
pub struct StepModule {
    pub name: &'static str,
    pub module: &'static candle_kernels::Module,
    pub kernel: &'static str,
    fatbin: &'static [u8],
}

/// candle's modules that a training step loads (binary and unary ops, casts, fills, affine
/// maps, reductions, index ops, where_cond), in the order a step first needs them. Left out:
/// conv, quantized (GGUF matmuls), sort — the training step calls none of them. build.rs's
/// `CANDLE_MODULES` lists the same files.
pub fn step_modules() -> [StepModule; 8] {
    use candle_kernels as k;
    static AFFINE: &Aligned<[u8]> = candle_fatbin!("affine");
    static BINARY: &Aligned<[u8]> = candle_fatbin!("binary");
    static CAST: &Aligned<[u8]> = candle_fatbin!("cast");
    static FILL: &Aligned<[u8]> = candle_fatbin!("fill");
    static INDEXING: &Aligned<[u8]> = candle_fatbin!("indexing");
    static REDUCE: &Aligned<[u8]> = candle_fatbin!("reduce");
    static TERNARY: &Aligned<[u8]> = candle_fatbin!("ternary");
    static UNARY: &Aligned<[u8]> = candle_fatbin!("unary");
    let m = |name, module, kernel, fatbin: &'static Aligned<[u8]>| StepModule {
        name,
        module,
        kernel,
        fatbin: &fatbin.0,
    };
    [
        m("cast", &k::CAST, "cast_f32_f16", CAST),
        m("fill", &k::FILL, "fill_f32", FILL),
        m("affine", &k::AFFINE, "affine_f32", AFFINE),
        m("binary", &k::BINARY, "badd_f32", BINARY),
        m("unary", &k::UNARY, "ucopy_f32", UNARY),
        m("reduce", &k::REDUCE, "fast_sum_f32", REDUCE),
        m("indexing", &k::INDEXING, "is_u32_f32", INDEXING),
        m("ternary", &k::TERNARY, "where_u8_f32", TERNARY),
    ]
}

/// Our fatbin for `image` where it is one of candle's step modules' PTX (NUL-terminated text,
/// as candle passes it); `None` for anything else (a cubin, a fatbin, other PTX).
///
/// # Safety
/// `image` is what `cuModuleLoadData` takes: a NUL-terminated PTX text, or a cubin/fatbin image.
unsafe fn fatbin_for(image: *const c_void) -> Option<&'static [u8]> {
    if !unsafe { is_ptx(image) } {
        return None;
    }
    let text = unsafe { CStr::from_ptr(image as *const std::ffi::c_char) }.to_bytes();
    step_modules().into_iter().find(|s| s.module.ptx().as_bytes() == text).map(|s| s.fatbin)
}

/// Whether `image` is PTX text: it starts with a comment or a directive, where ELF cubins and
/// fatbins start with binary magic.
///
/// # Safety
/// As `fatbin_for`.
unsafe fn is_ptx(image: *const c_void) -> bool {
    let head = unsafe { std::slice::from_raw_parts(image as *const u8, 2) };
    head == b"//" || head[0] == b'.' || head[0].is_ascii_whitespace()
}

/// Modules loaded from our fatbins in place of candle's PTX, in this process.
static SWAPPED: AtomicUsize = AtomicUsize::new(0);
/// Other PTX images this process handed to the driver to compile, and the microseconds their
/// loads took: what is left of the JIT at a cold start (`bench train`'s `startup`).
static PTX_LOADS: AtomicUsize = AtomicUsize::new(0);
static PTX_LOAD_MICROS: AtomicUsize = AtomicUsize::new(0);

/// PTX modules the driver compiled for this process through `cuModuleLoadData` (candle's swapped
/// ones not counted), and the seconds their loads took.
pub fn ptx_loads() -> (usize, f64) {
    (PTX_LOADS.load(Ordering::Relaxed), PTX_LOAD_MICROS.load(Ordering::Relaxed) as f64 * 1e-6)
}

/// How many of candle's modules this process loaded from machine code (`bench kernels`, tests).
pub fn swapped() -> usize {
    SWAPPED.load(Ordering::Relaxed)
}

type LoadData = unsafe extern "C" fn(*mut CUmodule, *const c_void) -> CUresult;

/// The driver's own `cuModuleLoadData`, the next definition after this executable's.
fn driver_load_data() -> Option<LoadData> {
    static REAL: OnceLock<Option<LoadData>> = OnceLock::new();
    *REAL.get_or_init(|| {
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"cuModuleLoadData".as_ptr()) };
        (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, LoadData>(f) })
    })
}

/// `cuModuleLoadData` as the driver defines it, with candle's step modules loaded from machine
/// code. cudarc (built with `dynamic-linking`) calls it by this name; this definition in the
/// executable comes before libcuda's.
///
/// # Safety
/// The driver's contract: `module` points to writable storage for a handle, `image` to a module
/// image the driver accepts.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    let Some(load) = driver_load_data() else {
        return CUresult::CUDA_ERROR_NOT_FOUND;
    };
    match unsafe { fatbin_for(image) } {
        Some(fatbin) => {
            SWAPPED.fetch_add(1, Ordering::Relaxed);
            unsafe { load(module, fatbin.as_ptr() as *const c_void) }
        }
        None if unsafe { is_ptx(image) } => {
            let started = std::time::Instant::now();
            let result = unsafe { load(module, image) };
            PTX_LOADS.fetch_add(1, Ordering::Relaxed);
            PTX_LOAD_MICROS.fetch_add(started.elapsed().as_micros() as usize, Ordering::Relaxed);
            result
        }
        None => unsafe { load(module, image) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// candle's own load of a step module goes through this file's `cuModuleLoadData` and comes
    /// out of our fatbin (a build whose calls bypass it, e.g. cudarc's dynamic loading, fails here).
    #[test]
    fn cuda_candle_modules_load_from_machine_code() {
        let dev = candle_core::CudaDevice::new_with_stream(0).unwrap();
        let before = swapped();
        for s in step_modules() {
            dev.get_or_load_func(s.kernel, s.module).unwrap();
        }
        assert!(swapped() - before >= step_modules().len(), "every step module swapped");
        // and candle's ops run on them
        let x = candle_core::Tensor::arange(0f32, 8.0, &candle_core::Device::Cuda(dev)).unwrap();
        let y = ((&x + &x).unwrap().sum_all().unwrap()).to_scalar::<f32>().unwrap();
        assert_eq!(y, 56.0);
    }
}
