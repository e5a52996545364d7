//! Runs that survive: a training killed with SIGKILL after a checkpoint and started again with
//! the same command (resume = "auto") produces the same loss curve, to the bit, as one that was
//! never interrupted — on the real SmolLM2-135M on the CPU, with LoRA dropout on. A corrupt
//! newer checkpoint left behind is skipped with a warning; Ctrl-C checkpoints and stops.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn config(run: &Path) -> PathBuf {
    common::smollm2_cpu_config(
        run,
        "r = 4\nalpha = 8\ndropout = 0.1",
        "batch_size = 2\nmax_steps = 8\nlr = 1e-3\nwarmup_steps = 2\nlog_every = 1",
        "every = 2\nkeep_last = 0",
    )
}

fn train(config: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    cmd.args(["train", config.to_str().unwrap()]).stdout(Stdio::null()).stderr(Stdio::null());
    cmd
}

/// step → loss as logged (the last record of a step wins: a killed run may log a step twice).
fn losses(run: &Path) -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string(run.join("run/metrics.jsonl")).unwrap();
    let mut by_step = std::collections::BTreeMap::new();
    for v in text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()) {
        if let (Some(step), Some(loss)) = (v["step"].as_u64(), v["loss"].as_f64()) {
            by_step.insert(step, loss.to_bits());
        }
    }
    by_step.into_iter().collect()
}

#[test]
fn a_run_killed_and_resumed_has_the_loss_curve_of_one_never_interrupted() {
    let root = std::env::temp_dir().join(format!("lora-ft-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (whole, killed) = (root.join("whole"), root.join("killed"));
    assert!(train(&config(&whole)).status().unwrap().success());

    let cfg = config(&killed);
    let mut child = train(&cfg).spawn().unwrap();
    let step4 = killed.join("run/checkpoints/step-4");
    let started = Instant::now();
    while !step4.exists() {
        assert!(started.elapsed() < Duration::from_secs(600), "no checkpoint at step 4");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL: no handler runs
    assert!(!child.wait().unwrap().success(), "the run ended before it could be killed");
    assert!(!killed.join("run/checkpoints/step-8").exists());
    // a newer checkpoint that is not whole: resume must skip it
    let corrupt = killed.join("run/checkpoints/step-6");
    let _ = std::fs::remove_dir_all(&corrupt);
    std::fs::create_dir_all(&corrupt).unwrap();
    std::fs::write(corrupt.join("trainer_state.json"), "{ not json").unwrap();

    assert!(train(&cfg).status().unwrap().success());
    let (a, b) = (losses(&whole), losses(&killed));
    assert_eq!(a.len(), 8);
    assert_eq!(a, b, "loss curves (f64 bits per step)");
    let adapter = |run: &Path| std::fs::read(run.join("adapters/a/adapter_model.safetensors")).unwrap();
    assert_eq!(adapter(&whole), adapter(&killed));

    // Ctrl-C (SIGINT) checkpoints the step in progress and stops; the same command goes on
    let stopped = root.join("stopped");
    let cfg = config(&stopped);
    let mut child = train(&cfg).spawn().unwrap();
    let started = Instant::now();
    while !stopped.join("run/checkpoints/step-2").exists() {
        assert!(started.elapsed() < Duration::from_secs(600), "no checkpoint at step 2");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    assert!(!child.wait().unwrap().success(), "a stopped run exits with an error status");
    let steps = lora_ft::train::checkpoint::list(&stopped.join("run")).unwrap();
    let last = steps.iter().max().copied().unwrap();
    assert!((3..8).contains(&last), "a checkpoint of the step in progress, got {steps:?}");
    assert!(train(&cfg).status().unwrap().success());
    assert_eq!(losses(&stopped), a);

    // the same command once more: the run is finished, so nothing is trained, and it says so
    let again = train(&cfg).stdout(Stdio::piped()).output().unwrap();
    assert!(again.status.success());
    let said = String::from_utf8_lossy(&again.stdout);
    assert!(said.contains("nothing left to train") && said.contains("step 8 of 8"), "{said}");
    assert_eq!(losses(&stopped), a, "a finished run's log gains no step");
    std::fs::remove_dir_all(&root).ok();
}
