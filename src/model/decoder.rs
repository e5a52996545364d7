//! The causal LM: embeddings → decoder layers → final norm → lm_head, with per-layer gradient
//! checkpointing: the training forward keeps only each layer's input, and the backward recomputes
//! one layer at a time (llm.c style), producing gradients for the LoRA weights only.

use std::path::{Path, PathBuf};

use crate::profile::section;
use anyhow::Context;
use candle_core::{safetensors::MmapedSafetensors, DType, Device, Tensor, Var};
use rand::SeedableRng;

#[cfg(feature = "cuda")]
use super::activations::checkpoints::host::HostStash;
use super::activations::checkpoints::Checkpoints;
use super::arch::{Architecture, ModelConfig};
use super::layer::{DecoderLayer, KvCache, LayerInput};
use super::lora::linear::{BaseWeight, LoraAdapter, LoraLinear};
use super::lora::{module_path, LoraSpec, PROJECTIONS};
use super::ops::attention::causal_mask;
use super::ops::embedding::Embedding;
use super::ops::lm_head::LmHead;
use super::ops::loss::shift_labels;
use super::ops::{rms_norm, rms_norm_backward, Rope};
use crate::quant::{Nf4Tensor, Quantization};

/// Rows of the cross-entropy processed at once by default (the memory planner counts them).
pub const LOSS_CHUNK_ROWS: usize = 1024;

pub struct CausalLm {
    pub config: ModelConfig,
    /// What the layers compute, read from `config` by its family (arch/family.rs).
    pub arch: Architecture,
    embed_tokens: Embedding,
    pub layers: Vec<DecoderLayer>,
    norm: Tensor,
    lm_head: LmHead,
    rope: Rope,
    dtype: DType,
    device: Device,
    /// Rows of the cross-entropy processed at once (bounds the logits buffer to chunk × vocab).
    pub loss_chunk_rows: usize,
    /// Checkpoints wait in page-locked host memory during the step (CUDA; checkpoints.rs).
    pub offload_checkpoints: bool,
    #[cfg(feature = "cuda")]
    host_stash: std::sync::OnceLock<Option<HostStash>>,
}

