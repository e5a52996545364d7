#!/usr/bin/env bash
# The newcomer's first run, on the CPU: build, fetch the demo model once (SmolLM2-135M-Instruct),
# train configs/quickstart.toml on the shipped customer-service dialogues (tool calls included) into
# adapters/quickstart/, then ask one held-out question without and with the adapter, with the
# store's tools: the tuned model looks the order up instead of inventing its status.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "quickstart: building the release binary first. A first build takes about 25 minutes on a"
echo "2-core machine (later ones recompile only what changed); the run after it, about 3 minutes."
bash scripts/fetch-demo-model.sh
cargo build --release --quiet
started=$SECONDS
BIN=./target/release/lora-ft
CACHE="${LORA_FT_CACHE:-$HOME/.cache/lora-ft}"
MODEL="$CACHE/smollm2-hf"

$BIN data check datasets/customer-service/train.jsonl --config configs/quickstart.toml | head -40
$BIN train configs/quickstart.toml

SYSTEM="You are a helpful customer service assistant."
PROMPT="Hi, my order FH-1234567 still hasn't arrived. What can you do?"
TOOLS=(--chat-template configs/templates/chatml-tools.jinja --tools configs/quickstart-tools.json)   # the delivery tools (rows give 3-4 of the 12)
echo
echo "=== without the adapter"
$BIN chat --model "$MODEL" "${TOOLS[@]}" --system "$SYSTEM" --prompt "$PROMPT" --max-new-tokens 80 --quantization none
echo
echo "=== with adapters/quickstart"
$BIN chat --model "$MODEL" --adapter adapters/quickstart "${TOOLS[@]}" --system "$SYSTEM" --prompt "$PROMPT" --max-new-tokens 80 --quantization none
echo
echo "quickstart: $((SECONDS - started)) s after the build (data check, training, the two chats)"
