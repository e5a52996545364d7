//! Data-parallel training on CPU workers (`lora-ft train CONFIG --gpus 2 --device cpu`), the
//! path CI can run: the ranks use the CPU collective, the same rendezvous, liveness channel,
//! launcher, sharding and checkpoints as GPU ranks (only the all-reduce differs: NCCL there).
//!
//! The model is a random 2-layer Llama with SmolLM2's tokenizer (`common::tiny_smollm2_dir`),
//! trained on the first 72 shipped dialogues, of which 57 fit 96 tokens: an epoch is 7 global
//! batches of 8 and one of a single row, which leaves rank 0 nothing to train at step 8 (it
//! sends zero gradients); steps 9-12 are the next epoch. LoRA dropout is off: each rank draws its own dropout masks (as DDP does), so only
//! without dropout is a 2-rank run the same computation as a 1-rank run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

mod common;

const STEPS: usize = 12;

/// Relative tolerance of losses and gradient norms between runs that split the same batches
/// differently. Both are f32 computations of the same sums in another order (one GEMM over 8
/// rows against two over 4 added by the all-reduce, the loss summed per rank), so they differ
/// by f32 rounding: at most 2.2e-7 measured over the 12 steps (the test prints it). Ranks that
/// trained the wrong rows are 2e-2 off at step 1, averaged instead of summed gradients 0.5 in
/// the gradient norm (both tried). 1e-5 leaves room for other CPUs' GEMM kernels.
const RTOL: f64 = 1e-5;
/// The final LoRA weights, relative to the largest of them: 1.2e-7 measured.
const ADAPTER_RTOL: f32 = 1e-5;

fn root() -> PathBuf {
    std::env::temp_dir().join(format!("lora-ft-distributed-{}", std::process::id()))
}

/// Called at the end of each test: the last of the four to pass removes the runs they share (a
/// failed test leaves them to look at).
fn passed() {
    static PASSED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if PASSED.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 4 {
        let _ = std::fs::remove_dir_all(root());
    }
}

/// The first `rows` dialogues of the shipped training set.
fn data(rows: usize) -> PathBuf {
    static FILE: OnceLock<PathBuf> = OnceLock::new();
    FILE.get_or_init(|| {
        let text = std::fs::read_to_string("datasets/customer-service-v1/train.jsonl").unwrap();
        let head: Vec<&str> = text.lines().take(rows).collect();
        let file = root().join("train-head.jsonl");
        std::fs::create_dir_all(root()).unwrap();
        std::fs::write(&file, head.join("\n") + "\n").unwrap();
        file
    })
    .clone()
}

/// `<dir>/train.toml` for the tiny model with `batch_size` rows per rank and micro-batch.
fn config(dir: &Path, batch_size: usize, grad_accum: usize) -> PathBuf {
    let toml = format!(
        r#"
[model]
source = "{model}"
quantization = "none"
[lora]
r = 4
alpha = 8
dropout = 0.0
[data]
train = "{data}"
eval = "datasets/customer-service-v1/eval.jsonl"
max_seq_len = 96
[train]
batch_size = {batch_size}
grad_accum = {grad_accum}
max_steps = {STEPS}
lr = 1e-2
warmup_steps = 2
compute_dtype = "f32"
device = "cpu"
seed = 3
eval_every = 6
eval_batches = 2
[checkpoint]
every = 2
keep_last = 0
[output]
dir = "{dir}/run"
adapter_name = "a"
adapters_dir = "{dir}/adapters"
"#,
        model = common::tiny_smollm2_dir().display(),
        data = data(72).display(),
        dir = dir.display()
    );
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("train.toml");
    std::fs::write(&file, toml).unwrap();
    file
}

fn lora_ft(config: &Path, ranks: usize) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    cmd.args(["train", config.to_str().unwrap()]);
    if ranks > 1 {
        cmd.args(["--gpus", &ranks.to_string(), "--device", "cpu"]);
    }
    cmd.env_remove("WORLD_SIZE").env_remove("RANK").env("LORA_FT_PEER_TIMEOUT", "10");
    cmd
}

