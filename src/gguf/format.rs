//! The GGUF format as llama.cpp writes and reads it, for both directions: the container (typed
//! metadata, the streamed writer, each tensor type's bytes) and its standardized names (tensor
//! names and the Q/K row order, Llama 3's `rope_freqs`, token types and pre-tokenizers). What
//! tells the families apart in a file is their declarations' (`crate::arch::families`).

pub mod kquants;
pub(super) mod metadata;
pub(super) mod qk_permutation;
pub mod quants;
pub(super) mod rope_freqs;
pub(super) mod tensor_names;
pub(super) mod vocab;
pub mod writer;
