//! Every file a comment names exists: a comment that points at a moved or deleted file sends the
//! reader nowhere. A path is read relative to the repository, to `src/`, to `src/model/`, or to
//! the commenting file's own folder and those above it; placeholders (`configs/NAME.toml`) and
//! peers' sources (listed below) are not ours to check.

use std::path::{Path, PathBuf};

/// Files of other projects that comments cite (transformers, llama.cpp, bitsandbytes, Unsloth).
const PEERS: &[&str] = &[
    "integrations/gguf/gguf_tokenizer_mapping.py",
    "integrations/ggml.py",
    "integrations/sdpa_attention.py",
    "src/llama-quant.cpp",
    "csrc/kernels.cu",
    "unsloth_zoo/compiler.py",
    "ggml-org/llama.cpp",
];

const EXTENSIONS: &[&str] = &["rs", "py", "sh", "md", "toml", "cu", "cuh", "cpp", "json", "jsonl", "jinja"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("fixtures") && !path.ends_with("__pycache__") {
                source_files(&path, out);
            }
        } else if path
            .extension()
            .is_some_and(|e| ["rs", "py", "sh", "cu", "cuh", "cpp"].iter().any(|x| e == *x))
        {
            out.push(path);
        }
    }
}

/// The comment part of a line: after `//` in Rust, CUDA and C++, after `#` in Python and shell.
fn comment(path: &Path, line: &str) -> Option<String> {
    let hash = path.extension().is_some_and(|e| e == "py" || e == "sh");
    let marker = if hash { "#" } else { "//" };
    let trimmed = line.trim_start();
    if trimmed.starts_with(marker) {
        return Some(trimmed.to_string());
    }
    // a trailing comment after code
    let spaced = format!(" {marker} ");
    line.find(&spaced).map(|i| line[i..].to_string())
}

/// Path-like words with a folder and a known extension: `model/ops/loss.rs`.
fn named_paths(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || "`'\"()[]{},;:<>*".contains(c))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| w.contains('/') && !w.contains("://"))
        // `<output.dir>/samples.jsonl` and `{dir}/train.toml` leave a placeholder's tail
        .filter(|w| !w.starts_with('/'))
        .filter(|w| w.rsplit_once('.').is_some_and(|(_, ext)| EXTENSIONS.contains(&ext)))
        .filter(|w| {
            !w.split('/')
                .any(|part| part.len() > 1 && part.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        })
        .filter(|w| !w.split('/').any(|part| part.contains("NAME") || part.contains('*')))
        .map(str::to_string)
        .collect()
}

fn exists(named: &str, file: &Path) -> bool {
    let named = named.trim_start_matches("./");
    let mut bases = vec![root().to_path_buf(), root().join("src"), root().join("src/model")];
    bases.extend(file.ancestors().skip(1).take_while(|a| a.starts_with(root())).map(Path::to_path_buf));
    bases.iter().any(|base| base.join(named).exists())
}

#[test]
fn every_file_a_comment_names_exists() {
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "scripts", "examples"] {
        if root().join(dir).is_dir() {
            source_files(&root().join(dir), &mut files);
        }
    }
    files.push(root().join("build.rs"));
    let mut stale = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let Some(comment) = comment(file, line) else { continue };
            for named in named_paths(&comment) {
                if !PEERS.contains(&named.as_str()) && !exists(&named, file) {
                    let at = file.strip_prefix(root()).unwrap().display();
                    stale.push(format!("{at}:{}: {named}", i + 1));
                }
            }
        }
    }
    assert!(stale.is_empty(), "comments naming files that do not exist:\n{}", stale.join("\n"));
}

#[test]
fn the_path_reader_finds_what_it_should() {
    let words = named_paths("see `model/ops/loss.rs` and src/train/setup.rs, not configs/NAME.toml, DIR/x.json or {dir}/train.toml");
    assert_eq!(words, ["model/ops/loss.rs", "src/train/setup.rs"]);
    let here = root().join("src/plan/mod.rs");
    assert!(exists("ops/loss.rs", &here), "relative to src/model/");
    assert!(exists("train/setup.rs", &here), "relative to src/");
    assert!(!exists("model/nowhere.rs", &here));
}
