//! The book's reference pages are generated from the code (`lora-ft reference DIR`: clap's
//! model of the command line, the config types' doc comments and defaults); a committed page that
//! differs from what the code generates fails here, so the docs cannot drift from the code.

use std::path::Path;
use std::process::Command;

#[test]
fn committed_reference_pages_are_what_the_code_generates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fresh = std::env::temp_dir().join(format!("lora-ft-reference-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_lora-ft")).arg("reference").arg(&fresh).output().unwrap();
    assert!(out.status.success(), "lora-ft reference failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut stale = Vec::new();
    for name in ["cli.md", "config.md"] {
        let generated = std::fs::read_to_string(fresh.join(name)).unwrap();
        let committed_path = root.join("docs/src/reference").join(name);
        let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
        if generated != committed {
            let line = generated.lines().zip(committed.lines()).position(|(a, b)| a != b);
            let line = line.unwrap_or(generated.lines().count().min(committed.lines().count()));
            stale.push(format!("{} (first difference at line {})", committed_path.display(), line + 1));
        }
        assert!(generated.len() > 2000, "{name} is nearly empty:\n{generated}");
    }
    std::fs::remove_dir_all(&fresh).ok();
    assert!(
        stale.is_empty(),
        "stale reference pages: {}\nregenerate them: cargo run --release -- reference docs/src/reference",
        stale.join(", ")
    );
}

/// Every config key and every subcommand the code has is on a page (the renderer skips nothing).
#[test]
fn reference_pages_cover_every_key_and_command() {
    let fresh = std::env::temp_dir().join(format!("lora-ft-reference-cover-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_lora-ft")).arg("reference").arg(&fresh).status().unwrap();
    assert!(status.success());
    let config = std::fs::read_to_string(fresh.join("config.md")).unwrap();
    let cli = std::fs::read_to_string(fresh.join("cli.md")).unwrap();
    std::fs::remove_dir_all(&fresh).ok();
    // every key of a full config: the keys serde writes for a config read from TOML
    let full = lora_ft::config::Config::from_toml(
        "[model]\nsource = \"m\"\n[data]\ntrain = \"t.jsonl\"\neval = \"e.jsonl\"\n\
         eval_prompts = \"p.jsonl\"\n[train]\nmax_steps = 3\nmax_vram_fraction = 0.9\ngpu_mem = 24\n",
        Path::new("full.toml"),
    )
    .unwrap();
    let value = toml::Value::try_from(&full).unwrap();
    let mut missing = Vec::new();
    for (section, table) in value.as_table().unwrap() {
        for key in table.as_table().unwrap().keys() {
            let heading = format!("### `{section}.{key}`");
            if !config.contains(&heading) {
                missing.push(heading);
            }
        }
    }
    for heading in ["### `optim.betas`", "### `optim.flavor`", "### `model.chat_template`"] {
        if !config.contains(heading) {
            missing.push(heading.to_string());
        }
    }
    assert!(missing.is_empty(), "config.md lacks {missing:?}");
    // every key has a description line after its type line
    for block in config.split("\n### ").skip(1) {
        let text_lines = block.lines().filter(|l| !l.trim().is_empty()).count();
        assert!(text_lines >= 3, "a key without a doc comment: {block}");
    }
    for command in ["train", "chat", "eval", "merge", "export-gguf", "import", "init", "estimate", "plot"] {
        assert!(cli.contains(&format!("## `lora-ft {command}`")), "cli.md lacks lora-ft {command}");
    }
    for command in ["data check", "data tokenize", "bench train"] {
        assert!(cli.contains(&format!("### `lora-ft {command}`")), "cli.md lacks lora-ft {command}");
    }
    assert!(!cli.contains("## `lora-ft reference`"), "the hidden generator is not a user command");
}
