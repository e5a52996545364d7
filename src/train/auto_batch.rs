//! `train.batch_size = "auto"`: the largest batch of `data.max_seq_len` tokens that fits the GPU
//! budget, found before training the way users find it by hand in PyTorch — run a full-length
//! step, watch for an out-of-memory error or a peak over the budget, try another size. The
//! planner's prediction is the first guess, so a search takes a few probes.

use std::fmt;

use anyhow::Context;
use candle_core::Tensor;

use crate::config::Config;
use crate::memory::{pool_memory, reset_peak, VramBudget, GIB};
use crate::model::CausalLm;
use crate::optim::Optimizer;
use crate::plan::run::Run;

/// How one probe step went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Probe {
    /// It ran within the budget (`peak`: the memory pool's, `None` where it cannot be read).
    Fits {
        peak: Option<u64>,
    },
    /// It ran, but its peak went over the budget.
    OverBudget {
        peak: u64,
    },
    OutOfMemory,
}

impl Probe {
    pub fn fits(&self) -> bool {
        matches!(self, Probe::Fits { .. })
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let gib = |b: &u64| *b as f64 / GIB;
        match self {
            Probe::Fits { peak: Some(p) } => write!(f, "peak {:.2} GiB, fits", gib(p)),
            Probe::Fits { peak: None } => write!(f, "fits (peak unknown)"),
            Probe::OverBudget { peak } => write!(f, "peak {:.2} GiB, over the budget", gib(peak)),
            Probe::OutOfMemory => write!(f, "out of memory"),
        }
    }
}

/// The largest batch in [1, `limit`] that `probe` says fits, a batch of `seq` tokens per row;
/// fitting is taken to be monotone (what fits, fits at any smaller batch). From `start` (the
/// planner's guess) it goes up by a quarter while batches fit, or down by a fifth until one
/// does, then bisects between the largest fit and the smallest failure. A probe's error (other
/// than running out of memory, which is a `Probe`) ends the search.
pub fn search(
    start: usize,
    limit: usize,
    seq: usize,
    mut probe: impl FnMut(usize) -> anyhow::Result<Probe>,
) -> anyhow::Result<usize> {
    let limit = limit.max(1);
    // lo: the largest batch known to fit (0: none yet); hi: the smallest known not to
    // (limit + 1: none yet)
    let (mut lo, mut hi, mut probes) = (0, limit + 1, 0);
    let mut batch = start.clamp(1, limit);
    let last = loop {
        let outcome = probe(batch)?;
        probes += 1;
        tracing::info!("batch_size = \"auto\": probe {batch} x {seq}: {outcome}");
        if outcome.fits() {
            lo = batch;
        } else {
            hi = batch;
        }
        if hi - lo <= 1 {
            break outcome;
        }
        batch = match (lo, hi > limit) {
            (_, true) => (lo + 1).max(lo * 5 / 4).min(limit),
            (0, false) => hi * 4 / 5, // hi ≥ 2 here
            _ => (lo + hi) / 2,
        };
    };
    anyhow::ensure!(
        lo > 0,
        "train.batch_size = \"auto\": not even batch 1 x {seq} tokens fits ({last}); lower \
         data.max_seq_len ({seq}), adapt fewer lora.target_modules, or raise train.max_vram_fraction"
    );
    let capped = if lo == limit { ", the largest it tries" } else { "" };
    tracing::info!("batch_size = \"auto\": training at batch {lo} x {seq} ({probes} probes{capped})");
    Ok(lo)
}

/// One probe: the forward and backward of `batch` random rows of `seq` tokens on `model` (no
/// optimizer step, so the adapters are unchanged), judged by `budget`. What it allocated is
/// freed when it returns.
pub fn probe_step(
    model: &CausalLm,
    (seq, batch): (usize, usize),
    budget: &VramBudget,
    seed: u64,
) -> anyhow::Result<Probe> {
    let device = model.device();
    let rows = crate::data::Batch::random(model.config().vocab_size as u32, (seq, batch), seed);
    reset_peak(device);
    let step = || -> anyhow::Result<()> {
        let ids = super::batch_tensor(&rows, device)?;
        model.forward_backward(&ids, &rows.labels, 1.0 / (seq * batch) as f64, Some(seed))?;
        Ok(())
    };
    match step() {
        Err(e) if crate::memory::is_out_of_memory(&e) => Ok(Probe::OutOfMemory),
        Err(e) => Err(e.context(format!("batch_size = \"auto\": probing batch {batch} x {seq}"))),
        Ok(()) => Ok(match pool_memory(device).map(|p| p.peak_allocated) {
            Some(peak) if peak > budget.bytes() => Probe::OverBudget { peak },
            peak => Probe::Fits { peak },
        }),
    }
}

/// The batch size "auto" trains with, probed on `model`'s GPU: from the planner's largest batch
/// at the run's `max_seq_len` up to twice that, and at most the training set's `examples`. The
/// optimizer's state, and with accumulation the gradient sum, are held through the probes as
/// through every training step. Refused without the run's budget (off a GPU).
pub fn probe_batch_size(cfg: &Config, run: &Run, model: &CausalLm, examples: usize) -> anyhow::Result<usize> {
    let device = model.device();
    let budget = run.budget.with_context(|| refused_on(device))?;
    let (seq, planned) = (run.max_seq_len, run.largest_batch(budget.bytes()));
    let limit = (2 * planned).min(examples).max(1);
    tracing::info!(
        "batch_size = \"auto\": the planner predicts batch {planned} x {seq} within {:.2} GiB; probing up to {limit}",
        budget.bytes() as f64 / GIB
    );
    let batch = {
        let _held = held_through_steps(model, cfg, run.grad_accum)?;
        search(planned, limit, seq, |b| probe_step(model, (seq, b), &budget, cfg.train.seed))?
    };
    // the training loop checks each step's peak against the budget: the probes' must not count
    reset_peak(device);
    Ok(batch)
}

