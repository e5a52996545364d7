#!/usr/bin/env bash
# Installs llama.cpp for tests/gguf_llamacpp.rs without building it: the prebuilt CPU libraries
# of npm's @node-llama-cpp/linux-x64 and the llama.h of the same llama.cpp release (the source
# bundle that the node-llama-cpp package ships), then compiles scripts/gguf_llamacpp_run.c
# against them. Both tarballs are pinned by version and sha256.
#   $LORA_FT_CACHE (default ~/.cache/lora-ft)/llamacpp/{lib,include,bin/gguf_llamacpp_run,venv}
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=3.22.1
MAIN_SHA256=a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f
BINS_SHA256=0d953e1503d5ab4608d8ed5b739132308c81ac05ffeb760d2a7f30e08a9f90e0
CACHE="${LORA_FT_CACHE:-$HOME/.cache/lora-ft}"
DIR="$CACHE/llamacpp"
[ "$(uname -sm)" = "Linux x86_64" ] || { echo "the prebuilt llama.cpp here is for Linux x86_64 only" >&2; exit 1; }
if [ "$(cat "$DIR/version" 2>/dev/null)" != "node-llama-cpp $VERSION" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack -q "node-llama-cpp@$VERSION" "@node-llama-cpp/linux-x64@$VERSION" >/dev/null)
  echo "$MAIN_SHA256  $tmp/node-llama-cpp-$VERSION.tgz" | sha256sum -c --quiet
  echo "$BINS_SHA256  $tmp/node-llama-cpp-linux-x64-$VERSION.tgz" | sha256sum -c --quiet
  tar -xzf "$tmp/node-llama-cpp-$VERSION.tgz" -C "$tmp" package/llama/gitRelease.bundle
  mkdir -p "$tmp/bins"
  tar -xzf "$tmp/node-llama-cpp-linux-x64-$VERSION.tgz" -C "$tmp/bins" --strip-components=3 package/bins/linux-x64
  git -c init.defaultBranch=main clone -q --bare "$tmp/package/llama/gitRelease.bundle" "$tmp/src.git"
  rm -rf "$DIR.part"
  mkdir -p "$DIR.part/lib" "$DIR.part/include" "$DIR.part/bin"
  cp "$tmp"/bins/libllama.*so "$tmp"/bins/libggml*.so "$DIR.part/lib/"
  git -C "$tmp/src.git" archive HEAD include/llama.h ggml/include | tar -x -C "$tmp"
  cp "$tmp/include/llama.h" "$tmp"/ggml/include/*.h "$DIR.part/include/"
  echo "node-llama-cpp $VERSION" > "$DIR.part/version"
  rm -rf "$DIR"
  mv "$DIR.part" "$DIR"
fi
# the checks' Python (scripts/gguf_llamacpp_*.py): numpy and jinja2 in a venv of its own
if ! "$DIR/venv/bin/python3" -c "import numpy, jinja2" 2>/dev/null; then
  rm -rf "$DIR/venv"
  python3 -m venv "$DIR/venv"
  "$DIR/venv/bin/python3" -m pip install -q numpy==2.4.6 jinja2==3.1.6
fi
# the helper is compiled on every run, so that it always matches scripts/gguf_llamacpp_run.c
lib=$(cd "$DIR/lib" && ls libllama.*so libggml.*so libggml-base.so | tr '\n' ' ')
(cd "$DIR/lib" && cc -O2 -std=c11 -Wall -Werror -I../include "$OLDPWD/scripts/gguf_llamacpp_run.c" -o ../bin/gguf_llamacpp_run.part \
  $lib -Wl,-rpath,'$ORIGIN/../lib')
mv "$DIR/bin/gguf_llamacpp_run.part" "$DIR/bin/gguf_llamacpp_run"
sha256sum < scripts/gguf_llamacpp_run.c | cut -d' ' -f1 > "$DIR/bin/gguf_llamacpp_run.source-sha256"
echo "llama.cpp: $DIR ($(cat "$DIR/version"))"
