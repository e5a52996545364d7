#!/usr/bin/env bash
# Installs OpenAI's Python client (pinned) into a venv of its own for tests/serve.rs, whose
# script (tests/serve/openai_client.py) talks to `lora-ft serve` through it.
#   $LORA_FT_CACHE (default ~/.cache/lora-ft)/openai/venv
set -euo pipefail
CACHE="${LORA_FT_CACHE:-$HOME/.cache/lora-ft}"
VENV="$CACHE/openai/venv"
if ! "$VENV/bin/python3" -c "import openai" 2>/dev/null; then
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/python3" -m pip install -q openai==3.51.0
fi
