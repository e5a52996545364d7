//! The README and the book (`docs/src/`) hold together: every relative link reaches a file that
//! exists (and a `#heading` that exists in it), every page is in the book's SUMMARY.md, and every
//! paragraph or table row that states a speed-up (`2.3×`) links to the bench file that measured it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every Markdown page of the book.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("docs/src"), &mut out);
    out.sort();
    out
}

/// The text with fenced code blocks and inline code blanked out (links there are not links). An
/// inline code span may wrap onto the next line; a blank line ends it.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        if line.trim().is_empty() {
            in_code = false;
        }
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            }
            out.push(if in_code || c == '`' { ' ' } else { c });
        }
        out.push('\n');
    }
    out
}

/// The targets of inline links and images: `[text](target)` and `[text](target "title")`.
fn link_targets(prose: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = prose;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("").trim_matches(['<', '>']);
        targets.push(target.to_string());
        rest = &after[end.min(after.len())..];
    }
    targets
}

/// A heading's anchor as GitHub and mdBook make it: lowercase, spaces to hyphens, punctuation
/// other than `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in link_targets(&prose(&text)) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
            if !file.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let (Some(anchor), true) = (anchor, file.extension().is_some_and(|e| e == "md")) {
                if !anchors(&std::fs::read_to_string(&file).unwrap()).contains(anchor) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_is_in_the_summary() {
    let src = root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> =
        link_targets(&prose(&summary)).iter().filter(|t| !t.is_empty()).map(|t| src.join(t)).collect();
    let unlisted: Vec<String> = pages()
        .into_iter()
        .filter(|p| p.starts_with(&src) && !p.ends_with("SUMMARY.md") && !listed.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    assert!(unlisted.is_empty(), "pages the book does not list in SUMMARY.md: {unlisted:?}");
    for page in &listed {
        assert!(page.exists(), "SUMMARY.md lists {} which does not exist", page.display());
    }
}

/// A speed-up stated without its measurement is a claim, not a number.
#[test]
fn every_speedup_links_to_its_bench() {
    let mut unsourced = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let prose = prose(&text);
        let mut blocks: Vec<String> = Vec::new();
        let mut paragraph = String::new();
        for line in prose.lines() {
            if line.trim_start().starts_with('|') {
                blocks.push(line.to_string());
            } else if line.trim().is_empty() {
                blocks.push(std::mem::take(&mut paragraph));
            } else {
                paragraph.push_str(line);
                paragraph.push('\n');
            }
        }
        blocks.push(paragraph);
        for block in blocks {
            let states_speedup = block
                .char_indices()
                .any(|(i, c)| c == '×' && block[..i].chars().next_back().is_some_and(|p| p.is_ascii_digit()));
            if states_speedup && !block.contains("benches/") {
                let first = block.trim().lines().next().unwrap_or("").chars().take(100).collect::<String>();
                unsourced.push(format!("{}: {first}", page.display()));
            }
        }
    }
    assert!(unsourced.is_empty(), "speed-ups without a link to benches/:\n{}", unsourced.join("\n"));
}
