//! Issue 21's round trip through llama.cpp itself, in `cargo test` where its Python binding is
//! present: every tiny family exported by `lora-ft export-gguf` — f16 and q8_0, each fixture's
//! adapter merged, and the base with the adapter as an `--adapter-only` file applied by llama.cpp
//! — gives logits within the derived bound of transformers in float64
//! (`scripts/gguf_llamacpp_families.py`; the bound and the results: benches/issue21/README.md).
//! The Python is `LORA_FT_PYTHON` (default `python3`) and needs `llama_cpp` (llama-cpp-python:
//! PyPI has only its source, a long build), torch, transformers and gguf; without them the test
//! says it is skipped.

use std::path::Path;
use std::process::Command;

fn python() -> String {
    std::env::var("LORA_FT_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn every_family_runs_in_llama_cpp_within_the_bound_of_transformers() {
    let probe = Command::new(python()).args(["-c", "import llama_cpp, torch, transformers, gguf"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!(
            "skipped: {} cannot import llama_cpp, torch, transformers and gguf (set LORA_FT_PYTHON)",
            python()
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for args in
        [&["--types", "f16,q8_0"][..], &["--types", "f16", "--adapter"], &["--types", "f16", "--lora-gguf"]]
    {
        let out = Command::new(python())
            .arg(root.join("scripts/gguf_llamacpp_families.py"))
            .args(["--lora-ft", env!("CARGO_BIN_EXE_lora-ft")])
            .args(args)
            .current_dir(root)
            .output()
            .expect("the check runs");
        let text = String::from_utf8_lossy(&out.stdout);
        println!("{args:?}:\n{text}");
        assert!(
            out.status.success(),
            "{args:?}: llama.cpp outside the bound or the export failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
