//! Loading kernels without compiling them at run time. build.rs compiles each of our `.cu` files
//! to one fatbin holding machine code (SASS) for the GPUs users train on — sm_80 (A100, A30),
//! sm_86 (RTX 3090, A6000, A10), sm_89 (RTX 4090, L4, L40), sm_90 (H100, H200), sm_100 (B200) and
//! sm_120 (RTX 5090); a GPU runs the code of the nearest listed minor version below its own in
//! the same major — plus compute_80 PTX, which the driver compiles only on a GPU none of those
//! fit. Loading a fatbin on a listed GPU compiles nothing, so a fresh machine (an empty driver JIT
//! cache) loads the kernels in milliseconds.
//!
//! candle's own kernels ship as PTX only; `candle_modules.rs` loads the ones a training step uses
//! from fatbins of the same source instead.

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

/// Every fatbin of the build, for `lora-ft bench kernels`.
pub fn all() -> [&'static Kernels; 12] {
    use super::*;
    [
        &nf4::KERNELS,
        &nf4_gemv::KERNELS,
        &nf4_gemm::KERNELS,
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

/// How long each load took: ours from their fatbins, candle's through candle's own module store
/// (from our fatbins of its source, which `candle_modules` swaps in for its PTX: `kind` says
/// whether it did).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadTime {
    pub module: String,
    /// "fatbin": machine code where the GPU is listed, else the fatbin's compute_80 PTX;
    /// `bytes`: the fatbin's, or for candle's modules the PTX's they stand for.
    pub kind: &'static str,
    pub bytes: usize,
    pub ms: f64,
}

/// Loads candle's step modules into candle's store, in the order a step first needs them.
pub fn load_candle(dev: &CudaDevice) -> Result<Vec<LoadTime>> {
    super::candle_modules::step_modules()
        .into_iter()
        .map(|s| {
            let (t, swapped) = (Instant::now(), super::candle_modules::swapped());
            dev.get_or_load_func(s.kernel, s.module)?;
            let kind = if super::candle_modules::swapped() > swapped { "fatbin" } else { "ptx" };
            Ok(LoadTime { module: s.name.into(), kind, bytes: s.module.ptx().len(), ms: ms(t) })
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

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