/// Why "auto" is refused on `device` (the CPU, with no GPU memory to probe).
pub fn refused_on(device: &candle_core::Device) -> String {
    format!(
        "train.batch_size = \"auto\" probes GPU memory, and the device is {device:?}: set a number \
         (e.g. batch_size = 4)"
    )
}

/// The optimizer's state and, with `grad_accum` > 1, the f32 gradient sum.
fn held_through_steps(
    model: &CausalLm,
    cfg: &Config,
    grad_accum: usize,
) -> anyhow::Result<(Optimizer, Vec<Tensor>)> {
    let params: Vec<_> = model.lora_params().into_iter().map(|(_, v)| v).collect();
    let sum = if grad_accum > 1 {
        params.iter().map(|p| p.as_tensor().zeros_like()).collect::<candle_core::Result<_>>()?
    } else {
        Vec::new()
    };
    Ok((Optimizer::new(params, &cfg.optim, cfg.train.weight_decay)?, sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe that fits up to `max` rows (peaks of 1 GiB per row) and runs out of memory above,
    /// recording the batches it was asked for.
    fn fits_up_to(max: usize, asked: &mut Vec<usize>) -> impl FnMut(usize) -> anyhow::Result<Probe> + '_ {
        move |b| {
            asked.push(b);
            Ok(if b <= max { Probe::Fits { peak: Some((b as u64) << 30) } } else { Probe::OutOfMemory })
        }
    }

    #[test]
    fn a_probe_is_a_full_step_that_leaves_the_adapters_unchanged() {
        use candle_core::{DType, Device};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
        let (config, weights) = crate::hub::local_weights(&dir).unwrap();
        let quantization = crate::quant::Quantization::None;
        let mut model = CausalLm::load(&config, &weights, DType::F32, quantization, &Device::Cpu).unwrap();
        let targets = crate::model::PROJECTIONS.iter().map(|p| p.to_string()).collect();
        let spec =
            crate::model::LoraSpec { r: 4, alpha: 8.0, dropout: 0.1, target_modules: targets, rslora: false };
        model.add_lora(&spec, 0).unwrap();
        let values = |m: &CausalLm| -> Vec<Vec<f32>> {
            m.lora_params().iter().map(|(_, v)| v.flatten_all().unwrap().to_vec1().unwrap()).collect()
        };
        let before = values(&model);
        let budget = VramBudget::new(1 << 30, Some(1.0));
        // the CPU has no pool to read a peak from
        assert_eq!(probe_step(&model, (32, 3), &budget, 0).unwrap(), Probe::Fits { peak: None });
        assert_eq!(values(&model), before);
        // past the model's 128 positions: an error, not "does not fit"
        let err = probe_step(&model, (256, 1), &budget, 0).unwrap_err();
        assert!(format!("{err:#}").starts_with("batch_size = \"auto\": probing batch 1 x 256"), "{err:#}");
    }

    #[test]
    fn finds_the_largest_fit_from_above_and_below() {
        for start in [20, 5, 13, 14, 1, 26] {
            let mut asked = Vec::new();
            assert_eq!(search(start, 40, 2048, fits_up_to(13, &mut asked)).unwrap(), 13, "start {start}");
            assert!(asked.contains(&13) && asked.contains(&14), "start {start}: {asked:?}");
            let mut unique = asked.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), asked.len(), "start {start}: a batch probed twice: {asked:?}");
        }
        let mut asked = Vec::new();
        search(20, 40, 2048, fits_up_to(13, &mut asked)).unwrap();
        assert_eq!(asked, [20, 16, 12, 14, 13]);
    }

    #[test]
    fn stops_at_the_limit_and_starts_within_it() {
        let mut asked = Vec::new();
        assert_eq!(search(6, 10, 512, fits_up_to(100, &mut asked)).unwrap(), 10);
        assert_eq!(asked.last(), Some(&10));
        assert!(asked.iter().all(|&b| b <= 10), "{asked:?}");
        let mut asked = Vec::new();
        // the planner saying nothing fits still tries batch 1
        assert_eq!(search(0, 0, 512, fits_up_to(100, &mut asked)).unwrap(), 1);
        assert_eq!(asked, [1]);
    }

    #[test]
    fn over_budget_is_not_a_fit() {
        let probe = |b: usize| {
            Ok(if b <= 7 {
                Probe::Fits { peak: Some(b as u64) }
            } else {
                Probe::OverBudget { peak: b as u64 }
            })
        };
        assert_eq!(search(10, 20, 1024, probe).unwrap(), 7);
    }

    #[test]
    fn nothing_fitting_names_the_sequence_length_and_what_to_lower() {
        let err = search(8, 16, 4096, |_| Ok(Probe::OutOfMemory)).unwrap_err().to_string();
        assert!(err.contains("not even batch 1 x 4096 tokens fits (out of memory)"), "{err}");
        assert!(err.contains("data.max_seq_len (4096)") && err.contains("train.max_vram_fraction"), "{err}");
    }

    #[test]
    fn other_errors_end_the_search_as_they_are() {
        let mut asked = Vec::new();
        let probe = |b: usize| {
            asked.push(b);
            match b {
                b if b > 12 => anyhow::bail!("CUDA_ERROR_ILLEGAL_ADDRESS"),
                b => Ok(Probe::Fits { peak: Some(b as u64) }),
            }
        };
        let err = search(10, 40, 1024, probe).unwrap_err();
        assert_eq!(err.to_string(), "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(asked, [10, 12, 15]);
    }
}
