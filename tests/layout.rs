//! The layout rules of the README ("Layout"), read from the code: each room (a top-level module,
//! and inside `model/` each sub-room) imports only rooms on floors below its own, so there is no
//! import circle; and no source file is over 500 lines (kernels aside). Test code is exempt from
//! the floors (a test may use the whole crate).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The top-level rooms, bottom floor first. A room may import rooms listed before it.
const FLOORS: &[&[&str]] = &[
    &["cuda", "profile", "durable", "fixtures", "testing"],
    &["memory", "quant"],
    &["config", "distributed"],
    &["model", "optim", "gguf"],
    &["data", "hub", "plan"],
    &["peft_adapter", "generate"],
    &["train", "merge", "eval"],
    &["bench"],
];

/// Inside `model/`, bottom floor first.
const MODEL_FLOORS: &[&[&str]] =
    &[&["arch", "activations", "packing"], &["ops"], &["lora"], &["layer"], &["decoder"], &["reference"]];

fn floor_of(floors: &[&[&str]], room: &str) -> Option<usize> {
    floors.iter().position(|f| f.contains(&room))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's code without its test modules (`#[cfg(test)] mod …` to the end of the file, as
/// this project writes them) and without comments.
fn non_test_code(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    if matches!(name, "tests.rs" | "test_util.rs" | "fused_tests.rs") {
        return None;
    }
    let text = std::fs::read_to_string(path).unwrap();
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text,
    };
    Some(code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n"))
}

/// The rooms named after `prefix` (`crate::` or `crate::model::`) in `code`.
fn rooms_named(code: &str, prefix: &str) -> BTreeSet<String> {
    code.match_indices(prefix)
        .map(|(i, _)| {
            code[i + prefix.len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
        })
        .filter(|room: &String| !room.is_empty())
        .collect()
}

/// Every path from `src/` as (room, sub-room inside model/ if any).
fn room_of(src: &Path, path: &Path) -> (String, Option<String>) {
    let rel = path.strip_prefix(src).unwrap();
    let parts: Vec<String> =
        rel.iter().map(|p| p.to_str().unwrap().trim_end_matches(".rs").to_string()).collect();
    let sub = (parts[0] == "model" && parts.len() > 1 && parts[1] != "mod").then(|| parts[1].clone());
    (parts[0].clone(), sub)
}

#[test]
fn no_room_imports_a_room_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for path in &files {
        let (room, sub) = room_of(&src, path);
        if matches!(room.as_str(), "main" | "cli" | "plan_commands" | "lib") {
            continue; // the binary's modules and the crate root sit above every room
        }
        let Some(code) = non_test_code(path) else { continue };
        let floor = floor_of(FLOORS, &room)
            .unwrap_or_else(|| panic!("{}: room {room} is in no floor", path.display()));
        for other in rooms_named(&code, "crate::") {
            if other == room {
                continue;
            }
            match floor_of(FLOORS, &other) {
                Some(f) if f < floor => {}
                _ => violations.push(format!("{}: {room} imports {other}", path.display())),
            }
        }
        if let Some(sub) = sub {
            let floor = floor_of(MODEL_FLOORS, &sub)
                .unwrap_or_else(|| panic!("{}: model room {sub} is in no floor", path.display()));
            let mut named = rooms_named(&code, "crate::model::");
            if path.file_name().is_some_and(|f| f != "mod.rs") && path.parent().unwrap().ends_with("model") {
                named.extend(rooms_named(&code, "super::")); // model/layer.rs, decoder.rs, …
            }
            for other in named {
                if other == sub || other == "Architecture" || other == "ModelConfig" {
                    continue;
                }
                match floor_of(MODEL_FLOORS, &other) {
                    Some(f) if f < floor => {}
                    Some(_) => {
                        violations.push(format!("{}: model::{sub} imports model::{other}", path.display()))
                    }
                    None => {} // an item re-exported by model/mod.rs
                }
            }
        }
    }
    assert!(violations.is_empty(), "imports against the floors:\n{}", violations.join("\n"));
}

#[test]
fn no_source_file_is_over_500_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .map(|p| (p, std::fs::read_to_string(p).unwrap().lines().count()))
        .filter(|(_, n)| *n > 500)
        .map(|(p, n)| format!("{}: {n} lines", p.display()))
        .collect();
    assert!(files.len() > 50, "found only {} files", files.len());
    assert!(long.is_empty(), "files over 500 lines:\n{}", long.join("\n"));
}
