#!/usr/bin/env bash
# The newcomer's first run, on the CPU: build, fetch the demo model once (SmolLM2-135M-Instruct),
# train configs/quickstart.toml on the shipped customer-service dialogues into adapters/quickstart/,
# then ask one question without and with the adapter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-demo-model.sh
cargo build --release --quiet
BIN=./target/release/lora-ft
CACHE="${LORA_FT_CACHE:-$HOME/.cache/lora-ft}"
MODEL="$CACHE/smollm2-hf"

$BIN data check datasets/customer-service/train.jsonl --config configs/quickstart.toml | head -40
$BIN train configs/quickstart.toml

SYSTEM="You help customers of Fernhollow Outfitters with orders, deliveries, returns, billing and account questions. Keep answers short and friendly. If you don't know something, say so."
PROMPT="Hi, my order FH-1234567 still hasn't arrived. What can you do?"
echo
echo "=== without the adapter"
$BIN chat --model "$MODEL" --system "$SYSTEM" --prompt "$PROMPT" --max-new-tokens 80 --quantization none
echo
echo "=== with adapters/quickstart"
$BIN chat --model "$MODEL" --adapter adapters/quickstart --system "$SYSTEM" --prompt "$PROMPT" --max-new-tokens 80 --quantization none
