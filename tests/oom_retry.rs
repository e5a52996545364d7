//! A step that runs out of GPU memory in its forward and backward runs again, first with the
//! memory pool trimmed, then with one layer's activations fewer kept (train/recovery.rs), and the
//! run goes on as if nothing had happened: the same loss curve and adapter, to the bit, as a run
//! that never ran out. A step with no layer left to give up stops the run with the planner's
//! numbers and the resume point, the checkpoints before it kept. The failures are injected
//! (`LORA_FT_INJECT_OOM`) into the tiny model on the CPU, in the last micro-batch of a step of
//! two, so each retry also drops what the first one computed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;

/// `<dir>/train.toml`: the tiny model, LoRA dropout on (the retry must draw the same masks), two
/// micro-batches a step, `checkpointing` as given.
fn config(dir: &Path, checkpointing: &str) -> PathBuf {
    let train = format!(
        "batch_size = 2\ngrad_accum = 2\nmax_steps = 5\nlr = 1e-2\nwarmup_steps = 1\nseed = 5\n\
         checkpointing = \"{checkpointing}\""
    );
    common::tiny_cpu_config(dir, "r = 4\nalpha = 8\ndropout = 0.1", &train, "every = 2\nkeep_last = 0")
}

fn train(config: &Path, inject: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    cmd.args(["train", config.to_str().unwrap()]).stdout(Stdio::null());
    cmd.env_remove("LORA_FT_INJECT_OOM");
    if let Some(steps) = inject {
        cmd.env("LORA_FT_INJECT_OOM", steps);
    }
    cmd.output().unwrap()
}

/// step → (loss, grad_norm) bits as metrics.jsonl logged them.
fn curve(dir: &Path) -> Vec<(u64, u64, u64)> {
    let text = std::fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            Some((v["step"].as_u64()?, v["loss"].as_f64()?.to_bits(), v["grad_norm"].as_f64()?.to_bits()))
        })
        .collect()
}

#[test]
fn a_step_out_of_memory_runs_again_and_the_run_ends_as_one_that_never_ran_out() {
    let root = std::env::temp_dir().join(format!("lora-ft-oom-retry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (whole, retried, stopped) = (root.join("whole"), root.join("retried"), root.join("stopped"));

    // every layer kept ("none" recomputes nothing): two layers to give up, one at each failure
    let out = train(&config(&whole, "none"), None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // step 2 runs out twice (trimmed, then a layer fewer), step 4 once: its shape was trimmed
    // at step 2 already, so it gives up a layer at once
    let out = train(&config(&retried, "none"), Some("2*2,4"));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let said = |step: usize, what: &str| {
        log.contains(&format!("step {step}: out of GPU memory in its forward and backward; {what}"))
    };
    let (trimmed, fewer) =
        ("runs again with the memory pool trimmed", "the steps of its shape from now on keep one layer's");
    assert!(said(2, trimmed) && said(2, fewer) && !said(4, trimmed) && said(4, fewer), "{log}");
    let (a, b) = (curve(&whole), curve(&retried));
    assert_eq!(a.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    assert_eq!(a, b, "(step, loss bits, grad norm bits)");
    let adapter = |run: &Path| std::fs::read(run.join("adapters/a/adapter_model.safetensors")).unwrap();
    assert_eq!(adapter(&whole), adapter(&retried));

    // every layer recomputed already ("full"): nothing to give up, the run stops at step 3 with
    // the planner's numbers and the resume point, and step 2's checkpoint stays
    let out = train(&config(&stopped, "full"), Some("3*2"));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a step out of memory with nothing to give up went on:\n{log}");
    assert!(log.contains("out of GPU memory at step 3, forward and backward phase"), "{log}");
    assert!(log.contains("the newest complete checkpoint, step 2"), "{log}");
    assert!(log.contains(trimmed) && !log.contains(fewer), "{log}");
    assert!(stopped.join("run/checkpoints/step-2/trainer_state.json").exists());
    assert_eq!(curve(&stopped), a[..2], "the steps before the failure");
    let _ = std::fs::remove_dir_all(&root);
}