/// The result of one training forward + backward on a micro-batch.
pub struct TrainOutput {
    pub loss_sum: f64,
    pub n_tokens: usize,
    /// Gradients aligned with `lora_params()`, in the compute dtype (the GEMMs' output; the
    /// optimizer widens them to f32 as it reads them, which is exact). Kept narrow because at the
    /// end of the backward they are all alive at once.
    pub grads: Vec<Tensor>,
    /// Gradient w.r.t. the embedding output (the start of the input-gradient chain).
    pub d_inputs_embeds: Tensor,
}

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
            layers.push(DecoderLayer {
                input_layernorm: load(
                    &st,
                    &format!("model.layers.{l}.input_layernorm.weight"),
                    dtype,
                    device,
                )?,
                post_attention_layernorm: load(
                    &st,
                    &format!("model.layers.{l}.post_attention_layernorm.weight"),
                    dtype,
                    device,
                )?,
                q_norm: arch
                    .qk_norm
                    .then(|| load(&st, &format!("model.layers.{l}.self_attn.q_norm.weight"), dtype, device))
                    .transpose()?,
                k_norm: arch
                    .qk_norm
                    .then(|| load(&st, &format!("model.layers.{l}.self_attn.k_norm.weight"), dtype, device))
                    .transpose()?,
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
        let norm = load(&st, "model.norm.weight", dtype, device)?;
        let rope = Rope::from_spec(arch.head_dim, &arch.rope, dtype, device)?;
        Ok(Self {
            config,
            arch,
            embed_tokens,
            layers,
            norm,
            lm_head: LmHead::Device(lm_head),
            rope,
            dtype,
            device: device.clone(),
            loss_chunk_rows: LOSS_CHUNK_ROWS,
            offload_checkpoints: device.is_cuda(),
            #[cfg(feature = "cuda")]
            host_stash: std::sync::OnceLock::new(),
        })
    }

    /// Moves an untied lm_head on a GPU to host memory, streamed in for each loss (lm_head.rs):
    /// for training, where it is used once per step. Whether it moved.
    pub fn stream_lm_head(&mut self) -> candle_core::Result<bool> {
        #[cfg(feature = "cuda")]
        if let Some(w) = self.lm_head.on_device() {
            if self.device.is_cuda() && !self.embed_tokens.is_table(w) {
                if let Some(host) = super::ops::lm_head::host::HostLmHead::new(w)? {
                    self.lm_head = LmHead::Host(host);
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of the frozen model as held on its device (a tied lm_head counted once).
    pub fn base_size_in_bytes(&self) -> usize {
        let dense = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let head = match self.lm_head.on_device() {
            Some(w) if !self.embed_tokens.is_table(w) => dense(w),
            _ => 0,
        };
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let norms = dense(&l.input_layernorm) + dense(&l.post_attention_layernorm);
                norms + l.proj.iter().map(|p| p.base.size_in_bytes()).sum::<usize>()
            })
            .sum();
        self.embed_tokens.device_bytes() + head + dense(&self.norm) + layers
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Adds freshly initialised adapters (A kaiming-uniform, B zero) to the target modules.
    pub fn add_lora(&mut self, spec: &LoraSpec, seed: u64) -> candle_core::Result<()> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for layer in &mut self.layers {
            for (p, name) in PROJECTIONS.iter().enumerate() {
                if spec.target_modules.iter().any(|t| t == name) {
                    let dims = layer.proj[p].base.dims();
                    let a =
                        LoraAdapter::init(spec.r, dims, spec.scale(), spec.dropout, &mut rng, &self.device)?;
                    layer.proj[p].lora = Some(a);
                }
            }
        }
        Ok(())
    }

    /// The trained tensors with their PEFT names
    /// (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), in a fixed order.
    pub fn lora_params(&self) -> Vec<(String, Var)> {
        let mut out = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            for (p, name) in PROJECTIONS.iter().enumerate() {
                if let Some(lora) = &layer.proj[p].lora {
                    let prefix = format!("base_model.model.{}", module_path(l, name));
                    out.push((format!("{prefix}.lora_A.weight"), lora.lora_a.clone()));
                    out.push((format!("{prefix}.lora_B.weight"), lora.lora_b.clone()));
                }
            }
        }
        out
    }

    fn embed(&self, input_ids: &Tensor) -> candle_core::Result<Tensor> {
        self.embed_tokens.forward(input_ids)
    }

    /// Each layer's additive causal mask for the composed attention, one tensor per distinct
    /// window; `None` on CUDA, whose kernels mask by position (a [t, t] f32 mask built on the host
    /// is 16 MiB at t = 2048).
    fn attention_masks(&self, t: usize, offset: usize) -> candle_core::Result<Vec<Option<Tensor>>> {
        if self.device.is_cuda() {
            return Ok(vec![None; self.layers.len()]);
        }
        let mut built: Vec<(Option<usize>, Tensor)> = Vec::new();
        (0..self.layers.len())
            .map(|l| {
                let window = self.arch.window(l);
                if let Some((_, mask)) = built.iter().find(|(w, _)| *w == window) {
                    return Ok(Some(mask.clone()));
                }
                let mask = causal_mask(t, offset + t, offset, window, &self.device)?;
                built.push((window, mask.clone()));
                Ok(Some(mask))
            })
            .collect()
    }

    fn layer_input<'a>(
        &'a self,
        masks: &'a [Option<Tensor>],
        offset: usize,
        seed: Option<u64>,
        l: usize,
    ) -> LayerInput<'a> {
        let mask = masks[l].as_ref();
        let dropout_seed =
            seed.map(|s| s.wrapping_mul(6364136223846793005).wrapping_add(l as u64 * 1442695040888963407));
        LayerInput { rope: &self.rope, mask, offset, window: self.arch.window(l), dropout_seed }
    }

    /// Eval-mode logits `[b, t, vocab]` (f32). With `caches`, continues from the cached positions.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        mut caches: Option<&mut [KvCache]>,
    ) -> candle_core::Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let offset = caches.as_ref().map_or(0, |c| c[0].len());
        let masks = self.attention_masks(t, offset)?;
        let mut x = self.embed(input_ids)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let cache = caches.as_mut().map(|c| &mut c[l]);
            x = layer.forward(&x, &self.layer_input(&masks, offset, None, l), cache)?;
        }
        let h = rms_norm(&x.reshape((b * t, self.arch.hidden_size))?, &self.norm, self.arch.rms_norm_eps)?;
        self.lm_head.logits(&h)?.to_dtype(DType::F32)?.reshape((b, t, self.arch.vocab_size))
    }

    /// Runs the decoder, handing each layer's input to `checkpoints` (when kept for a backward).
    /// Returns the last output.
    fn forward_checkpointed(
        &self,
        x: Tensor,
        masks: &[Option<Tensor>],
        seed: Option<u64>,
        mut checkpoints: Option<&mut Checkpoints>,
    ) -> candle_core::Result<Tensor> {
        let mut x = x;
        for (l, layer) in self.layers.iter().enumerate() {
            let next = layer.forward(&x, &self.layer_input(masks, 0, seed, l), None)?;
            let input = std::mem::replace(&mut x, next);
            if let Some(c) = checkpoints.as_deref_mut() {
                c.push(input)?;
            }
        }
        Ok(x)
    }

    /// Where this step's checkpoints wait: host memory on CUDA with offload on (the copy stream
    /// made once), else the device.
    fn checkpoints(&self) -> Checkpoints<'_> {
        #[cfg(feature = "cuda")]
        if self.offload_checkpoints && self.device.is_cuda() {
            let stash = self.host_stash.get_or_init(|| {
                HostStash::new(&self.device)
                    .inspect_err(|e| tracing::warn!("checkpoints stay on the GPU: no copy stream ({e})"))
                    .ok()
            });
            if let Some(stash) = stash {
                return Checkpoints::on_host(stash);
            }
        }
        Checkpoints::on_device()
    }

    /// Summed loss over trained tokens (eval mode, no gradients).
    pub fn loss(&self, input_ids: &Tensor, labels: &[i64]) -> candle_core::Result<(f64, usize)> {
        let (b, t) = input_ids.dims2()?;
        let masks = self.attention_masks(t, 0)?;
        let last = self.forward_checkpointed(self.embed(input_ids)?, &masks, None, None)?;
        let last = last.reshape((b * t, self.arch.hidden_size))?;
        let h = rms_norm(&last, &self.norm, self.arch.rms_norm_eps)?;
        let out = self.lm_head.cross_entropy(&h, &shift_labels(labels, b, t), None, self.loss_chunk_rows)?;
        Ok((out.loss_sum, out.n_tokens))
    }

    /// Forward and backward of one micro-batch. Gradients are those of `grad_scale · loss_sum`
    /// (the trainer passes 1/tokens-in-the-step, times the fp16 loss scale).
    /// `dropout_seed = None` turns LoRA dropout off.
    pub fn forward_backward(
        &self,
        input_ids: &Tensor,
        labels: &[i64],
        grad_scale: f64,
        dropout_seed: Option<u64>,
    ) -> candle_core::Result<TrainOutput> {
        let (b, t) = input_ids.dims2()?;
        let hidden = self.arch.hidden_size;
        let masks = self.attention_masks(t, 0)?;
        let mut checkpoints = self.checkpoints();
        let last =
            self.forward_checkpointed(self.embed(input_ids)?, &masks, dropout_seed, Some(&mut checkpoints))?;
        let last = last.reshape((b * t, hidden))?;
        let h = rms_norm(&last, &self.norm, self.arch.rms_norm_eps)?;
        let targets = shift_labels(labels, b, t);
        let out = section("loss", &self.device, || {
            self.lm_head.cross_entropy(&h, &targets, Some(grad_scale), self.loss_chunk_rows)
        })?;
        let d_h = out.d_hidden.expect("asked for the gradient");
        let mut dx =
            rms_norm_backward(&last, &self.norm, self.arch.rms_norm_eps, &d_h)?.reshape((b, t, hidden))?;
        let mut per_layer = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let input = self.layer_input(&masks, 0, dropout_seed, l);
            let x = checkpoints.pop()?;
            let saved = layer.recompute(&x, &input)?;
            let (d_in, grads) = layer.backward(saved, &dx, &input)?;
            dx = d_in;
            per_layer.push(grads);
        }
        per_layer.reverse();
        let grads = per_layer
            .into_iter()
            .flat_map(|g| g.into_iter().flatten())
            .flat_map(|g| [g.lora_a, g.lora_b])
            .collect();
        Ok(TrainOutput { loss_sum: out.loss_sum, n_tokens: out.n_tokens, grads, d_inputs_embeds: dx })
    }
}
