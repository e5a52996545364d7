#!/usr/bin/env bash
# Causal attention alone on the GPU machine, both stacks in one command: torch's SDPA as
# transformers runs it under PEFT (scripts/bench/attention_ref.py) and `lora-ft bench attention`,
# then the side-by-side table (Mistral-7B's heads by default).
#   bash scripts/device/bench_attention.sh [SHAPES] [extra lora-ft/ref flags, e.g. --head-dim 64]
source scripts/device/setup.sh
shapes=${1:-512x8,2048x8}; shift || true
python3 scripts/bench/attention_ref.py --shapes $shapes "$@" | tee $OUT/attention_ref.jsonl
lora-ft bench attention --shapes $shapes --device cuda:0 "$@" 2>&1 | grep -v " INFO " | tee $OUT/attention_lora_ft.jsonl
python3 scripts/bench/compare_attention.py $OUT/attention_ref.jsonl $OUT/attention_lora_ft.jsonl | tee $OUT/attention.md
