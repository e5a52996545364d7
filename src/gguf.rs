//! llama.cpp's GGUF files, both ways: `import` reads one into a Hugging Face folder (`lora-ft
//! import`, and any `.gguf` model source), `export` writes a Hugging Face model as one
//! (`lora-ft export-gguf`, run from `merge/to_gguf.rs`). `format` is what both share: the file's
//! metadata reader and writer, its tensor types and quantizers, and the names and conventions
//! llama.cpp gives architectures, tensors and tokens.

pub mod export;
pub mod format;
pub mod import;

pub use import::{import_gguf, read_configs, ImportSummary};
