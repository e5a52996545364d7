//! Reading an HF-layout model into a `CausalLm`: each family's tensor names, Gemma's (1 + w)
//! norm weights stored as that sum, projection weights quantized as they are read.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{safetensors::MmapedSafetensors, DType, Device, Tensor};

use super::super::layer::DecoderLayer;
use super::super::lora::linear::{BaseWeight, LoraLinear};
use super::super::lora::{module_path, PROJECTIONS};
use super::super::ops::embedding::Embedding;
use super::super::ops::lm_head::LmHead;
use super::super::ops::Rope;
use super::{CausalLm, LOSS_CHUNK_ROWS};
use crate::arch::{Architecture, ModelConfig};
use crate::quant::{Nf4Tensor, Quantization};

fn load(st: &MmapedSafetensors, name: &str, dtype: DType, device: &Device) -> anyhow::Result<Tensor> {
    let t = st.load(name, device).with_context(|| format!("loading tensor {name}"))?;
    Ok(t.to_dtype(dtype)?)
}

fn load_progress(layers: usize, quantization: Quantization) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(layers as u64);
    let what = match quantization {
        Quantization::None => "loading layers",
        Quantization::Nf4 { .. } => "loading layers, quantizing to NF4",
    };
    let style = indicatif::ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} [{elapsed}<{eta}]");
    bar.set_style(style.unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    bar.set_message(what);
    bar
}

/// One projection weight: read in `dtype` (as bitsandbytes quantizes the weight in the model's
/// dtype), then quantized; the dense tensor is dropped on return.
fn load_base(
    st: &MmapedSafetensors,
    name: &str,
    dtype: DType,
    quantization: Quantization,
    device: &Device,
) -> anyhow::Result<BaseWeight> {
    let w = load(st, name, dtype, device)?;
    Ok(match quantization {
        Quantization::None => BaseWeight::Dense(w),
        Quantization::Nf4 { double_quant } => BaseWeight::Nf4(
            Nf4Tensor::quantize(&w, double_quant).with_context(|| format!("quantizing {name} to NF4"))?,
        ),
    })
}

/// A norm weight as the layers apply it: w, or Gemma's 1 + w (added in f32, then rounded to
/// `dtype`, as transformers computes it).
fn norm(
    st: &MmapedSafetensors,
    name: &str,
    arch: &Architecture,
    dtype: DType,
    device: &Device,
) -> anyhow::Result<Tensor> {
    if arch.norm_weight_offset == 0.0 {
        return load(st, name, dtype, device);
    }
    let w = load(st, name, DType::F32, device)?;
    Ok((w + arch.norm_weight_offset)?.to_dtype(dtype)?)
}

impl CausalLm {
    /// Loads an HF-layout model (config.json + one or more safetensors files). Projection
    /// weights are quantized one at a time as they are read (`quantization`); embeddings, norms
    /// and lm_head stay dense in `dtype`.
    pub fn load(
        config_path: &Path,
        weights: &[PathBuf],
        dtype: DType,
        quantization: Quantization,
        device: &Device,
    ) -> anyhow::Result<Self> {
        let config = ModelConfig::from_file(config_path)?;
        let arch = Architecture::from_config(&config)?;
        // SAFETY: the files are memory-mapped read-only and not modified while loading.
        let st = unsafe { MmapedSafetensors::multi(weights) }
            .with_context(|| format!("opening safetensors {weights:?}"))?;
        let untied = st.get("lm_head.weight").is_ok();
        // an untied table is only ever indexed: on a GPU it stays on the host (embedding.rs)
        let table_device = if untied && device.is_cuda() { &Device::Cpu } else { device };
        let table = load(&st, "model.embed_tokens.weight", dtype, table_device)?;
        let lm_head = match untied {
            true => load(&st, "lm_head.weight", dtype, device)?,
            false if arch.tied_embeddings => table.clone(),
            false => anyhow::bail!("lm_head.weight is missing and tie_word_embeddings is false"),
        };
        let embed_tokens = Embedding::new(table, device);
        let mut layers = Vec::with_capacity(arch.num_layers);
        let progress = load_progress(arch.num_layers, quantization);
        for l in 0..arch.num_layers {
            progress.inc(1);
            let mut linears = Vec::with_capacity(7);
            for (p, proj) in PROJECTIONS.iter().enumerate() {
                let path = module_path(l, proj);
                let biased = arch.qkv_bias && p < 3; // q, k, v
                linears.push(LoraLinear {
                    base: load_base(&st, &format!("{path}.weight"), dtype, quantization, device)?,
                    bias: biased.then(|| load(&st, &format!("{path}.bias"), dtype, device)).transpose()?,
                    lora: None,
                });
            }
            let norm =
                |name: &str| norm(&st, &format!("model.layers.{l}.{name}.weight"), &arch, dtype, device);
            let sandwich = arch.post_sublayer_norms;
            layers.push(DecoderLayer {
                input_layernorm: norm("input_layernorm")?,
                // Gemma's `post_attention_layernorm` norms the attention output; its pre-MLP
                // norm is `pre_feedforward_layernorm`
                post_attention_layernorm: norm(match sandwich {
                    true => "pre_feedforward_layernorm",
                    false => "post_attention_layernorm",
                })?,
                attn_out_norm: sandwich.then(|| norm("post_attention_layernorm")).transpose()?,
                mlp_out_norm: sandwich.then(|| norm("post_feedforward_layernorm")).transpose()?,
                activation: arch.activation,
                q_norm: arch.qk_norm.then(|| norm("self_attn.q_norm")).transpose()?,
                k_norm: arch.qk_norm.then(|| norm("self_attn.k_norm")).transpose()?,
                proj: linears.try_into().map_err(|_| anyhow::anyhow!("seven projections"))?,
                n_heads: arch.num_heads,
                n_kv_heads: arch.num_kv_heads,
                head_dim: arch.head_dim,
                rms_norm_eps: arch.rms_norm_eps,
            });
        }
        progress.finish_and_clear();
        let base_bytes: usize =
            layers.iter().flat_map(|l| l.proj.iter()).map(|p| p.base.size_in_bytes()).sum();
        tracing::info!(
            "projection weights: {:.1} MiB ({quantization:?})",
            base_bytes as f64 / (1 << 20) as f64
        );
        let norm = norm(&st, "model.norm.weight", &arch, dtype, device)?;
        let rope = Rope::from_spec(arch.head_dim, &arch.rope, dtype, device)?;
        let local_rope = arch
            .local_rope
            .as_ref()
            .map(|spec| Rope::from_spec(arch.head_dim, spec, dtype, device))
            .transpose()?;
        Ok(Self {
            config,
            arch,
            embed_tokens,
            layers,
            norm,
            lm_head: LmHead::Device(lm_head),
            rope,
            local_rope,
            dtype,
            device: device.clone(),
            loss_chunk_rows: LOSS_CHUNK_ROWS,
            policy: super::TrainingPolicy::loaded_on(device),
            #[cfg(feature = "cuda")]
            host_stash: std::sync::OnceLock::new(),
            #[cfg(feature = "cuda")]
            layer_stash: std::sync::OnceLock::new(),
        })
    }
}
