//! A config.json read and checked against the declared families (`families.rs`), and what follows
//! from its family: its `Architecture` (the family's `describe`, then `check_supported`), whether
//! its head is tied, its parameter count.

use std::path::Path;

use anyhow::{bail, Context};

use super::config::ModelConfig;
use super::description::Architecture;
use super::families::{by_class, FAMILIES};
use super::family::Family;

impl Architecture {
    /// The description of `c` by its family (`architectures[0]`; none given reads as Llama).
    pub fn from_config(c: &ModelConfig) -> anyhow::Result<Self> {
        let name = c.architectures.first().map(String::as_str).unwrap_or("LlamaForCausalLM");
        let Some(family) = by_class(name) else {
            let known: Vec<&str> = FAMILIES.iter().map(|f| f.class).collect();
            bail!("architectures: {name} (lora-ft reads {})", known.join(", "));
        };
        let arch = Architecture {
            family: family.class,
            tied_embeddings: c.tie_word_embeddings.unwrap_or(family.tied_by_default),
            ..(family.describe)(c).with_context(|| format!("reading {name}"))?
        };
        arch.check_supported()?;
        Ok(arch)
    }

    /// The declaration of the family it was read as.
    pub fn declaration(&self) -> &'static Family {
        by_class(self.family).expect("an Architecture is read as a declared family")
    }
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let de = &mut serde_json::Deserializer::from_str(&text);
        let cfg: ModelConfig = serde_path_to_error::deserialize(de)
            .map_err(|e| anyhow::anyhow!("{}: {}: {}", path.display(), e.path(), e.inner()))?;
        cfg.checked(&path.display().to_string())
    }

    /// A config.json held as JSON (a GGUF file's, `gguf::read_configs`), checked as `from_file`
    /// checks a file; errors name `origin`.
    pub fn from_value(value: serde_json::Value, origin: &str) -> anyhow::Result<Self> {
        let cfg: ModelConfig = serde_path_to_error::deserialize(value)
            .map_err(|e| anyhow::anyhow!("{origin}: {}: {}", e.path(), e.inner()))?;
        cfg.checked(origin)
    }

    /// Itself, when its family is one the layers compute.
    fn checked(self, origin: &str) -> anyhow::Result<Self> {
        Architecture::from_config(&self).with_context(|| format!("{origin}: unsupported model"))?;
        Ok(self)
    }

    /// Whether lm_head is the embedding table: `tie_word_embeddings`, whose default is the
    /// family's (transformers' Gemma configs default to tied).
    pub fn tied_embeddings(&self) -> bool {
        let family = self.architectures.first().and_then(|a| by_class(a));
        self.tie_word_embeddings.unwrap_or(family.is_some_and(|f| f.tied_by_default))
    }

    /// Parameters of the full model (embeddings, projections, norms — Gemma's four a layer, the
    /// q/k norms —, q/k/v biases, lm_head unless tied): the N of the usual 6·N training FLOPs per
    /// token (Mistral-7B: 7.24e9).
    pub fn parameter_count(&self) -> usize {
        let (h, i, d) = (self.hidden_size, self.intermediate_size, self.head_dim());
        let q = self.num_attention_heads * d;
        let kv = self.num_key_value_heads.unwrap_or(self.num_attention_heads) * d;
        let mut layer = h * q * 2 + h * kv * 2 + 3 * h * i + 2 * h;
        if let Ok(arch) = Architecture::from_config(self) {
            layer += if arch.post_sublayer_norms { 2 * h } else { 0 };
            layer += if arch.qk_norm { 2 * d } else { 0 };
            layer += if arch.qkv_bias { q + 2 * kv } else { 0 };
        }
        let heads = if self.tied_embeddings() { 1 } else { 2 };
        self.num_hidden_layers * layer + heads * self.vocab_size * h + h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: serde_json::Value) -> ModelConfig {
        serde_json::from_value(json).unwrap()
    }

    /// A config.json with no heads is refused by name, not a division by zero in the planner.
    #[test]
    fn zero_sizes_are_refused() {
        let dir = std::env::temp_dir().join(format!("lora-ft-zero-heads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config.json");
        std::fs::write(
            &file,
            r#"{"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 0}"#,
        )
        .unwrap();
        let err = format!("{:#}", ModelConfig::from_file(&file).unwrap_err());
        assert!(err.contains("config.json") && err.contains("head counts must be positive"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The published sizes: Mistral-7B 7,241,732,096; Llama-2-13B 13,015,864,320;
    /// SmolLM2-135M (tied embeddings) 134,515,008.
    #[test]
    fn parameter_count_matches_the_published_sizes() {
        let mistral = config(serde_json::json!({"vocab_size": 32000, "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8}));
        assert_eq!(mistral.parameter_count(), 7_241_732_096);
        let llama13 = config(serde_json::json!({"vocab_size": 32000, "hidden_size": 5120,
            "intermediate_size": 13824, "num_hidden_layers": 40, "num_attention_heads": 40}));
        assert_eq!(llama13.parameter_count(), 13_015_864_320);
        let smollm2 = config(serde_json::json!({"vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "tie_word_embeddings": true}));
        assert_eq!(smollm2.parameter_count(), 134_515_008);
    }

    /// With each family's extra tensors (the counts of scripts/bench/bench_models.py and the
    /// model cards): Gemma-2-9B's four norms a layer (tied), Qwen3-8B's q/k norms, Qwen2.5-7B's
    /// q/k/v biases.
    #[test]
    fn parameter_count_holds_each_familys_extra_tensors() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bench-models");
        for (name, n) in
            [("gemma2-9b", 9_241_705_984), ("qwen3-8b", 8_190_735_360), ("qwen2.5-7b", 7_615_616_512)]
        {
            let cfg = ModelConfig::from_file(Path::new(&format!("{dir}/{name}/config.json"))).unwrap();
            assert_eq!(cfg.parameter_count(), n, "{name}");
        }
    }
}
