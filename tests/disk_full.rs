//! A disk that fills up during a checkpoint: the run stops with one message naming the file, the
//! checkpoint it was writing and the one that is intact; the intact checkpoint is untouched
//! (byte for byte, not pruned) and no temporary folder is left. The full disk is real to the
//! process: a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) set on the running child after
//! its first checkpoint makes the next large write fail with EFBIG, no privileges needed.
#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lora_ft::train::checkpoint;

mod common;

fn config(root: &Path) -> PathBuf {
    common::smollm2_cpu_config(
        root,
        "r = 4\nalpha = 8\ntarget_modules = [\"q_proj\", \"v_proj\"]",
        "batch_size = 1\nmax_steps = 4",
        "every = 1\nkeep_last = 1",
    )
}

/// Every file of a folder with its bytes.
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let files = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
    files.map(|f| (f.file_name().unwrap().to_string_lossy().into(), std::fs::read(&f).unwrap())).collect()
}

fn signal(pid: u32, sig: libc::c_int) {
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0, "kill({pid}, {sig})");
}

/// Files the child writes from now on may not grow past `bytes`.
fn limit_file_size(pid: u32, bytes: u64) {
    let limit = libc::rlimit { rlim_cur: bytes, rlim_max: libc::RLIM_INFINITY };
    let set = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_FSIZE, &limit, std::ptr::null_mut()) };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn a_full_disk_during_a_checkpoint_stops_with_one_message_and_keeps_the_last_one() {
    let root = std::env::temp_dir().join(format!("lora-ft-disk-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut train = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    train.args(["train", config(&root).to_str().unwrap()]).stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: signal() is async-signal-safe. Ignored, SIGXFSZ leaves the write failing with EFBIG.
    unsafe {
        train.pre_exec(|| {
            (libc::signal(libc::SIGXFSZ, libc::SIG_IGN) != libc::SIG_ERR)
                .then_some(())
                .ok_or_else(std::io::Error::last_os_error)
        })
    };
    let mut child = train.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).unwrap();
        text
    });

    let run = root.join("run");
    let started = Instant::now();
    while !checkpoint::checkpoint_dir(&run, 1).exists() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its first checkpoint");
        assert!(started.elapsed() < Duration::from_secs(300), "no checkpoint at step 1");
        std::thread::sleep(Duration::from_millis(10));
    }
    // stopped, the run cannot finish another checkpoint while the limit is set
    signal(child.id(), libc::SIGSTOP);
    let intact = checkpoint::list(&run).unwrap().into_iter().max().unwrap();
    let intact_dir = checkpoint::checkpoint_dir(&run, intact);
    let saved = contents(&intact_dir);
    // below both safetensors files, so a save caught half-way fails too; far above metrics.jsonl
    let smaller = saved["adapter_model.safetensors"].len().min(saved["optimizer.safetensors"].len());
    limit_file_size(child.id(), smaller as u64 / 2);
    signal(child.id(), libc::SIGCONT);
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    eprintln!("{stderr}");

    assert!(!status.success(), "the run must fail");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one message: {stderr}");
    let next = intact + 1;
    let file = run.join(format!("checkpoints/.step-{next}.tmp/adapter_model.safetensors"));
    let expected = [
        format!("error: disk full while writing {} (checkpoint step {next}): ", file.display()),
        "File too large".into(),
        format!("{}", run.join("checkpoints").display()),
        format!("the newest complete checkpoint, step {intact} ({}), is intact", intact_dir.display()),
    ];
    for part in expected {
        assert!(errors[0].contains(&part), "{part:?} missing from {:?}", errors[0]);
    }
    assert_eq!(contents(&intact_dir), saved, "the intact checkpoint changed");
    assert_eq!(checkpoint::newest_complete(&run).unwrap().unwrap().1.step, intact);
    let left: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, [format!("step-{intact}")], "a temporary folder or a pruned checkpoint");
    assert!(!root.join("adapters").exists());
    std::fs::remove_dir_all(&root).ok();
}

/// Starts `cmd` with files limited to `bytes` (RLIMIT_FSIZE) and SIGXFSZ ignored, so a write past
/// the limit fails with EFBIG as on a full disk.
fn limit_file_size_from_the_start(cmd: &mut Command, bytes: u64) {
    // SAFETY: signal() and setrlimit() are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: libc::RLIM_INFINITY };
            let ok = libc::signal(libc::SIGXFSZ, libc::SIG_IGN) != libc::SIG_ERR
                && libc::setrlimit(libc::RLIMIT_FSIZE, &limit) == 0;
            ok.then_some(()).ok_or_else(std::io::Error::last_os_error)
        })
    };
}

/// A disk that fills up during `lora-ft merge`: one message naming the shard being written and
/// where to free space, and no output folder (not a half-merged model) left behind. The limit is
/// set in the child before it starts: 4 KiB, past config.json's size, short of any shard.
#[test]
fn a_full_disk_during_a_merge_leaves_no_half_merged_model() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
    let root = std::env::temp_dir().join(format!("lora-ft-merge-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let out = root.join("merged");
    let mut merge = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    merge.arg("merge").arg("--model").arg(&fixture).arg("--adapter").arg(fixture.join("adapter")).arg(&out);
    merge.stdout(Stdio::null()).stderr(Stdio::piped());
    limit_file_size_from_the_start(&mut merge, 4096);
    let output = merge.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let shard = root.join(".merged.tmp").join("model.safetensors");
    let head = format!("error: disk full while writing {}: ", shard.display());
    assert!(errors[0].starts_with(&head), "{stderr}");
    assert!(
        errors[0].contains("File too large") && errors[0].contains(&root.display().to_string()),
        "{stderr}"
    );
    assert!(errors[0].contains(&format!("{} was not created", out.display())), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A disk that fills up during `lora-ft import`: an error naming the file, and no half-written
/// `model.safetensors.partial` left in the output folder (1 MiB limit, set before the child starts).
#[test]
fn a_full_disk_during_an_import_leaves_no_partial_weights() {
    let root = std::env::temp_dir().join(format!("lora-ft-import-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut import = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    import.arg("import").arg(lora_ft::fixtures::smollm2_gguf()).arg(&root);
    import.stdout(Stdio::null()).stderr(Stdio::piped());
    limit_file_size_from_the_start(&mut import, 1 << 20);
    let output = import.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("model.safetensors.partial") && stderr.contains("File too large"), "{stderr}");
    assert!(!root.join("model.safetensors.partial").exists(), "{stderr}");
    assert!(!root.join("model.safetensors").exists(), "{stderr}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A disk that fills up during `lora-ft export-gguf`: one message naming the `.partial` file and
/// saying the `.gguf` was not created, and nothing left in the folder (1 MiB limit: the
/// tokenizer's keys alone are more).
#[test]
fn a_full_disk_during_a_gguf_export_leaves_no_partial_file() {
    let root = std::env::temp_dir().join(format!("lora-ft-gguf-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let out = root.join("model.gguf");
    let mut export = Command::new(env!("CARGO_BIN_EXE_lora-ft"));
    export.arg("export-gguf").arg("--model").arg(lora_ft::fixtures::smollm2_dir()).arg(&out);
    export.stdout(Stdio::null()).stderr(Stdio::piped());
    limit_file_size_from_the_start(&mut export, 1 << 20);
    let output = export.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let head = format!("error: disk full while writing {}.partial: ", out.display());
    assert!(errors[0].starts_with(&head) && errors[0].contains("File too large"), "{stderr}");
    assert!(errors[0].contains(&format!("{} was not created", out.display())), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&root);
}