/// Runs a training to the end, failing the test with its stderr if it fails.
fn train(config: &Path, ranks: usize) {
    let out = lora_ft(config, ranks).stdout(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[derive(Debug, Clone, PartialEq)]
struct Step {
    loss: f64,
    grad_norm: f64,
    trained_tokens: u64,
    epoch: f64,
}

/// step → what metrics.jsonl logged (a resumed run's later line for a step wins).
fn steps(dir: &Path) -> BTreeMap<u64, Step> {
    let text = std::fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap();
    let mut out = BTreeMap::new();
    for v in text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) {
        if let (Some(step), Some(loss)) = (v["step"].as_u64(), v["loss"].as_f64()) {
            let s = Step {
                loss,
                grad_norm: v["grad_norm"].as_f64().unwrap(),
                trained_tokens: v["trained_tokens"].as_u64().unwrap(),
                epoch: v["epoch"].as_f64().unwrap(),
            };
            out.insert(step, s);
        }
    }
    out
}

/// step → (eval loss, eval tokens) as logged.
fn evals(dir: &Path) -> BTreeMap<u64, (f64, u64)> {
    let text = std::fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap();
    let records = text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    records
        .filter_map(|v| Some((v["step"].as_u64()?, (v["eval_loss"].as_f64()?, v["eval_tokens"].as_u64()?))))
        .collect()
}

fn adapter(dir: &Path) -> BTreeMap<String, Vec<f32>> {
    let file = dir.join("adapters/a/adapter_model.safetensors");
    let tensors = candle_core::safetensors::load(&file, &candle_core::Device::Cpu).unwrap();
    tensors.into_iter().map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1::<f32>().unwrap())).collect()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-12)
}

/// Compares the steps both runs logged from `from` on; returns the worst relative loss error.
fn same_curve(a: &BTreeMap<u64, Step>, b: &BTreeMap<u64, Step>, from: u64) -> f64 {
    let keys = |m: &BTreeMap<u64, Step>| m.keys().copied().filter(|&k| k >= from).collect::<Vec<_>>();
    assert_eq!(keys(a), keys(b), "logged steps");
    let mut worst = 0f64;
    for step in keys(a) {
        let (x, y) = (&a[&step], &b[&step]);
        assert_eq!(x.trained_tokens, y.trained_tokens, "step {step}: the same rows");
        assert!((x.epoch - y.epoch).abs() < 1e-12, "step {step}: epoch {} vs {}", x.epoch, y.epoch);
        let (dl, dg) = (rel(x.loss, y.loss), rel(x.grad_norm, y.grad_norm));
        assert!(dl < RTOL, "step {step}: loss {} vs {} ({dl:.1e})", x.loss, y.loss);
        assert!(dg < RTOL, "step {step}: grad norm {} vs {} ({dg:.1e})", x.grad_norm, y.grad_norm);
        worst = worst.max(dl).max(dg);
    }
    worst
}

/// Evaluations at steps 0, 6 and 12 on the same rows, with the same loss within `RTOL` (a
/// resumed run also evaluates where it resumed).
fn same_evals(a: &Path, b: &Path) {
    let (x, y) = (evals(a), evals(b));
    assert_eq!(x.keys().collect::<Vec<_>>(), [&0, &6, &12]);
    for (step, (loss, tokens)) in &x {
        assert!(y.contains_key(step), "no evaluation at {step}: {y:?}");
        assert_eq!(y[step].1, *tokens, "evaluation at {step}: the same rows");
        assert!(rel(y[step].0, *loss) < RTOL, "evaluation at {step}: {} vs {loss}", y[step].0);
    }
}

fn same_adapter(a: &Path, b: &Path) -> f32 {
    let (x, y) = (adapter(a), adapter(b));
    assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>());
    let (mut diff, mut largest) = (0f32, 0f32);
    for (name, v) in &x {
        for (p, q) in v.iter().zip(&y[name]) {
            diff = diff.max((p - q).abs());
            largest = largest.max(p.abs());
        }
    }
    let worst = diff / largest;
    assert!(worst < ADAPTER_RTOL, "adapters differ by {diff:e} (largest weight {largest:e})");
    worst
}

