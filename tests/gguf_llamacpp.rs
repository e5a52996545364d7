//! Issue 21's round trip through llama.cpp itself: every tiny family exported by
//! `lora-ft export-gguf` — f16 and q8_0, each fixture's adapter merged, and the base with the
//! adapter as an `--adapter-only` file applied by llama.cpp — gives logits within the derived
//! bound of transformers in float64 (`scripts/gguf_llamacpp_families.py`; the bound and the
//! results: benches/issue21/README.md), and the real SmolLM2 replies in llama.cpp as
//! `lora-ft chat` does (`scripts/gguf_llamacpp_check.py`).
//!
//! llama.cpp is the prebuilt CPU library of npm's node-llama-cpp, installed with a small C driver
//! and a Python venv holding numpy and jinja2 by `bash scripts/gguf_llamacpp_install.sh`; the
//! float64 reference is the committed golden `tests/golden/gguf_llamacpp.json`
//! (`scripts/golden/gguf_llamacpp_reference.py`). Where llama.cpp is missing from the cache the
//! tests run that script themselves, once; where it cannot be installed they fail, saying why:
//! they never skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// `$LORA_FT_LLAMACPP`, or `llamacpp` in the cache folder: where the install script puts it.
fn llamacpp_dir() -> PathBuf {
    std::env::var_os("LORA_FT_LLAMACPP")
        .map(PathBuf::from)
        .unwrap_or_else(|| lora_ft::cache::dir().join("llamacpp"))
}

/// `LORA_FT_PYTHON`, else the install's venv.
fn python() -> PathBuf {
    std::env::var_os("LORA_FT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| llamacpp_dir().join("venv/bin/python3"))
}

/// Installs llama.cpp and its checks' Python into the cache unless a run already did (one test
/// process at a time, through a lock file), then fails, saying how to install them, if they are
/// still not there.
fn require_tools() {
    static IN_PROCESS: Mutex<()> = Mutex::new(());
    let _guard = IN_PROCESS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let driver = llamacpp_dir().join("bin").join("gguf_llamacpp_run");
    let ready = || driver.is_file() && (std::env::var_os("LORA_FT_PYTHON").is_some() || python().is_file());
    if std::env::var_os("LORA_FT_LLAMACPP").is_none() {
        common::install_once("llamacpp", "gguf_llamacpp_install.sh", "npm and cc", ready);
    }
    assert!(
        driver.is_file(),
        "llama.cpp is not installed ({} is missing): run `bash scripts/gguf_llamacpp_install.sh`",
        driver.display()
    );
    let probe = Command::new(python()).args(["-c", "import numpy, jinja2"]).output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "{} cannot import numpy and jinja2: run `bash scripts/gguf_llamacpp_install.sh`, or set \
         LORA_FT_PYTHON to a Python that can: {:?}",
        python().display(),
        probe.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
    );
}

/// Runs `script` with `args` from the repository root; its exit status is the verdict.
fn check(script: &str, args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python())
        .arg(root.join(script))
        .args(["--lora-ft", env!("CARGO_BIN_EXE_lora-ft")])
        .args(args)
        .env("LORA_FT_LLAMACPP", llamacpp_dir())
        .current_dir(root)
        .output()
        .expect("the check runs");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{script} {args:?}:\n{text}");
    assert!(
        out.status.success(),
        "{script} {args:?}: llama.cpp disagreed, the export failed or a tool is missing:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_family_runs_in_llama_cpp_within_the_bound_of_transformers() {
    require_tools();
    for args in
        [&["--types", "f16,q8_0"][..], &["--types", "f16", "--adapter"], &["--types", "f16", "--lora-gguf"]]
    {
        check("scripts/gguf_llamacpp_families.py", args);
    }
}

/// The real SmolLM2-135M-Instruct (the demo model) with the PEFT golden adapter: llama.cpp's
/// logits of the f16 and q8_0 exports, the adapter merged and the `--adapter-only` file within the
/// bound, and the f16 export's greedy replies to ten customer-service prompts the same as
/// `lora-ft chat`'s.
#[test]
fn smollm2_in_llama_cpp_replies_as_lora_ft_chat_does() {
    require_tools();
    let model = lora_ft::fixtures::smollm2_dir();
    let model = model.to_str().expect("a UTF-8 path");
    let adapter = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/peft_smollm2_adapter");
    let logits = ["--model", model, "--adapter-dir", adapter];
    check("scripts/gguf_llamacpp_families.py", &[&logits[..], &["--types", "f16,q8_0"]].concat());
    check("scripts/gguf_llamacpp_families.py", &[&logits[..], &["--types", "f16", "--adapter"]].concat());
    check("scripts/gguf_llamacpp_families.py", &[&logits[..], &["--types", "f16", "--lora-gguf"]].concat());
    let dir = std::env::temp_dir().join(format!("lora-ft-llamacpp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join("smollm2-adapter-f16.gguf");
    let exported = Command::new(env!("CARGO_BIN_EXE_lora-ft"))
        .args(["export-gguf", "--model", model, "--adapter", adapter, "--type", "f16"])
        .arg(&gguf)
        .output()
        .expect("export-gguf runs");
    assert!(exported.status.success(), "{}", String::from_utf8_lossy(&exported.stderr));
    let work = dir.to_str().expect("a UTF-8 path");
    let args = ["--gguf", gguf.to_str().unwrap(), "--model", model, "--adapter", adapter, "--work-dir", work];
    check("scripts/gguf_llamacpp_check.py", &args);
    std::fs::remove_dir_all(&dir).ok();
}
