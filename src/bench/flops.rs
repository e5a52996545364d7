//! Training FLOPs per token, for `lora-ft bench train`'s MFU and HFU: counted as
//! `scripts/bench/bench_models.py` `flops_per_token` and `compare_train.py` count them for the
//! benchmark tables, so a row and its table say the same.
//!
//! - Model FLOPs (what training needs, no recompute): the frozen weights' forward and input
//!   gradient, 4·N; LoRA's forward, input and weight gradients, 6·N_lora; attention's forward and
//!   backward, 3·A.
//! - Hardware FLOPs: the same with checkpointing's recomputed forward, 6·N + 8·N_lora + 4·A, less
//!   (kept / layers)·(2·N + 2·N_lora + A) for the layers kept whole from the forward to the
//!   backward (selective checkpointing) instead of recomputed.
//!
//! N is every parameter (embeddings included, a tied matrix once); A the forward attention FLOPs
//! per token at the row's length: 4·heads·head_dim per key a query sees, causal, each layer's
//! window applied.

use crate::arch::{Architecture, ModelConfig};

/// The dense f16/bf16 tensor-core peak of an H100 SXM and an H200, without sparsity.
pub const PEAK_FLOPS: f64 = 989e12;

/// FLOPs per trained token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenFlops {
    /// 4·N + 6·N_lora + 3·A.
    pub model: f64,
    /// 6·N + 8·N_lora + 4·A, less the recompute of the kept layers.
    pub hardware: f64,
}

/// The forward attention FLOPs per token of rows of `seq` tokens, summed over the layers: QKᵀ and
/// PV, 2 FLOPs a multiply-add each, over the keys a query sees on average (its causal prefix,
/// cut at the layer's window).
pub fn attention_per_token(config: &ModelConfig, arch: &Architecture, seq: usize) -> f64 {
    let per_key = 4.0 * (config.num_attention_heads * config.head_dim()) as f64;
    let seq = seq.max(1);
    (0..config.num_hidden_layers)
        .map(|l| {
            // Σ_{t<seq} min(t + 1, w): the ramp up to the window, then w for each later query
            let w = arch.window(l).unwrap_or(seq).clamp(1, seq) as f64;
            let seen = w * (w + 1.0) / 2.0 + (seq as f64 - w) * w;
            per_key * seen / seq as f64
        })
        .sum()
}

/// FLOPs per token of training `config` with `lora_params` LoRA parameters on rows of `seq`
/// tokens, `kept` of its layers kept whole (not recomputed).
pub fn per_token(
    config: &ModelConfig,
    arch: &Architecture,
    lora_params: usize,
    seq: usize,
    kept: usize,
) -> TokenFlops {
    let (n, n_lora) = (config.parameter_count() as f64, lora_params as f64);
    let a = attention_per_token(config, arch, seq);
    let model = 4.0 * n + 6.0 * n_lora + 3.0 * a;
    let recompute = 2.0 * n + 2.0 * n_lora + a;
    let layers = config.num_hidden_layers.max(1);
    let kept_share = kept.min(layers) as f64 / layers as f64;
    TokenFlops { model, hardware: model + recompute * (1.0 - kept_share) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_model(name: &str) -> (ModelConfig, Architecture) {
        let file = format!("{}/tests/fixtures/bench-models/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
        let config = ModelConfig::from_file(std::path::Path::new(&file)).unwrap();
        let arch = Architecture::from_config(&config).unwrap();
        (config, arch)
    }

    /// The LoRA parameters of r = 16 on the seven projections of every layer.
    fn lora_r16(c: &ModelConfig) -> usize {
        let (h, i, d) = (c.hidden_size, c.intermediate_size, c.head_dim());
        let (q, kv) = (c.num_attention_heads * d, c.num_key_value_heads.unwrap_or(c.num_attention_heads) * d);
        c.num_hidden_layers * 16 * ((h + q) * 2 + (h + kv) * 2 + 3 * (h + i))
    }

    /// The values `bench_models.py` prints (`flops_per_token(config(name), seq)`, its sum over
    /// every query): Mistral-7B inside and past its 4096-token window, Gemma-2-9B's alternating
    /// windows, Qwen3-14B's q/k norms. Both count the keys seen as integers, exact in f64; after
    /// that each side rounds once per layer summed and a few times in the totals, so they may
    /// differ by that many f64 roundings: (layers + 8) ε relative.
    #[test]
    fn flops_per_token_are_the_benchmark_tables() {
        for (name, seq, model, hardware, attention) in [
            ("mistral-7b", 512, 29622026240.0, 44323856384.0, 134479872.0),
            ("mistral-7b", 8192, 34050818048.0, 50228912128.0, 1610743808.0),
            ("gemma2-9b", 512, 37820446720.0, 56588399616.0, 176504832.0),
            ("gemma2-9b", 8192, 44690458624.0, 65748415488.0, 2466508800.0),
            ("qwen3-14b", 2048, 61976391680.0, 92480727040.0, 839270400.0),
        ] {
            let (c, arch) = bench_model(name);
            let roundings = (c.num_hidden_layers + 8) as f64;
            let close = |got: f64, want: f64| (got - want).abs() <= roundings * f64::EPSILON * want;
            let a = attention_per_token(&c, &arch, seq);
            assert!(close(a, attention), "{name} {seq}: attention {a} against {attention}");
            let f = per_token(&c, &arch, lora_r16(&c), seq, 0);
            assert!(close(f.model, model) && close(f.hardware, hardware), "{name} {seq}: {f:?}");
            // every layer kept: nothing recomputed, the hardware does what the model needs
            assert_eq!(per_token(&c, &arch, lora_r16(&c), seq, c.num_hidden_layers).hardware, f.model);
        }
        // a layer's window of 1: each query sees itself alone
        let (mut c, mut arch) = bench_model("mistral-7b");
        (c.num_hidden_layers, arch.windows) = (1, vec![Some(1)]);
        assert_eq!(attention_per_token(&c, &arch, 100), 4.0 * 4096.0);
    }
}