/// A run to the end with `ranks` ranks of `batch` rows and `accum` micro-batches per step, once
/// per test binary (tests compare with the same references).
fn finished_run(ranks: usize, batch: usize, accum: usize) -> PathBuf {
    static RUNS: Mutex<BTreeMap<(usize, usize, usize), PathBuf>> = Mutex::new(BTreeMap::new());
    let mut runs = RUNS.lock().unwrap_or_else(|e| e.into_inner());
    runs.entry((ranks, batch, accum))
        .or_insert_with(|| {
            let dir = root().join(format!("{ranks}x{batch}x{accum}"));
            let started = Instant::now();
            train(&config(&dir, batch, accum), ranks);
            eprintln!(
                "{ranks} rank(s) x batch {batch} x accum {accum}: {:.1} s",
                started.elapsed().as_secs_f64()
            );
            dir
        })
        .clone()
}

/// 2 ranks × batch 4 trains the batches of 1 rank × batch 8: the same loss, gradient norm and
/// trained tokens at every step, and the same adapter; 2 ranks × batch 2 with two micro-batches
/// per step those of 1 rank × batch 4 with two. Only rank 0 writes the metrics.
#[test]
fn two_ranks_of_batch_4_train_as_one_rank_of_batch_8() {
    let reference = finished_run(1, 8, 1);
    let curve = steps(&reference);
    assert_eq!(curve.len(), STEPS);
    assert!(curve[&(STEPS as u64)].loss < curve[&1].loss * 0.9, "training moves the loss: {curve:?}");
    assert!(curve[&8].epoch == 1.0 && curve[&9].epoch > 1.0, "the run crosses an epoch: {curve:?}");
    assert!(
        curve[&8].trained_tokens < curve[&7].trained_tokens / 3,
        "step 8 is the one-row batch: {curve:?}"
    );
    for (two, one) in [((2, 4, 1), (1, 8, 1)), ((2, 2, 2), (1, 4, 2))] {
        let (dir, reference) = (finished_run(two.0, two.1, two.2), finished_run(one.0, one.1, one.2));
        let lines = std::fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap().lines().count();
        assert_eq!(lines, STEPS + 3, "a line per step and evaluation: only rank 0 writes");
        same_evals(&reference, &dir);
        let worst = same_curve(&steps(&reference), &steps(&dir), 1);
        let adapter = same_adapter(&reference, &dir);
        eprintln!("{two:?} against {one:?}: worst relative loss/grad-norm difference {worst:.2e}, adapter {adapter:.2e}");
    }
    passed();
}

/// A launched run with its stderr collected line by line.
struct Launched {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: std::thread::JoinHandle<()>,
}

fn launch(config: &Path, ranks: usize) -> Launched {
    let mut child = lora_ft(config, ranks).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    Launched { child, lines, reader }
}

