//! The layout rules (the book's Architecture page, docs/src/internals/architecture.md, "Floors"),
//! read from the library's code (test code is exempt: a test may use the whole crate):
//!
//! - floors: each room (a top-level module, and inside `model/` each sub-room) imports only rooms
//!   on floors below its own;
//! - no circles: inside every module, its own file and its children (a file, or a folder taken
//!   whole) import one another without a circle, so each folder reads from the bottom up;
//! - no source file is over 500 lines (kernels aside).
//!
//! The modules are found from `src/lib.rs` through their `mod` declarations (`#[path]` followed,
//! `#[cfg(test)]` ones left out, as is a file's `#[cfg(test)] mod … { … }` tail). An import is
//! any path of the code that starts at `crate::`, `super::`, `self::`, a child module or a name a
//! `use` brought in, in `use` declarations or in expressions; it is followed through `use` and
//! `pub use` re-exports to the module that defines the item.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level rooms, bottom floor first. A room may import rooms listed before it.
const FLOORS: &[&[&str]] = &[
    &["cuda", "profile", "durable", "cache", "testing"],
    &["memory", "quant"],
    &["config", "distributed", "arch"],
    &["model", "optim", "gguf"],
    &["data", "hub", "plan", "fixtures"],
    &["peft_adapter"],
    &["generate"],
    &["train", "merge", "eval"],
    &["bench"],
    &["serve"],
];

/// Inside `model/`, bottom floor first.
const MODEL_FLOORS: &[&[&str]] =
    &[&["activations", "packing"], &["ops"], &["lora"], &["layer"], &["decoder"], &["reference"]];

fn floor_of(floors: &[&[&str]], room: &str) -> Option<usize> {
    floors.iter().position(|f| f.contains(&room))
}

/// One module of the library: a file.
struct Module {
    /// From the crate root: `["gguf", "import", "tokenizer"]`; empty for `lib.rs`.
    path: Vec<String>,
    file: PathBuf,
    children: BTreeMap<String, usize>,
    /// The file's own code first, then each inline `mod name { … }` apart (its `super::` is one
    /// level deeper).
    scopes: Vec<Scope>,
}

/// Code of one module, a file's or an inline one's.
struct Scope {
    path: Vec<String>,
    /// Without comments, string contents, the `#[cfg(test)]` tail and inline modules.
    code: String,
    /// Each name a `use` here brings in (`pub use` too) → the crate path it names; names from
    /// other crates are left out.
    uses: BTreeMap<String, Vec<String>>,
}

/// The library's module tree; `modules[0]` is the crate root.
struct Crate {
    modules: Vec<Module>,
}

impl Crate {
    fn read(src: &Path) -> Self {
        let mut krate = Crate { modules: Vec::new() };
        krate.load(src.join("lib.rs"), Vec::new());
        for i in 0..krate.modules.len() {
            for k in 0..krate.modules[i].scopes.len() {
                let uses = use_paths(&krate.modules[i].scopes[k].code)
                    .into_iter()
                    .filter_map(|(name, path)| Some((name, krate.absolute(i, k, &path)?)))
                    .collect();
                krate.modules[i].scopes[k].uses = uses;
            }
        }
        krate
    }

    fn load(&mut self, file: PathBuf, path: Vec<String>) -> usize {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut scopes = Vec::new();
        split_inline_modules(
            &without_visibility_paths(&without_test_tail(&scrub(&text))),
            path.clone(),
            &mut scopes,
        );
        let scopes =
            scopes.into_iter().map(|(path, code)| Scope { path, code, uses: BTreeMap::new() }).collect();
        let dir = match file.file_name().unwrap().to_str().unwrap() {
            "lib.rs" | "mod.rs" => file.parent().unwrap().to_path_buf(),
            name => file.parent().unwrap().join(name.trim_end_matches(".rs")),
        };
        let index = self.modules.len();
        self.modules.push(Module { path: path.clone(), file, children: BTreeMap::new(), scopes });
        for (name, at) in mod_declarations(&text) {
            let child = match at {
                Some(at) => self.modules[index].file.parent().unwrap().join(at),
                None if dir.join(format!("{name}.rs")).exists() => dir.join(format!("{name}.rs")),
                None => dir.join(&name).join("mod.rs"),
            };
            let mut child_path = path.clone();
            child_path.push(name.clone());
            let child = self.load(child, child_path);
            self.modules[index].children.insert(name, child);
        }
        index
    }

