//! The causal LM: embeddings → decoder layers → final norm → lm_head, with per-layer gradient
//! checkpointing: the training forward keeps only each layer's input, and the backward recomputes
//! one layer at a time (llm.c style), producing gradients for the LoRA weights only — except the
//! last layers the planner keeps whole (`KeptLayers`), whose backward reads their forward's.

mod inference;
mod load;
mod policy;
pub mod prepare;

pub use policy::TrainingPolicy;

use crate::profile::section;
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;

#[cfg(feature = "cuda")]
use super::activations::checkpoints::host::HostStash;
use super::activations::checkpoints::Checkpoints;
#[cfg(feature = "cuda")]
use super::activations::layer_offload::host::LayerStash;
use super::activations::layer_offload::OffloadedLayers;
use super::activations::{KeptLayers, LayerKind};
use super::layer::{DecoderLayer, LayerInput, LayerSaved};
use super::lora::LoraAdapter;
use super::lora::{module_path, LoraSpec, PROJECTIONS};
use super::ops::attention::{causal_mask, ScoreRule};
use super::ops::embedding::Embedding;
use super::ops::lm_head::LmHead;
use super::ops::loss::shift_labels;
use super::ops::{rms_norm, rms_norm_backward, Rope};
use super::packing::PackedRows;
use crate::arch::{Architecture, ModelConfig};
use crate::profile::timeline;

/// Rows of the cross-entropy processed at once by default (the memory planner counts them).
pub const LOSS_CHUNK_ROWS: usize = 1024;

pub struct CausalLm {
    pub config: ModelConfig,
    /// What the layers compute, read from `config` by its family (arch/families/).
    pub arch: Architecture,
    embed_tokens: Embedding,
    pub layers: Vec<DecoderLayer>,
    norm: Tensor,
    lm_head: LmHead,
    rope: Rope,
    /// The RoPE of the sliding-window layers where the family gives them their own (Gemma 3).
    local_rope: Option<Rope>,
    dtype: DType,
    device: Device,
    /// Rows of the cross-entropy processed at once (bounds the logits buffer to chunk × vocab).
    loss_chunk_rows: usize,
    /// What the training steps keep and where (policy.rs), set by the run's setup.
    policy: TrainingPolicy,
    #[cfg(feature = "cuda")]
    host_stash: std::sync::OnceLock<Option<HostStash>>,
    #[cfg(feature = "cuda")]
    layer_stash: std::sync::OnceLock<Option<LayerStash>>,
}

/// What a training forward keeps for the backward: each layer's kind, where the checkpoints
/// and the offloaded layers wait.
struct Keeping<'s, 'a> {
    kinds: &'s [LayerKind],
    checkpoints: &'s mut Checkpoints<'a>,
    offloaded: &'s mut OffloadedLayers<'a, LayerSaved>,
    /// A streamed lm_head's chunks to prefetch for the loss, and the layer before whose forward
    /// the copies start (`LayerPlan::lm_head_prefetch`).
    head_prefetch: (usize, usize),
}

/// The result of one training forward + backward on a micro-batch.
pub struct TrainOutput {
    pub loss_sum: f64,
    pub n_tokens: usize,
    /// Gradients aligned with `lora_params()`, in the compute dtype (the GEMMs' output; the
    /// optimizer widens them to f32 as it reads them, which is exact). Kept narrow because at the
    /// end of the backward they are all alive at once.
    pub grads: Vec<Tensor>,
    /// Gradient w.r.t. the rows looked up in the embedding table (before Gemma's scale): the
    /// end of the input-gradient chain.
    pub d_inputs_embeds: Tensor,
}

