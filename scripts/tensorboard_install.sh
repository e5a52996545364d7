#!/usr/bin/env bash
# Installs TensorBoard (pinned) into a venv of its own for tests/tensorboard.rs, whose check
# (scripts/tensorboard_check.py) reads lora-ft's event files with TensorBoard's EventAccumulator.
#   $LORA_FT_CACHE (default ~/.cache/lora-ft)/tensorboard/venv
set -euo pipefail
CACHE="${LORA_FT_CACHE:-$HOME/.cache/lora-ft}"
VENV="$CACHE/tensorboard/venv"
if ! "$VENV/bin/python3" -c "import tensorboard" 2>/dev/null; then
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/python3" -m pip install -q tensorboard==2.21.0
fi
