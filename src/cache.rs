//! Where lora-ft keeps what it fetches and converts (a `.gguf` model source's import, the demo
//! model): `$LORA_FT_CACHE`, else `~/.cache/lora-ft`.

use std::path::PathBuf;

/// `$LORA_FT_CACHE`, or `~/.cache/lora-ft`.
pub fn dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LORA_FT_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("lora-ft")
}
