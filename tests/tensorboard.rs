//! `train.report_to = ["tensorboard"]` end to end: a run of the tiny random Llama
//! (`common::tiny_smollm2_dir`) on the CPU writes `<output.dir>/tb/events.out.tfevents.*`, and a
//! run resumed from an earlier checkpoint adds a file beside the first. The files are read with
//! this crate's reader (every CRC checked; the values of every step against metrics.jsonl) and
//! with TensorBoard's own EventAccumulator (`scripts/tensorboard_check.py`), from a venv the test
//! installs once (`scripts/tensorboard_install.sh`) where `LORA_FT_TENSORBOARD_PYTHON` names none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lora_ft::train::tensorboard::read::read_events;

mod common;

/// Train on the first 16 shipped dialogues, evaluate on the next 4: 4 steps of 2 rows, an
/// evaluation and a checkpoint every 2 steps.
fn config(root: &Path) -> PathBuf {
    let text = std::fs::read_to_string("datasets/customer-service-v1/train.jsonl").unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(root.join("train.jsonl"), lines[..16].join("\n") + "\n").unwrap();
    std::fs::write(root.join("eval.jsonl"), lines[16..20].join("\n") + "\n").unwrap();
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
train = "{root}/train.jsonl"
eval = "{root}/eval.jsonl"
max_seq_len = 96
[train]
batch_size = 2
max_steps = 4
lr = 1e-3
compute_dtype = "f32"
device = "cpu"
eval_every = 2
report_to = ["tensorboard"]
[checkpoint]
every = 2
keep_last = 0
[output]
dir = "{root}/run"
adapter_name = "a"
adapters_dir = "{root}/adapters"
"#,
        model = common::tiny_smollm2_dir().display(),
        root = root.display()
    );
    let file = root.join("train.toml");
    std::fs::write(&file, toml).unwrap();
    file
}

fn train(config: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(["train", config.to_str().unwrap()])
        .env_remove("WORLD_SIZE")
        .env_remove("RANK")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The event files of `tb`, in name order (TensorBoard's reading order).
fn event_files(tb: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(tb).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// step → `key` of metrics.jsonl (the later record of a step wins), as f32.
fn logged(run: &Path, key: &str) -> BTreeMap<i64, f32> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let records = text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
    records.filter_map(|v| Some((v["step"].as_i64()?, v[key].as_f64()? as f32))).collect()
}

/// step → `tag` over the files in order, as TensorBoard reads them: a restart marker at step
/// S drops what earlier files logged at S and after. Each step once (a second is an error).
fn events(files: &[PathBuf], tag: &str) -> BTreeMap<i64, f32> {
    let mut out = BTreeMap::new();
    for file in files {
        for event in read_events(file).unwrap() {
            if event.session_start {
                out.retain(|&step, _| step < event.step);
            }
            for (t, value) in &event.scalars {
                if t == tag {
                    assert!(out.insert(event.step, *value).is_none(), "{tag} twice at step {}", event.step);
                }
            }
        }
    }
    out
}

#[test]
fn a_run_and_its_resumed_run_write_event_files_tensorboard_reads() {
    let root = std::env::temp_dir().join(format!("lora-ft-tensorboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let cfg = config(&root);
    let run = root.join("run");
    train(&cfg);
    let tb = run.join("tb");
    let first = event_files(&tb);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].file_name().unwrap().to_str().unwrap().starts_with("events.out.tfevents."));
    let first_bytes = std::fs::read(&first[0]).unwrap();
    assert_eq!(events(&first, "train/loss"), logged(&run, "loss"));
    assert_eq!(events(&first, "train/loss").len(), 4);

    // as if killed after logging step 4 and before its checkpoint: the run resumes from step 2
    // and logs steps 3 and 4 again (their tokens/s differ), into a second file
    std::fs::remove_dir_all(run.join("checkpoints/step-4")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100)); // a later second in the name
    train(&cfg);
    let files = event_files(&tb);
    assert_eq!(files.len(), 2, "{files:?}");
    assert_eq!(files[0], first[0]);
    assert_eq!(std::fs::read(&files[0]).unwrap(), first_bytes, "the first run's file changed");
    for (tag, key) in [
        ("train/loss", "loss"),
        ("train/learning_rate", "lr"),
        ("train/grad_norm", "grad_norm"),
        ("train/tokens_per_s", "tokens_per_s"),
        ("train/loss_scale", "loss_scale"),
    ] {
        let got = events(&files, tag);
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4], "{tag}");
        assert_eq!(got, logged(&run, key), "{tag}");
    }
    // the resumed run's own numbers won: its step 3 is not the first run's
    let first_tokens_per_s = events(&first, "train/tokens_per_s");
    assert_ne!(events(&files, "train/tokens_per_s")[&3], first_tokens_per_s[&3]);
    let eval_steps: Vec<i64> = files
        .iter()
        .flat_map(|f| read_events(f).unwrap())
        .filter(|e| !e.scalars.is_empty())
        .filter(|e| e.scalars[0].0 == "eval/loss")
        .map(|e| e.step)
        .collect();
    assert_eq!(eval_steps, [0, 2, 4, 2, 4], "evaluations: each run's first at its start step");
    eprintln!(
        "the event files read back with this crate's reader: every CRC, and the values of metrics.jsonl"
    );

    let python = tensorboard_python();
    let out =
        Command::new(&python).args(["scripts/tensorboard_check.py", run.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scripts/tensorboard_check.py: {text}");
    eprintln!("TensorBoard's EventAccumulator read them too: {text}");
    let _ = std::fs::remove_dir_all(&root);
}

/// `LORA_FT_TENSORBOARD_PYTHON`, else the venv of `scripts/tensorboard_install.sh` in the cache
/// folder, installed here (one test process at a time, through a lock file) where it is missing.
fn tensorboard_python() -> PathBuf {
    if let Some(python) = std::env::var_os("LORA_FT_TENSORBOARD_PYTHON") {
        return PathBuf::from(python);
    }
    let python = lora_ft::cache::dir().join("tensorboard/venv/bin/python3");
    let imports = || {
        Command::new(&python).args(["-c", "import tensorboard"]).output().is_ok_and(|o| o.status.success())
    };
    common::install_once("tensorboard", "tensorboard_install.sh", "python3 -m venv and PyPI", imports);
    assert!(
        imports(),
        "{} cannot import tensorboard: run `bash scripts/tensorboard_install.sh`",
        python.display()
    );
    python
}