    /// `segments` as written in scope `scope` of module `at`, from the crate root; `None` for
    /// another crate's.
    fn absolute(&self, at: usize, scope: usize, segments: &[String]) -> Option<Vec<String>> {
        let module = &self.modules[at];
        let here = &module.scopes[scope];
        let first = segments.first()?.as_str();
        let (mut path, rest) = match first {
            "crate" => (Vec::new(), &segments[1..]),
            "self" => (here.path.clone(), &segments[1..]),
            "super" => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let path = here.path[..here.path.len().checked_sub(supers)?].to_vec();
                (path, &segments[supers..])
            }
            _ if scope == 0 && module.children.contains_key(first) => (here.path.clone(), segments),
            _ => (here.uses.get(first)?.clone(), &segments[1..]),
        };
        path.extend(rest.iter().cloned());
        Some(path)
    }

    /// The module that defines what the crate path `path` names, through `use`s and re-exports.
    fn resolve(&self, path: &[String], depth: usize) -> usize {
        let mut at = 0;
        for (i, segment) in path.iter().enumerate() {
            let module = &self.modules[at];
            if let Some(&child) = module.children.get(segment) {
                at = child;
            } else if let (Some(target), true) = (module.scopes[0].uses.get(segment), depth < 16) {
                let mut target = target.clone();
                target.extend(path[i + 1..].iter().cloned());
                return self.resolve(&target, depth + 1);
            } else {
                break;
            }
        }
        at
    }

    /// Every (importing module, imported module) of the library's code, each once.
    fn imports(&self) -> BTreeSet<(usize, usize)> {
        let mut edges = BTreeSet::new();
        for (i, module) in self.modules.iter().enumerate() {
            for (k, scope) in module.scopes.iter().enumerate() {
                let mut paths: Vec<Vec<String>> =
                    use_paths(&scope.code).into_iter().map(|(_, p)| p).collect();
                paths.extend(code_paths(&without_uses(&scope.code)));
                for path in paths {
                    let Some(absolute) = self.absolute(i, k, &path) else { continue };
                    let target = self.resolve(&absolute, 0);
                    if target != i && target != 0 {
                        edges.insert((i, target));
                    }
                }
            }
        }
        edges
    }
}

/// `code` as scopes: (`path`, the code outside inline modules) first, then each inline
/// `mod name { … }` (at `path` + name) the same way.
fn split_inline_modules(code: &str, path: Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    let (mut outer, mut inner) = (String::new(), Vec::new());
    let mut rest = code;
    while let Some(i) = find_keyword(rest, "mod ") {
        let after = &rest[i + 4..];
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let tail = after[name.len()..].trim_start();
        if name.is_empty() || !tail.starts_with('{') {
            outer.push_str(&rest[..i + 4]);
            rest = after;
            continue;
        }
        let open = rest.len() - tail.len();
        let mut depth = 0;
        let close = open
            + rest[open..]
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(rest.len() - open - 1, |(j, _)| j);
        outer.push_str(&rest[..i]);
        let mut inner_path = path.clone();
        inner_path.push(name);
        split_inline_modules(&rest[open + 1..close], inner_path, &mut inner);
        rest = &rest[(close + 1).min(rest.len())..];
    }
    outer.push_str(rest);
    out.push((path, outer));
    out.extend(inner);
}

/// The modules a file declares: (name, its `#[path]` if any), `#[cfg(test)]` ones left out.
fn mod_declarations(text: &str) -> Vec<(String, Option<String>)> {
    let mut found = Vec::new();
    let mut attributes = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[") {
            attributes.push(line);
            continue;
        }
        let declaration = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub(super) "))
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        if let Some(name) = declaration.strip_prefix("mod ").and_then(|rest| rest.strip_suffix(';')) {
            let test_only =
                attributes.iter().any(|a| a.starts_with("#[cfg(test)") || a.starts_with("#[cfg(all(test"));
            let at = attributes
                .iter()
                .find_map(|a| a.strip_prefix("#[path = \"").and_then(|p| p.strip_suffix("\"]")));
            if !test_only {
                found.push((name.to_string(), at.map(str::to_string)));
            }
        }
        if !line.starts_with("//") && !line.is_empty() {
            attributes.clear();
        }
    }
    found
}

/// `text` without comments, and with the contents of string and char literals blanked.
fn scrub(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !ident_char(chars.get(i.wrapping_sub(1)))
        {
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            i += 2 + hashes;
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            while i < chars.len() && !chars[i..].iter().collect::<String>().starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next == Some('\\') {
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// The code before its `#[cfg(test)] mod … {` (test modules close a file in this project).
fn without_test_tail(code: &str) -> String {
    let lines: Vec<&str> = code.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim();
        if !(line.starts_with("#[cfg(test)") || line.starts_with("#[cfg(all(test")) {
            continue;
        }
        let item = lines[i + 1..].iter().map(|l| l.trim()).find(|l| !l.starts_with("#["));
        if item.is_some_and(|l| l.contains("mod ") && l.ends_with('{')) {
            return lines[..i].join("\n");
        }
    }
    code.to_string()
}

/// `code` with `pub(in path)` as `pub`: a visibility names a module without importing it.
fn without_visibility_paths(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(i) = rest.find("pub(in ") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i..];
        rest = &rest[rest.find(')').map_or(rest.len(), |e| e + 1)..];
    }
    out.push_str(rest);
    out
}

