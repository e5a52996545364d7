//! The declaration of one decoder family: what config.json calls it and how its keys map onto
//! `Architecture`, what llama.cpp calls it and how its GGUF files differ, its tokenizer default and
//! what `lora-ft init` writes for it. Each family's declaration is one file of `families/`; code
//! elsewhere branches on these properties, never on a family's name.

use anyhow::Result;
use serde_json::Value as Json;

use super::config::ModelConfig;
use super::description::Architecture;
use super::gguf_header::GgufHeader;

/// One family.
pub struct Family {
    /// config.json's `architectures[0]`: the Hugging Face class.
    pub class: &'static str,
    /// config.json's `model_type` values of this family; the GGUF import writes the first.
    pub model_types: &'static [&'static str],
    /// config.json → `Architecture`, starting from `Architecture::llama`.
    pub describe: fn(&ModelConfig) -> Result<Architecture>,
    /// `tie_word_embeddings` where config.json leaves it out (transformers' config class default).
    pub tied_by_default: bool,
    /// The family in llama.cpp's GGUF files.
    pub gguf: Gguf,
    /// `tokenizer.ggml.add_space_prefix` as llama.cpp's converter writes it for this family.
    pub space_prefix: SpacePrefix,
    /// What `lora-ft init` writes for this family.
    pub training: Training,
}

/// How a family's GGUF files differ: names, tensor conventions, and the rules that read their
/// `<arch>.*` keys back into config.json.
pub struct Gguf {
    /// `general.architecture` read as this family: the prefix of its `<arch>.*` keys.
    pub name: &'static str,
    /// Also read from a file whose `general.architecture` is `.0` and whose `general.name`
    /// contains `.1`, as transformers' loader decides (Mistral from "llama").
    pub also_read_from: Option<(&'static str, &'static str)>,
    /// `general.architecture` the export writes (llama.cpp writes Mistral as "llama").
    pub written_as: &'static str,
    /// The `convert_hf_to_gguf.py` class whose `<arch>.*` keys and checks the export follows.
    pub converter: Converter,
    /// Q and K rows permuted as llama.cpp's llama graph wants them (`LlamaModel.permute`).
    pub permutes_qk: bool,
    /// Added to every stored `*norm.weight` (Gemma's (1 + w) norms are written as w + 1).
    pub stored_norm_offset: f32,
    /// Which per-layer tensors its files hold beyond the Llama decoder's.
    pub tensors: Tensors,
    /// Where the import reads head_dim from.
    pub head_dim: HeadDim,
    /// The RoPE base where the file states none (the transformers config class's default).
    pub default_rope_theta: f64,
    /// `rope_parameters` per layer kind, the local one based on `rope.freq_base_swa` (Gemma 3).
    pub rope_per_layer_kind: bool,
    /// Writes the family's own config.json keys from the file's metadata, beyond the sizes, RoPE
    /// and token ids the import writes for every family.
    pub import: fn(&GgufHeader, &mut Json) -> Result<()>,
}

/// The llama.cpp converter class (`convert_hf_to_gguf.py`) that writes a family's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Converter {
    /// `LlamaModel`: the `llama.*` keys, Q/K rows permuted, linear and Llama 3 RoPE scaling
    /// (`rope_freqs`); a sliding window is dropped with a warning.
    Llama,
    /// `TextModel.set_gguf_parameters` (`Qwen2Model`, `Qwen3Model`): no sliding window.
    Text,
    /// `Gemma2Model`: its own keys, no `output.weight`.
    Gemma2,
    /// `Gemma3Model`: TextModel's keys and its own, for the text model only.
    Gemma3,
}

/// Per-layer tensors beside the Llama decoder's, in llama.cpp's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tensors {
    /// `post_attention_norm` and `post_ffw_norm`, and `ffn_norm` as the norm before the MLP.
    pub post_norms: bool,
    /// `attn_q_norm` and `attn_k_norm`.
    pub qk_norm: bool,
    /// `attn_q.bias`, `attn_k.bias` and `attn_v.bias`.
    pub qkv_bias: bool,
}

/// Where a GGUF file's head_dim comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadDim {
    /// `rope.dimension_count`, as transformers maps it for llama and mistral.
    RopeDimensionCount,
    /// hidden / heads: the config class has no head_dim, and a `key_length` that differs is
    /// refused.
    HiddenOverHeads,
    /// `attention.key_length` (llama.cpp's n_embd_head_k).
    KeyLength,
}

/// `tokenizer.ggml.add_space_prefix` of a SentencePiece vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpacePrefix {
    /// Written false (Gemma's converters).
    Off,
    /// The tokenizer config's `add_prefix_space`, where it has one.
    FromTokenizerConfig,
    /// Not written.
    Unwritten,
}

/// What `lora-ft init` writes for a family.
pub struct Training {
    /// `train.compute_dtype`.
    pub compute_dtype: &'static str,
    /// Why, where it is not f16 (a comment in the written config).
    pub compute_dtype_reason: Option<&'static str>,
    /// The family's chat template refuses a system role: `data.system_message = "fold"`.
    pub folds_system_message: bool,
}
