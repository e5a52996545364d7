//! A Hugging Face model (config.json, tokenizer files, safetensors weights) → one GGUF file, as
//! llama.cpp's `convert_hf_to_gguf.py` writes it, and the Ollama Modelfile beside it. What the
//! file holds is `GgufModel`'s; `merge/to_gguf.rs` (`lora-ft export-gguf`) folds the adapter in
//! and streams the tensors through `format::writer`.

mod file_type;
mod hf_model;
mod hparams;
mod model;
pub mod modelfile;
mod q4km;
mod vocab;
mod vocab_spm;

pub use file_type::FileType;
pub use model::{GgufModel, Planned};
