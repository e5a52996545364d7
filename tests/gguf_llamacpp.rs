//! Issue 21's round trip through llama.cpp itself, in `cargo test` where its Python binding is
//! present: every tiny family exported by `lora-ft export-gguf` — f16 and q8_0, each fixture's
//! adapter merged, and the base with the adapter as an `--adapter-only` file applied by llama.cpp
//! — gives logits within the derived bound of transformers in float64
//! (`scripts/gguf_llamacpp_families.py`; the bound and the results: benches/issue21/README.md),
//! and the real SmolLM2 replies in llama.cpp as `lora-ft chat` does (`scripts/gguf_llamacpp_check.py`).
//! The Python is `LORA_FT_PYTHON` (default `python3`) and needs `llama_cpp` (llama-cpp-python:
//! PyPI has only its source, a long build), torch, transformers and gguf; without them the tests
//! say they are skipped.

use std::path::Path;
use std::process::Command;

fn python() -> String {
    std::env::var("LORA_FT_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether the Python can run llama.cpp and the reference (else the test says it is skipped).
fn python_ready() -> bool {
    let probe = Command::new(python()).args(["-c", "import llama_cpp, torch, transformers, gguf"]).output();
    let ready = probe.as_ref().is_ok_and(|o| o.status.success());
    if !ready {
        eprintln!(
            "skipped: {} cannot import llama_cpp, torch, transformers and gguf (set LORA_FT_PYTHON)",
            python()
        );
    }
    ready
}

/// Runs `script` with `args` from the repository root; its exit status is the verdict.
fn check(script: &str, args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python())
        .arg(root.join(script))
        .args(["--lora-ft", env!("CARGO_BIN_EXE_lora-ft")])
        .args(args)
        .current_dir(root)
        .output()
        .expect("the check runs");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{script} {args:?}:\n{text}");
    assert!(
        out.status.success(),
        "{script} {args:?}: llama.cpp disagreed or the export failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_family_runs_in_llama_cpp_within_the_bound_of_transformers() {
    if !python_ready() {
        return;
    }
    for args in
        [&["--types", "f16,q8_0"][..], &["--types", "f16", "--adapter"], &["--types", "f16", "--lora-gguf"]]
    {
        check("scripts/gguf_llamacpp_families.py", args);
    }
}

/// The real SmolLM2-135M-Instruct (the demo model) with the PEFT golden adapter: llama.cpp's
/// logits of the f16 and q8_0 exports within the bound, and the f16 export's greedy replies to
/// ten customer-service prompts the same as `lora-ft chat`'s.
#[test]
fn smollm2_in_llama_cpp_replies_as_lora_ft_chat_does() {
    if !python_ready() {
        return;
    }
    let model = lora_ft::fixtures::smollm2_dir();
    let model = model.to_str().expect("a UTF-8 path");
    let adapter = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/peft_smollm2_adapter");
    let logits = ["--model", model, "--adapter-dir", adapter];
    check("scripts/gguf_llamacpp_families.py", &[&logits[..], &["--types", "f16,q8_0"]].concat());
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