/// Each `use` declaration's paths, as (the name it brings in, the path as written); a glob or
/// `self` brings in the module's own name.
fn use_paths(code: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for declaration in use_declarations(code) {
        let mut paths = Vec::new();
        expand(&declaration, &mut Vec::new(), &mut paths);
        for (name, path) in paths {
            found.push((name, path.split("::").map(str::to_string).collect()));
        }
    }
    found
}

/// The trees of the `use` declarations of `code` (`crate::a::{b, c::d as e}`), whitespace removed.
fn use_declarations(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = find_keyword(rest, "use ") {
        let tail = &rest[i + 4..];
        let end = tail.find(';').unwrap_or(tail.len());
        found.push(tail[..end].split_whitespace().collect::<Vec<_>>().join(" ").replace(" ::", "::"));
        rest = &tail[end..];
    }
    found
}

/// `code` with its `use` declarations taken out.
fn without_uses(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(i) = find_keyword(rest, "use ") {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let end = tail.find(';').map_or(tail.len(), |e| e + 1);
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Where `keyword` starts a word of `code`.
fn find_keyword(code: &str, keyword: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = code[from..].find(keyword) {
        let at = from + i;
        let before = code[..at].chars().next_back();
        if !ident_char(before.as_ref()) {
            return Some(at);
        }
        from = at + keyword.len();
    }
    None
}

/// A use tree's paths below `prefix`, each with the name it brings in.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<(String, String)>) {
    let tree = tree.trim().trim_start_matches("::");
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim_end_matches("::").trim();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let pushed = usize::from(!head.is_empty());
        if pushed == 1 {
            prefix.push(head.to_string());
        }
        for part in split_top_level(inner) {
            expand(part, prefix, out);
        }
        prefix.truncate(prefix.len() - pushed);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((path, alias)) => (path.trim(), Some(alias.trim())),
        None => (tree, None),
    };
    let mut whole = prefix.clone();
    match path {
        "self" | "*" => {}
        path => whole.push(path.to_string()),
    }
    let name = alias.unwrap_or_else(|| whole.last().map_or("", |s| s.rsplit("::").next().unwrap()));
    out.push((name.to_string(), whole.join("::")));
}

/// `a, b::{c, d}, e` split at the commas outside braces.
fn split_top_level(inner: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
}

/// The paths of `code` outside `use` declarations: `a::b::c` wherever it starts a path.
fn code_paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = is_ident(bytes[i]) && (i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == b':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < bytes.len() && is_ident(bytes[j]) {
                j += 1;
            }
            segments.push(code[start..j].to_string());
            if code[j..].starts_with("::") && bytes.get(j + 2).is_some_and(|b| is_ident(*b)) {
                j += 2;
            } else {
                break;
            }
        }
        if segments.len() > 1 {
            found.push(segments);
        }
        i = j;
    }
    found
}

fn room_of(module: &Module) -> Option<&str> {
    module.path.first().map(String::as_str)
}

#[test]
fn no_room_imports_a_room_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let krate = Crate::read(&src);
    for room in krate.modules[0].children.keys() {
        assert!(floor_of(FLOORS, room).is_some(), "room {room} is in no floor");
    }
    for name in krate.modules[krate.modules[0].children["model"]].children.keys() {
        assert!(floor_of(MODEL_FLOORS, name).is_some(), "model room {name} is in no floor");
    }
    let mut violations = Vec::new();
    for (from, to) in krate.imports() {
        let (a, b) = (&krate.modules[from], &krate.modules[to]);
        let (Some(room), Some(other)) = (room_of(a), room_of(b)) else { continue };
        if room != other {
            if floor_of(FLOORS, other) >= floor_of(FLOORS, room) {
                violations.push(format!(
                    "{}: {room} imports {other} ({})",
                    a.file.display(),
                    b.file.display()
                ));
            }
            continue;
        }
        if room == "model" && a.path.len() > 1 && b.path.len() > 1 && a.path[1] != b.path[1] {
            let (sub, other) = (&a.path[1], &b.path[1]);
            if floor_of(MODEL_FLOORS, other) >= floor_of(MODEL_FLOORS, sub) {
                violations.push(format!("{}: model::{sub} imports model::{other}", a.file.display()));
            }
        }
    }
    assert!(violations.is_empty(), "imports against the floors:\n{}", violations.join("\n"));
}

