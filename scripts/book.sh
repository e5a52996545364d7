#!/usr/bin/env bash
# Builds the book (docs/) into docs/book/ with mdBook, installing the pinned mdBook once (from
# crates.io, without its serve/watch features) if this machine lacks it. The reference pages it
# includes are generated: `cargo run --release -- reference docs/src/reference` rewrites them,
# and tests/reference_pages.rs fails when they are stale; tests/docs.rs checks the links.
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4
if ! mdbook --version 2>/dev/null | grep -qF "v$MDBOOK_VERSION"; then
  cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features --features search
fi
mdbook build docs
# The pages link each number to its bench file in the repository (../../benches/...), which is
# outside the book: the bench files are copied into the book and those links pointed at the copies.
rm -rf docs/book/benches && cp -r benches docs/book/benches
python3 - docs/book <<'PY'
import pathlib, re, sys
book = pathlib.Path(sys.argv[1])
link = re.compile(r'href="(?:\.\./)+benches/([^"#]*?)(?:\.html)?(#[^"]*)?"')
for page in book.rglob("*.html"):
    if page.is_relative_to(book / "benches"):
        continue
    up = "../" * (len(page.relative_to(book).parts) - 1)
    def to_copy(m):
        name = m.group(1)
        if not (book / "benches" / name).exists() and (book / "benches" / (name + ".md")).exists():
            name += ".md"
        return f'href="{up}benches/{name}{m.group(2) or ""}"'
    text = page.read_text(encoding="utf-8")
    new = link.sub(to_copy, text)
    if new != text:
        page.write_text(new, encoding="utf-8")
PY
echo "book: docs/book/index.html"
