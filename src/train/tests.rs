//! The setup's refusals and the out-of-memory report, on the tiny Llama fixture.

use std::path::{Path, PathBuf};

use anyhow::Context;

use candle_core::{DType, Device};

use super::checkpoint::TrainerState;
use super::setup::{batch_size, check_token_ids};
use super::{is_out_of_memory, oom_report, run, Phase};
use crate::config::Config;
use crate::model::CausalLm;
use crate::plan::run::Run;
use crate::quant::Quantization;

#[test]
fn a_token_id_past_the_embedding_table_is_refused() {
    let examples = vec![crate::data::Example {
        input_ids: vec![1, 2, 99],
        labels: vec![-100, 2, 99],
        ..Default::default()
    }];
    let file = Path::new("data/train.jsonl");
    assert!(check_token_ids(&examples, 100, file).is_ok());
    let err = check_token_ids(&examples, 99, file).unwrap_err().to_string();
    assert!(
        err.contains("data/train.jsonl") && err.contains("token id 99") && err.contains("99 rows"),
        "{err}"
    );
}

fn tiny_llama() -> (PathBuf, CausalLm) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
    let (config, weights) = crate::hub::local_weights(&dir).unwrap();
    let model = CausalLm::load(&config, &weights, DType::F32, Quantization::None, &Device::Cpu).unwrap();
    (dir, model)
}

/// A config of the tiny Llama with `train` (TOML lines), its run directory under a temp dir.
fn tiny_config(model_dir: &Path, train: &str, name: &str) -> Config {
    let run = std::env::temp_dir().join(format!("lora-ft-{name}-{}", std::process::id()));
    let toml = format!(
        "[model]\nsource = \"{}\"\n[data]\ntrain = \"t.jsonl\"\nmax_seq_len = 64\n[train]\n\
         {train}\n[output]\ndir = \"{}\"\n",
        model_dir.display(),
        run.display()
    );
    Config::from_toml(&toml, Path::new("run.toml")).unwrap()
}

/// A CUDA out-of-memory error becomes one message with the step, the phase, the planner's
/// advice and the checkpoint to resume from; other errors are not taken for one.
#[test]
fn out_of_memory_is_reported_with_step_phase_and_advice() {
    let (dir, model) = tiny_llama();
    let cfg = tiny_config(&dir, "batch_size = 4", "oom");
    let oom = Err::<(), _>(anyhow::anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"))
        .context(Phase("optimizer"))
        .unwrap_err();
    assert!(is_out_of_memory(&oom));
    let run = Run::resolve(&cfg, model.config().clone(), None);
    let text = oom_report(&oom, (7, 4), (&run, &cfg), &model);
    assert!(text.starts_with("out of GPU memory at step 7, optimizer phase"), "{text}");
    assert!(text.contains("the planner predicts") && text.contains("batch 4 x 64"), "{text}");
    assert!(text.contains("no checkpoint was written yet"), "{text}");
    assert!(!is_out_of_memory(&anyhow::anyhow!("shape mismatch")));
    let cublas = anyhow::anyhow!("cublas error: CUBLAS_STATUS_ALLOC_FAILED").context(Phase("backward"));
    assert!(is_out_of_memory(&cublas));
}

/// Only a step that ran out of memory while computing its gradients runs again: not one out of
/// memory in its update (the optimizer may have written part of the weights), nor another error.
#[test]
fn only_out_of_memory_in_the_forward_and_backward_runs_again() {
    use super::step::{may_run_again, FORWARD_AND_BACKWARD};
    let oom = || anyhow::anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")");
    assert!(may_run_again(&oom().context(Phase(FORWARD_AND_BACKWARD))));
    assert!(!may_run_again(&oom().context(Phase("optimizer"))));
    assert!(!may_run_again(&oom()));
    assert!(!may_run_again(&anyhow::anyhow!("shape mismatch").context(Phase(FORWARD_AND_BACKWARD))));
    // the step's own wrapping: candle's error, then the phase, then more context above it
    let wrapped = Err::<(), _>(oom()).context(Phase(FORWARD_AND_BACKWARD)).context("step 3").unwrap_err();
    assert!(may_run_again(&wrapped));
}

/// "auto" is refused on the CPU before anything is read; a resumed "auto" run keeps its
/// checkpoint's batch size, a fixed one its own.
#[test]
fn auto_batch_size_is_refused_on_the_cpu_and_kept_from_a_checkpoint() {
    let (dir, model) = tiny_llama();
    let auto = tiny_config(&dir, "batch_size = \"auto\"\ndevice = \"cpu\"", "auto");
    let err = match run(&auto, None) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("\"auto\" trained on the CPU"),
    };
    assert!(err.contains("\"auto\" probes GPU memory") && err.contains("set a number"), "{err}");
    assert!(!auto.output.dir.exists());
    let resolved = |cfg: &Config| Run::resolve(cfg, model.config().clone(), None);
    let err = batch_size(&auto, &resolved(&auto), &model, (100, None)).unwrap_err().to_string();
    assert!(err.contains("\"auto\" probes GPU memory"), "{err}");
    let state = TrainerState {
        step: 3,
        total_steps: 10,
        epoch: 0,
        batch_in_epoch: 3,
        seed: 42,
        loss_scaler: None,
        batch_size: Some(6),
        rows_in_epoch: None,
        world_size: None,
        rows_per_step: None,
        optimizer: None,
    };
    assert_eq!(batch_size(&auto, &resolved(&auto), &model, (100, Some(&state))).unwrap(), 6);
    let fixed = tiny_config(&dir, "batch_size = 4", "fixed");
    assert_eq!(batch_size(&fixed, &resolved(&fixed), &model, (100, Some(&state))).unwrap(), 4);
}