/// Inside each module: the node (its own file, or one child with everything below it) that
/// module `index` belongs to; `None` for modules outside it.
fn node_in(krate: &Crate, parent: &[String], index: usize) -> Option<String> {
    let path = &krate.modules[index].path;
    if !path.starts_with(parent) {
        return None;
    }
    Some(path.get(parent.len()).cloned().unwrap_or_else(|| "(own file)".to_string()))
}

/// One import circle inside a module.
struct Circle {
    /// `gguf::export`, or `crate` for the rooms.
    module: String,
    /// Its children in the circle, and "(own file)" where the module's own file is.
    members: BTreeSet<String>,
    /// Each import between them: `importing file → imported file`.
    imports: Vec<String>,
}

/// Every import circle inside a module of the library at `src`.
fn circles(src: &Path) -> Vec<Circle> {
    let krate = Crate::read(src);
    let imports = krate.imports();
    let mut found = Vec::new();
    for parent in krate.modules.iter().filter(|m| !m.children.is_empty()) {
        // node → node, with the files that make each edge
        let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for &(from, to) in &imports {
            let (Some(a), Some(b)) = (node_in(&krate, &parent.path, from), node_in(&krate, &parent.path, to))
            else {
                continue;
            };
            if a != b {
                let file = |i: usize| krate.modules[i].file.strip_prefix(src).unwrap().display().to_string();
                edges.entry((a, b)).or_default().insert(format!("{} → {}", file(from), file(to)));
            }
        }
        let module = if parent.path.is_empty() { "crate".to_string() } else { parent.path.join("::") };
        for members in strongly_connected(&edges) {
            let imports = edges
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .flat_map(|(_, files)| files.iter().cloned())
                .collect();
            found.push(Circle { module: module.clone(), members, imports });
        }
    }
    found
}

#[test]
fn no_module_has_an_import_circle_inside() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let failures: Vec<String> = circles(&src)
        .into_iter()
        .map(|Circle { module, members, imports }| {
            format!("in {module}: {members:?}\n    {}", imports.join("\n    "))
        })
        .collect();
    assert!(failures.is_empty(), "import circles:\n{}", failures.join("\n"));
}

/// The reader on a crate of its own: a circle made through `use super::`, a `super::` path in an
/// expression, an inline module's `super::super::` and a `pub use` re-export is found, and a test
/// module's imports are not read.
#[test]
fn a_circle_through_super_paths_and_a_re_export_is_found() {
    let src = std::env::temp_dir().join(format!("lora-ft-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(src.join("room")).unwrap();
    for (file, text) in [
        ("lib.rs", "pub mod other;\npub mod room;\n"),
        ("other.rs", "pub fn f() {}\n"),
        ("room.rs", "mod a;\nmod b;\nmod c;\nmod d;\npub use c::Item;\n"),
        ("room/a.rs", "use super::b::helper;\nuse super::d::Z;\npub fn x() {}\n"),
        ("room/b.rs", "pub fn helper() {\n    super::Item::new();\n}\n"),
        ("room/c.rs", "pub struct Item;\npub mod inner {\n    fn y() { super::super::a::x() }\n}\n"),
        ("room/d.rs", "pub struct Z;\n\n#[cfg(test)]\nmod tests {\n    use crate::room::a;\n}\n"),
    ] {
        std::fs::write(src.join(file), text).unwrap();
    }
    let found = circles(&src);
    std::fs::remove_dir_all(&src).unwrap();
    let [Circle { module, members, imports }] = found.as_slice() else { panic!("{} circles", found.len()) };
    assert_eq!(
        (module.as_str(), members.iter().map(String::as_str).collect::<Vec<_>>()),
        ("room", vec!["a", "b", "c"])
    );
    assert_eq!(imports, &["room/a.rs → room/b.rs", "room/b.rs → room/c.rs", "room/c.rs → room/a.rs"]);
}

/// The groups of two or more nodes that reach one another.
fn strongly_connected(edges: &BTreeMap<(String, String), BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let nodes: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::from([from.clone()]);
        let mut stack = vec![from.clone()];
        while let Some(node) = stack.pop() {
            for (_, b) in edges.keys().filter(|(a, _)| *a == node) {
                if seen.insert(b.clone()) {
                    stack.push(b.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut groups = BTreeSet::new();
    for (node, reached) in &reaches {
        let group: BTreeSet<String> =
            reached.iter().filter(|other| reaches[other].contains(*node)).cloned().collect();
        if group.len() > 1 {
            groups.insert(group);
        }
    }
    groups.into_iter().collect()
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
