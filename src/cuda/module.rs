//! Loading kernels without compiling them at run time. build.rs compiles each of our `.cu` files
//! to one fatbin holding machine code (SASS) for the GPUs users train on — sm_80 (A100, A10/A30
//! via its binary compatibility with 8.x), sm_86 (RTX 3090, A6000), sm_89 (RTX 4090, L4, L40),
//! sm_90 (H100, H200), sm_100 (B200) and sm_120 (RTX 5090) — plus compute_80 PTX, which the
//! driver compiles only on a GPU none of those fit. Loading a fatbin on a listed GPU is a copy,
//! not a compilation: the first step of a fresh machine (an empty driver JIT cache) runs as fast
//! as a warm one's.
//!
//! candle's own kernels ship as PTX only; `candle_modules.rs` loads the ones a training step uses
//! from fatbins of the same source instead. `warm` loads all of them on a background thread as
//! soon as the device is open, while the model loads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchArgs};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, Result};

/// One `.cu` file's kernels, as build.rs compiled them.
pub struct Kernels {
    /// `lora_ft_<file>`, for error messages and the load cache.
    pub name: &'static str,
    /// The fatbin: SASS per architecture and the compute_80 PTX.
    image: &'static [u8],
}

/// The kernels of `src/cuda/<file>.cu`.
macro_rules! kernels {
    ($file:literal) => {
        $crate::cuda::module::Kernels::new(
            concat!("lora_ft_", $file),
            include_bytes!(concat!(env!("OUT_DIR"), "/", $file, ".fatbin")),
        )
    };
}
pub(crate) use kernels;

/// A kernel ready to launch on the device's stream.
pub struct Kernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Kernel {
    pub fn builder(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }
}

impl std::ops::Deref for Kernel {
    type Target = CudaFunction;

    fn deref(&self) -> &CudaFunction {
        &self.func
    }
}

type Slot = Arc<OnceLock<std::result::Result<Arc<CudaModule>, String>>>;

/// Modules loaded per (device ordinal, module name); a module holds its context alive.
static LOADED: OnceLock<Mutex<HashMap<(usize, &'static str), Slot>>> = OnceLock::new();

impl Kernels {
    pub const fn new(name: &'static str, image: &'static [u8]) -> Self {
        Self { name, image }
    }

    /// Bytes of the fatbin.
    pub fn image_bytes(&self) -> usize {
        self.image.len()
    }

    /// The kernel `name` of this file on `dev` (the module is loaded once per device; a second
    /// thread asking while it loads waits for the first).
    pub fn function(&self, dev: &CudaDevice, name: &str) -> Result<Kernel> {
        let module = self.module(dev)?;
        let func = module.load_function(name).w()?;
        Ok(Kernel { func, stream: dev.cuda_stream() })
    }

    /// The module on `dev`, loading it on first use.
    pub fn module(&self, dev: &CudaDevice) -> Result<Arc<CudaModule>> {
        let stream = dev.cuda_stream();
        let ctx = stream.context();
        let slot: Slot = {
            let mut loaded = LOADED.get_or_init(Default::default).lock().expect("the load cache's lock");
            loaded.entry((ctx.ordinal(), self.name)).or_default().clone()
        };
        let loaded = slot.get_or_init(|| {
            // cuModuleLoadData takes the image as it is; a Vec gives it an allocation's alignment
            ctx.load_module(Ptx::from_binary(self.image.to_vec())).map_err(|e| format!("{e:?}"))
        });
        loaded
            .clone()
            .map_err(|e| candle_core::Error::Msg(format!("loading the CUDA kernels {}: {e}", self.name)))
    }
}

/// Every fatbin of the build, for `lora-ft bench kernels` and `warm`.
pub fn all() -> [&'static Kernels; 10] {
    use super::*;
    [
        &nf4::KERNELS,
        &adafactor::KERNELS,
        &adamw::KERNELS,
        &adamw::KERNELS_8BIT,
        &softmax::KERNELS,
        &flash::KERNELS,
        &elementwise::KERNELS,
        &dropout::KERNELS,
        &cross_entropy::KERNELS,
        &mapped::KERNELS,
    ]
}

/// candle's modules that a training step loads (binary and unary ops, casts, fills, affine
/// maps, reductions, index ops, where_cond), each with one of its kernels' names. Left out:
/// conv, quantized (GGUF matmuls), sort — the training step calls none of them.
pub fn candle_modules() -> [(&'static str, &'static candle_kernels::Module, &'static str); 8] {
    use candle_kernels as k;
    [
        ("cast", &k::CAST, "cast_f32_f16"),
        ("fill", &k::FILL, "fill_f32"),
        ("affine", &k::AFFINE, "affine_f32"),
        ("binary", &k::BINARY, "badd_f32"),
        ("unary", &k::UNARY, "ucopy_f32"),
        ("reduce", &k::REDUCE, "fast_sum_f32"),
        ("indexing", &k::INDEXING, "is_u32_f32"),
        ("ternary", &k::TERNARY, "where_u8_f32"),
    ]
}

/// How long each load took: ours from their fatbins, candle's through candle's own module store
/// (from our fatbins of its source where `candle_modules` swaps them in, else compiled from PTX).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadTime {
    pub module: String,
    /// "fatbin" (machine code where the GPU is listed) or "ptx" (compiled by the driver);
    /// `bytes`: the fatbin's, or for candle's modules the PTX's they stand for.
    pub kind: &'static str,
    pub bytes: usize,
    pub ms: f64,
}

/// Loads candle's step modules into candle's store, in the order a step first needs them.
pub fn load_candle(dev: &CudaDevice) -> Result<Vec<LoadTime>> {
    candle_modules()
        .into_iter()
        .map(|(module, m, func)| {
            let t = Instant::now();
            dev.get_or_load_func(func, m)?;
            let kind = if super::candle_modules::swapped(m.ptx()) { "fatbin" } else { "ptx" };
            Ok(LoadTime { module: module.into(), kind, bytes: m.ptx().len(), ms: ms(t) })
        })
        .collect()
}

/// Loads every fatbin of ours.
pub fn load_ours(dev: &CudaDevice) -> Result<Vec<LoadTime>> {
    all()
        .into_iter()
        .map(|k| {
            let t = Instant::now();
            k.module(dev)?;
            Ok(LoadTime { module: k.name.into(), kind: "fatbin", bytes: k.image_bytes(), ms: ms(t) })
        })
        .collect()
}

/// Loads candle's step modules and ours on a background thread (`train` and `bench train` call
/// it as soon as the device is open): the driver's PTX compilation of candle's modules overlaps
/// the model's load instead of stalling the first step. A failure here is left for the real
/// load to report.
pub fn warm(dev: &CudaDevice) {
    let dev = dev.clone();
    let spawned = std::thread::Builder::new().name("warm-kernels".into()).spawn(move || {
        let t = Instant::now();
        let candle = load_candle(&dev);
        let ours = load_ours(&dev);
        match (candle, ours) {
            (Ok(_), Ok(_)) => tracing::debug!("kernels loaded in the background in {:.0} ms", ms(t)),
            (Err(e), _) | (_, Err(e)) => tracing::debug!("loading kernels in the background: {e}"),
        }
    });
    if let Err(e) = spawned {
        tracing::debug!("no thread to load kernels on: {e}");
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
