#!/usr/bin/env bash
# Causal attention alone on the GPU machine, both stacks in one command: torch's SDPA as
# transformers runs it under PEFT (scripts/bench/attention_ref.py) and `lora-ft bench attention`,
# once on its own kernels and once on cuDNN's SDPA, then the side-by-side tables (Mistral-7B's
# heads by default).
#   bash scripts/device/bench_attention.sh [SHAPES] [extra lora-ft/ref flags, e.g. --head-dim 64]
source scripts/device/setup.sh
shapes=${1:-512x8,2048x8}; shift || true
python3 scripts/bench/attention_ref.py --shapes $shapes "$@" | tee $OUT/attention_ref.jsonl
# both implementations lora-ft has on CUDA: its own kernels and cuDNN's fused SDPA
for kernel in flash cudnn; do
  LORA_FT_ATTENTION=$kernel lora-ft bench attention --shapes $shapes --device cuda:0 "$@" 2>&1 | grep -v " INFO " \
    | tee $OUT/attention_lora_ft_$kernel.jsonl
  echo "lora-ft on $kernel:" | tee -a $OUT/attention.md
  python3 scripts/bench/compare_attention.py $OUT/attention_ref.jsonl $OUT/attention_lora_ft_$kernel.jsonl \
    | tee -a $OUT/attention.md
done
