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
echo "book: docs/book/index.html"
