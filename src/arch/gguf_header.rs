//! What a family's GGUF import rules (`Gguf::import`, family.rs) read: the file's typed metadata,
//! through a trait the GGUF reader implements (this room may not import it), and the sizes read
//! before them; with the layer-kind helpers those rules share.

use anyhow::Result;
use serde_json::Value as Json;

/// Typed reading of a GGUF file's metadata keys; every error names the file and the key.
pub trait GgufKeys {
    fn opt_uint(&self, key: &str) -> Result<Option<u64>>;
    fn opt_float(&self, key: &str) -> Result<Option<f64>>;
    /// A per-layer array of flags (bools, or integers where nonzero is true) of `layers` entries;
    /// `None` where the key is absent, an error where it holds anything else.
    fn layer_flags(&self, key: &str, layers: usize) -> Result<Option<Vec<bool>>>;
}

/// A GGUF model file's metadata as a family's import rules see it.
pub struct GgufHeader<'a> {
    pub keys: &'a dyn GgufKeys,
    /// `general.architecture` as the file states it, the prefix of its model keys.
    pub prefix: &'a str,
    pub hidden: u64,
    pub heads: usize,
    pub layers: u64,
    pub head_dim: u64,
    pub sliding_window: Option<u64>,
}

impl GgufHeader<'_> {
    /// The model key `<prefix>.name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    /// Which layers slide, as llama.cpp's `load_swa_pattern` reads
    /// `attention.sliding_window_pattern`: one flag per layer, or a period n (every n-th layer
    /// global, the last of each n), else the architecture's period.
    pub fn sliding_layers(&self, default_period: u64) -> Result<Vec<bool>> {
        let key = self.key("attention.sliding_window_pattern");
        let layers = self.layers as usize;
        if let Some(flags) = self.keys.layer_flags(&key, layers)? {
            return Ok(flags);
        }
        let period = self.keys.opt_uint(&key)?.unwrap_or(default_period);
        Ok((0..layers as u64).map(|l| period == 0 || l % period < period - 1).collect())
    }
}

/// transformers' `layer_types`: each layer's attention, local where `sliding(layer)`.
pub fn layer_types(layers: usize, sliding: impl Fn(usize) -> bool) -> Json {
    (0..layers).map(|l| if sliding(l) { "sliding_attention" } else { "full_attention" }).collect()
}