impl Launched {
    /// The pid the launcher reported for `rank`.
    fn pid_of(&self, rank: usize) -> u32 {
        let needle = format!("rank {rank}: pid ");
        let started = Instant::now();
        loop {
            let found = self.lines.lock().unwrap().iter().find_map(|l| {
                l.split_once(&needle).and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
            });
            if let Some(pid) = found {
                return pid;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no pid for rank {rank}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the launcher; its exit status, how long that took, and its stderr.
    fn finish(mut self) -> (std::process::ExitStatus, Duration, Vec<String>) {
        let started = Instant::now();
        let status = self.child.wait().unwrap();
        let took = started.elapsed();
        self.reader.join().unwrap();
        let lines = self.lines.lock().unwrap().clone();
        (status, took, lines)
    }
}

fn wait_for(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(started.elapsed() < Duration::from_secs(120), "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    assert!(Command::new("cp").arg("-r").arg(from).arg(to).status().unwrap().success());
}

/// SIGKILL on rank 1 of a 2-rank run: the launcher stops within seconds with one error line
/// naming rank 1 and how it died, rank 0 says why it stopped, the newest checkpoint is intact,
/// and the run resumes from it, on 1 rank of batch 8 or 2 of batch 4, to the curve and adapter
/// of a run never interrupted.
#[test]
fn a_killed_rank_stops_the_run_and_its_checkpoint_resumes_on_one_or_two_ranks() {
    let dir = root().join("killed");
    let run = launch(&config(&dir, 4, 1), 2);
    let pid = run.pid_of(1);
    wait_for(&dir.join("run/checkpoints/step-2/trainer_state.json"));
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let (status, took, lines) = run.finish();
    eprintln!("the launcher stopped {:.2} s after the kill", took.as_secs_f64());
    assert!(!status.success(), "the run ended before it could be killed");
    assert!(took < Duration::from_secs(5), "the launcher took {took:?} to stop");
    let errors: Vec<&String> = lines.iter().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one message: {lines:#?}");
    let error = errors[0];
    let expected = format!("error: rank 1 (pid {pid}) was killed by signal 9 (SIGKILL");
    assert!(error.starts_with(&expected), "{error}");
    assert!(
        lines.iter().any(|l| l.starts_with("[rank 0] error: stopping: rank 1 exited without a word")),
        "rank 0 says why it stopped: {lines:#?}"
    );
    let (newest, state) = lora_ft::train::checkpoint::newest_complete(&dir.join("run")).unwrap().unwrap();
    let intact =
        format!("the newest complete checkpoint, step {} ({}), is intact", state.step, newest.display());
    assert!(lines.iter().any(|l| l.contains(&intact)), "{intact}: {lines:#?}");
    assert!(state.step >= 2 && state.step < STEPS, "{state:?}");
    assert_eq!((state.world_size, state.rows_per_step, state.batch_size), (Some(2), Some(8), Some(4)));
    assert!(!dir.join("adapters/a").exists());

    let reference = finished_run(1, 8, 1);
    for (ranks, batch) in [(1, 8), (2, 4)] {
        let resumed = root().join(format!("killed-resumed-on-{ranks}"));
        copy_dir(&dir.join("run"), &resumed.join("run"));
        train(&config(&resumed, batch, 1), ranks);
        let worst = same_curve(&steps(&reference), &steps(&resumed), 1);
        same_evals(&reference, &resumed);
        same_adapter(&reference, &resumed);
        eprintln!("killed at step {}, resumed on {ranks} rank(s): worst difference {worst:.2e}", state.step);
    }
    passed();
}

/// A checkpoint of a 1-rank run resumed on 2 ranks continues the same data order: steps 7-12
/// as the uninterrupted 1-rank run, and the same adapter.
#[test]
fn a_one_rank_checkpoint_resumes_on_two_ranks() {
    let reference = finished_run(1, 8, 1);
    let dir = root().join("one-to-two");
    copy_dir(&reference.join("run"), &dir.join("run"));
    for step in [8, 10, 12] {
        std::fs::remove_dir_all(dir.join(format!("run/checkpoints/step-{step}"))).unwrap();
    }
    let metrics = dir.join("run/metrics.jsonl");
    // what the run had logged when its step-6 checkpoint was written: evaluations 0 and 6, steps 1-6
    let text = std::fs::read_to_string(&metrics).unwrap();
    let step = |l: &str| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap();
    let head: Vec<&str> = text.lines().filter(|l| step(l) <= 6).collect();
    assert_eq!(head.len(), 8);
    std::fs::write(&metrics, head.join("\n") + "\n").unwrap();
    train(&config(&dir, 4, 1), 2);
    let lines = std::fs::read_to_string(&metrics).unwrap().lines().count();
    assert_eq!(lines, 8 + 8, "evaluation 6 again (on resuming), steps 7-12 and evaluation 12");
    same_evals(&reference, &dir);
    same_curve(&steps(&reference), &steps(&dir), 1);
    same_adapter(&reference, &dir);
    passed();
}

/// Ctrl-C to the launcher: every rank checkpoints the same step and stops (exit 130, as one
/// process); the same command then finishes the run on the uninterrupted curve.
#[test]
fn a_signal_to_the_launcher_stops_every_rank_after_one_checkpoint() {
    let dir = root().join("interrupted");
    let cfg = config(&dir, 4, 1);
    let run = launch(&cfg, 2);
    wait_for(&dir.join("run/checkpoints/step-2/trainer_state.json"));
    let pid = run.child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    let (status, _, lines) = run.finish();
    assert_eq!(status.code(), Some(130), "{lines:#?}");
    let stops: Vec<&String> =
        lines.iter().filter(|l| l.contains("error: stopped by a signal at step")).collect();
    assert_eq!(stops.len(), 2, "both ranks stop: {lines:#?}");
    let at = |l: &str| l.split("at step ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    assert_eq!(at(stops[0]), at(stops[1]), "at the same step");
    let step: usize = at(stops[0]).parse().unwrap();
    assert!(dir.join(format!("run/checkpoints/step-{step}")).exists());
    train(&cfg, 2);
    same_curve(&steps(&finished_run(1, 8, 1)), &steps(&dir), 1);
    passed();
}
