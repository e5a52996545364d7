//! The run put together once: a training config, the model's config.json and the GPU's memory
//! budget resolved into what every part of a run reads — the LoRA settings, the shapes, the
//! planner's view of the run, the budget, and the policy the model's steps follow. Training's
//! setup, `batch_size = "auto"`, the out-of-memory advice, `lora-ft estimate` and `init`, and
//! `lora-ft bench` read it instead of the config.

use candle_core::Device;

use super::{check_fits, estimate, host_budget, largest_batch, layer_plan, OptimizerState, RunShape};
use crate::arch::ModelConfig;
use crate::config::{BatchSize, Checkpointing, ComputeDtype, Config, QuantizationKind};
use crate::memory::{VramBudget, GIB};
use crate::model::activations::{KeptLayers, LayerPlan};
use crate::model::decoder::LOSS_CHUNK_ROWS;
use crate::model::layer::tiles::MLP_TILE_VALUES;
use crate::model::{LoraSpec, TrainingPolicy};

/// A training run as its parts read it, resolved once from the config, the model's config.json
/// and the device's memory budget.
#[derive(Debug, Clone)]
pub struct Run {
    /// The model's config.json.
    pub model: ModelConfig,
    /// The longest row in tokens (`data.max_seq_len`): what rows are cut to and what the memory
    /// plan is for.
    pub max_seq_len: usize,
    /// Rows per micro-batch as configured: a number, or "auto" (probed once the model is loaded).
    pub batch_size: BatchSize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// What the planner predicts the run's memory from, the LoRA settings among it (`lora`).
    pub run_shape: RunShape,
    /// The GPU memory the run may use; `None` off a GPU.
    pub budget: Option<VramBudget>,
    /// What a step keeps for its backward (`train.checkpointing`).
    pub checkpointing: Checkpointing,
}

impl Run {
    /// `cfg` on a model of config.json `model`, within `budget` (`VramBudget::of` the device, or
    /// a card's for planning).
    pub fn resolve(cfg: &Config, model: ModelConfig, budget: Option<VramBudget>) -> Self {
        let t = &cfg.train;
        let run_shape = RunShape {
            dtype_bytes: if t.compute_dtype == ComputeDtype::F32 { 4 } else { 2 },
            nf4: (cfg.model.quantization == QuantizationKind::Nf4).then_some(cfg.model.double_quant),
            lora: cfg.lora.clone(),
            optimizer: OptimizerState::of(cfg),
            embeddings_on_host: true,
            loss_chunk_rows: LOSS_CHUNK_ROWS,
            accumulates_gradients: t.grad_accum > 1,
            host_offload: t.host_offload,
            fused_attention: t.compute_dtype != ComputeDtype::F32,
            fused_loss: true,
            mlp_tiles: t.mlp_tiles,
            layers: LayerPlan {
                kept: match t.checkpointing {
                    Checkpointing::None => usize::MAX,
                    _ => 0,
                },
                ..LayerPlan::NONE
            },
            host_budget: offload_budget(t.host_offload),
        };
        Self {
            model,
            max_seq_len: cfg.data.max_seq_len,
            batch_size: t.batch_size,
            grad_accum: t.grad_accum,
            run_shape,
            budget,
            checkpointing: t.checkpointing,
        }
    }

    /// The adapters: rank, alpha, dropout, target modules, rsLoRA (`lora` of the config).
    pub fn lora(&self) -> &LoraSpec {
        &self.run_shape.lora
    }

    /// Rows of the steps before "auto" is probed: the configured number, else 1.
    pub fn first_batch(&self) -> usize {
        match self.batch_size {
            BatchSize::Fixed(n) => n,
            BatchSize::Auto => 1,
        }
    }

    /// A fixed batch the planner says cannot fit the budget refused with settings that do,
    /// before anything is loaded.
    pub fn check_fits(&self) -> anyhow::Result<()> {
        if let (BatchSize::Fixed(batch), Some(budget)) = (self.batch_size, self.budget) {
            check_fits(&self.model, &self.run_shape, (self.max_seq_len, batch), budget.bytes())
                .map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }

    /// The largest batch of `max_seq_len` tokens the planner predicts within `budget` bytes.
    pub fn largest_batch(&self, budget: u64) -> usize {
        largest_batch(&self.model, &self.run_shape, self.max_seq_len, budget)
    }

    /// The policy the model's training steps follow: the layers kept per step shape
    /// (`train.checkpointing`: for "auto", as many as the planner predicts within the budget,
    /// none without one), the MLP's row tiles and the checkpoints' place. The host memory that
    /// offloaded layers may take is read as the policy is made: after the weights are loaded,
    /// what the host has left.
    pub fn training_policy(&self, device: &Device) -> TrainingPolicy {
        let kept_layers = match (self.checkpointing, self.budget) {
            (Checkpointing::Full, _) | (Checkpointing::Auto, None) => KeptLayers::none(),
            (Checkpointing::None, _) => KeptLayers::all(),
            (Checkpointing::Auto, Some(budget)) => {
                let host_budget = offload_budget(self.run_shape.host_offload);
                let run = RunShape { host_budget, ..self.run_shape.clone() };
                let (m, bytes) = (self.model.clone(), budget.bytes());
                KeptLayers::by(move |shape| layer_plan(&m, &run, shape, bytes))
            }
        };
        TrainingPolicy {
            kept_layers,
            mlp_tile_values: if self.run_shape.mlp_tiles { MLP_TILE_VALUES } else { usize::MAX },
            offload_checkpoints: self.run_shape.host_offload && device.is_cuda(),
        }
    }

    /// What the planner says after a step of `batch` rows ran out of GPU memory: its predicted
    /// peak, and the batch that fits the budget.
    pub fn oom_advice(&self, batch: usize) -> String {
        let gib = |b: u64| b as f64 / GIB;
        let seq = self.max_seq_len;
        let predicted = estimate(&self.model, &self.run_shape, (seq, batch)).peak();
        match self.budget {
            Some(budget) => format!(
                "the planner predicts {:.2} GiB for batch {batch} x {seq}; train.batch_size = {} fits within \
                 {:.2} GiB (lora-ft estimate CONFIG shows the parts)",
                gib(predicted),
                self.largest_batch(budget.bytes()),
                gib(budget.bytes())
            ),
            None => format!("the planner predicts {:.2} GiB for batch {batch} x {seq}", gib(predicted)),
        }
    }
}

/// Page-locked host memory offloaded layers may take with `host_offload` on (`host_budget`),
/// none without.
fn offload_budget(host_offload: bool) -> u64 {
    if host_offload {
        host_budget()
    } else {
        0
    }
}