impl CausalLm {
    /// Moves an untied lm_head on a GPU to host memory, streamed in for each loss (lm_head.rs):
    /// for training, where it is used once per step. Whether it moved.
    pub fn stream_lm_head(&mut self) -> candle_core::Result<bool> {
        #[cfg(feature = "cuda")]
        if let Some(w) = self.lm_head.on_device() {
            // the streamed loss does not soft-cap
            if self.device.is_cuda()
                && !self.embed_tokens.is_table(w)
                && self.arch.final_logit_softcap.is_none()
            {
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

    /// What the training steps keep and where.
    pub fn training_policy(&self) -> &TrainingPolicy {
        &self.policy
    }

    /// The run's policy for the training steps from here on (train/setup.rs resolves it).
    pub fn set_training_policy(&mut self, policy: TrainingPolicy) {
        self.policy = policy;
    }

    /// The layers the steps keep, given up one at a time where a step runs out of memory.
    pub fn kept_layers(&self) -> &KeptLayers {
        &self.policy.kept_layers
    }

    /// Frees lm_head chunks prefetched for a loss that did not run (a step that failed), so
    /// that a trim of the memory pool can give their memory back.
    pub fn drop_prefetched(&self) {
        self.lm_head.drop_prefetched();
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
                let extra = [&l.attn_out_norm, &l.mlp_out_norm, &l.q_norm, &l.k_norm];
                let norms = dense(&l.input_layernorm)
                    + dense(&l.post_attention_layernorm)
                    + extra.iter().filter_map(|n| n.as_ref()).map(dense).sum::<usize>();
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
        add_lora_to(&mut self.layers, spec, seed, &self.device)
    }

    /// The trained tensors with their PEFT names
    /// (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), in a fixed order.
    pub fn lora_params(&self) -> Vec<(String, Var)> {
        lora_params_of(&self.layers)
    }

    /// The embedding rows of `input_ids`, times Gemma's sqrt(hidden) (rounded to the compute
    /// dtype first, as transformers does).
    fn embed(&self, input_ids: &Tensor) -> candle_core::Result<Tensor> {
        let rows = self.embed_tokens.forward(input_ids)?;
        match self.embedding_scale() {
            Some(scale) => rows * scale,
            None => Ok(rows),
        }
    }

    /// Gemma's embedding scale as the compute dtype holds it.
    fn embedding_scale(&self) -> Option<f64> {
        let scale = self.arch.embedding_scale?;
        Some(match self.dtype {
            DType::F16 => half::f16::from_f64(scale).to_f64(),
            DType::BF16 => half::bf16::from_f64(scale).to_f64(),
            DType::F32 => scale as f32 as f64,
            _ => scale,
        })
    }

    /// Each layer's additive causal mask for the composed attention, one tensor per distinct
    /// window; `None` on CUDA, whose kernels mask by position (a [t, t] f32 mask built on the host
    /// is 16 MiB at t = 2048).
    /// On the CPU packed rows bring their own `[b, 1, t, t]` masks (on CUDA their spans go to
    /// the kernels, and the composed path builds the mask where it falls back).
    fn attention_masks(
        &self,
        t: usize,
        offset: usize,
        packed: Option<&PackedRows>,
    ) -> candle_core::Result<Vec<Option<Tensor>>> {
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
                let mask = match packed {
                    Some(p) => p.mask(window, &self.device)?,
                    None => causal_mask(t, offset + t, offset, window, &self.device)?,
                };
                built.push((window, mask.clone()));
                Ok(Some(mask))
            })
            .collect()
    }

    fn layer_input<'a>(
        &'a self,
        (masks, packed): (&'a [Option<Tensor>], Option<&'a PackedRows>),
        offset: usize,
        seed: Option<u64>,
        l: usize,
    ) -> LayerInput<'a> {
        let mask = masks[l].as_ref();
        let dropout_seed =
            seed.map(|s| s.wrapping_mul(6364136223846793005).wrapping_add(l as u64 * 1442695040888963407));
        let window = self.arch.window(l);
        let rope = match (&self.local_rope, window) {
            (Some(local), Some(_)) => local,
            _ => &self.rope,
        };
        let scores = ScoreRule { scale: self.arch.query_scale, softcap: self.arch.attention_softcap, window };
        LayerInput {
            rope,
            mask,
            offset,
            scores,
            dropout_seed,
            packed,
            mlp_tile_values: self.policy.mlp_tile_values,
        }
    }

    /// Runs the decoder; in training (`keeping`), each layer keeps what its kind says: its input
    /// as a checkpoint, or its activations, returned by layer (kept) or in the offloaded store.
    fn forward_checkpointed(
        &self,
        x: Tensor,
        masks: (&[Option<Tensor>], Option<&PackedRows>),
        seed: Option<u64>,
        mut keeping: Option<Keeping>,
    ) -> candle_core::Result<(Tensor, Vec<Option<LayerSaved>>)> {
        let mut x = x;
        let mut kept: Vec<Option<LayerSaved>> = (0..self.layers.len()).map(|_| None).collect();
        for (l, layer) in self.layers.iter().enumerate() {
            let input = self.layer_input(masks, 0, seed, l);
            let Some(k) = keeping.as_mut() else {
                x = layer.forward(&x, &input, None)?;
                continue;
            };
            if k.head_prefetch.0 > 0 && l == k.head_prefetch.1 {
                self.lm_head.prefetch(k.head_prefetch.0)?;
            }
            match k.kinds[l] {
                LayerKind::Recomputed => {
                    let next = layer.forward(&x, &input, None)?;
                    k.checkpoints.push(std::mem::replace(&mut x, next))?;
                }
                LayerKind::Kept | LayerKind::KeptAll => {
                    let (next, saved) = match k.kinds[l] {
                        LayerKind::KeptAll => layer.forward_saving_all(&x, &input)?,
                        _ => layer.forward_saving(&x, &input)?,
                    };
                    kept[l] = Some(saved);
                    x = next;
                }
                LayerKind::Offloaded => {
                    let (next, saved) = layer.forward_saving(&x, &input)?;
                    k.offloaded.push(l, saved)?;
                    x = next;
                }
            }
            timeline::mark(&self.device, || format!("forward {l} {:?}", k.kinds[l]))?;
        }
        Ok((x, kept))
    }

    /// Where this step's offloaded layers (of `kinds`) wait: host memory on CUDA with offload on
    /// (the copy stream made once), else the device.
    fn offloaded_layers(&self, kinds: &[LayerKind]) -> candle_core::Result<OffloadedLayers<'_, LayerSaved>> {
        #[cfg(feature = "cuda")]
        if let Some(stash) = self.host_side(&self.layer_stash, LayerStash::new, "offloaded layers") {
            let layers: Vec<usize> = (0..kinds.len()).filter(|&l| kinds[l] == LayerKind::Offloaded).collect();
            return OffloadedLayers::on_host(stash, &layers);
        }
        let _ = kinds; // all on the device
        Ok(OffloadedLayers::on_device())
    }

    /// Where this step's checkpoints wait: host memory on CUDA with offload on (the copy stream
    /// made once), else the device.
    fn checkpoints(&self) -> Checkpoints<'_> {
        #[cfg(feature = "cuda")]
        if let Some(stash) = self.host_side(&self.host_stash, HostStash::new, "checkpoints") {
            return Checkpoints::on_host(stash);
        }
        Checkpoints::on_device()
    }

    /// A host-memory store with its copy stream, made at its first use on CUDA with offload on;
    /// `None` elsewhere, or (warned once) where the stream cannot be made.
    #[cfg(feature = "cuda")]
    fn host_side<'s, T>(
        &self,
        cell: &'s std::sync::OnceLock<Option<T>>,
        make: fn(&Device) -> candle_core::Result<T>,
        what: &str,
    ) -> Option<&'s T> {
        if !(self.policy.offload_checkpoints && self.device.is_cuda()) {
            return None;
        }
        let made = cell.get_or_init(|| {
            make(&self.device)
                .inspect_err(|e| tracing::warn!("{what} stay on the GPU: no copy stream ({e})"))
                .ok()
        });
        made.as_ref()
    }

    /// Summed loss over trained tokens (eval mode, no gradients).
    pub fn loss(&self, input_ids: &Tensor, labels: &[i64]) -> candle_core::Result<(f64, usize)> {
        let (b, t) = input_ids.dims2()?;
        let masks = self.attention_masks(t, 0, None)?;
        let (last, _) = self.forward_checkpointed(self.embed(input_ids)?, (&masks, None), None, None)?;
        let last = last.reshape((b * t, self.arch.hidden_size))?;
        let h = rms_norm(&last, &self.norm, self.arch.rms_norm_eps)?;
        let targets = shift_labels(labels, b, t);
        let cap = self.arch.final_logit_softcap;
        let out = self.lm_head.cross_entropy(&h, &targets, None, self.loss_chunk_rows, cap)?;
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
        self.forward_backward_packed(input_ids, labels, &[], grad_scale, dropout_seed)
    }

    /// `forward_backward` of packed rows: `seq_lens[r]` the lengths of row r's dialogues
    /// (`data::Batch::seq_lens`; empty: rows of one dialogue each).
    pub fn forward_backward_packed(
        &self,
        input_ids: &Tensor,
        labels: &[i64],
        seq_lens: &[Vec<usize>],
        grad_scale: f64,
        dropout_seed: Option<u64>,
    ) -> candle_core::Result<TrainOutput> {
        let (b, t) = input_ids.dims2()?;
        let hidden = self.arch.hidden_size;
        let packed = match seq_lens.is_empty() {
            true => None,
            false => Some(PackedRows::new(seq_lens, t, &self.device)?),
        };
        let masks = self.attention_masks(t, 0, packed.as_ref())?;
        let masks = (masks.as_slice(), packed.as_ref());
        let mut checkpoints = self.checkpoints();
        let (plan, grows) = self.policy.kept_layers.plan_growing((t, b));
        self.lm_head.drop_prefetched(); // a failed step's, before any trim
        if grows {
            // the memory pool keeps what the smaller shapes before freed, cut to their buffers,
            // which the plan does not count (on a 24 GiB card Llama-2-13B's 512 x 8 ran out after
            // 512 x 4, Mistral-7B's 2048 x 4 after 2048 x 2; train/recovery.rs): a step whose
            // buffers outgrow every earlier one's starts from a trimmed pool, a few times a run
            self.lm_head.set_resident(false)?;
            crate::memory::trim_pool(&self.device);
        }
        self.lm_head.set_resident(plan.lm_head_resident)?;
        let kinds = plan.kinds(self.layers.len());
        let mut offloaded = self.offloaded_layers(&kinds)?;
        let layers = self.layers.len();
        let prefetch = match self.lm_head.streams() {
            true => plan.lm_head_prefetch,
            false => 0,
        };
        let keeping = Keeping {
            kinds: &kinds,
            checkpoints: &mut checkpoints,
            offloaded: &mut offloaded,
            head_prefetch: (prefetch, layers.saturating_sub(plan.lm_head_prefetch_lead)),
        };
        let x = self.embed(input_ids)?;
        timeline::mark(&self.device, || "embedding".into())?;
        let (last, mut kept) = self.forward_checkpointed(x, masks, dropout_seed, Some(keeping))?;
        // the offloaded layer the backward reaches first comes in behind the loss and the layers
        // above it; where the loss streams lm_head with chunks prefetched, after the loss, so
        // that the link carries the head's rest alone (fetching it after the loss without a
        // prefetch measured no faster on a large model: benches/code_notes.md)
        let next_offloaded = |below: usize| (0..below).rev().find(|&n| kinds[n] == LayerKind::Offloaded);
        if prefetch == 0 {
            offloaded.start_backward(next_offloaded(layers))?;
        }
        let last = last.reshape((b * t, hidden))?;
        let h = rms_norm(&last, &self.norm, self.arch.rms_norm_eps)?;
        let targets = shift_labels(labels, b, t);
        let out = section("loss", &self.device, || {
            let cap = self.arch.final_logit_softcap;
            self.lm_head.cross_entropy(&h, &targets, Some(grad_scale), self.loss_chunk_rows, cap)
        })?;
        timeline::mark(&self.device, || "loss".into())?;
        if prefetch > 0 {
            offloaded.start_backward(next_offloaded(layers))?;
        }
        let d_h = out.d_hidden.expect("asked for the gradient");
        let mut dx =
            rms_norm_backward(&last, &self.norm, self.arch.rms_norm_eps, &d_h)?.reshape((b, t, hidden))?;
        let mut per_layer = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let input = self.layer_input(masks, 0, dropout_seed, l);
            let saved = match kinds[l] {
                LayerKind::Kept | LayerKind::KeptAll => kept[l]
                    .take()
                    .ok_or_else(|| candle_core::Error::Msg(format!("layer {l} was not kept")))?,
                LayerKind::Offloaded => offloaded.pop(l, next_offloaded(l))?,
                LayerKind::Recomputed => layer.recompute(&checkpoints.pop()?, &input)?,
            };
            let (d_in, grads) = layer.backward(saved, &dx, &input)?;
            dx = d_in;
            per_layer.push(grads);
            timeline::mark(&self.device, || format!("backward {l} {:?}", kinds[l]))?;
        }
        per_layer.reverse();
        let grads = per_layer
            .into_iter()
            .flat_map(|g| g.into_iter().flatten())
            .flat_map(|g| [g.lora_a, g.lora_b])
            .collect();
        let d_inputs_embeds = match self.embedding_scale() {
            Some(scale) => (dx * scale)?,
            None => dx,
        };
        Ok(TrainOutput { loss_sum: out.loss_sum, n_tokens: out.n_tokens, grads, d_inputs_embeds })
    }
}

/// Adds freshly initialised adapters (A kaiming-uniform, B zero) to the target modules of
/// `layers` (the model's, or copies of them that carry another adapter).
pub fn add_lora_to(
    layers: &mut [DecoderLayer],
    spec: &LoraSpec,
    seed: u64,
    device: &Device,
) -> candle_core::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for layer in layers {
        for (p, name) in PROJECTIONS.iter().enumerate() {
            if spec.target_modules.iter().any(|t| t == name) {
                let dims = layer.proj[p].base.dims();
                let a = LoraAdapter::init(spec.r, dims, spec.scale(), spec.dropout, &mut rng, device)?;
                layer.proj[p].lora = Some(a);
            }
        }
    }
    Ok(())
}

/// The adapters' tensors of `layers` with their PEFT names, in a fixed order.
pub fn lora_params_of(layers: &[DecoderLayer]) -> Vec<(String, Var)> {
    let mut out = Vec::new();
    for (l, layer) in layers.iter().enumerate() {
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
