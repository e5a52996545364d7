#!/usr/bin/env bash
# Issue 3 on the GPU machine: the NF4 CUDA kernels against bitsandbytes' golden file and the CPU
# reference, then GPU memory and time to load a random Mistral-7B / Llama-2-13B in NF4,
# lora-ft beside transformers + bitsandbytes on the same folder, in the same run.
#   bash scripts/device/nf4_load.sh [mistral-7b|llama2-13b ...]
source scripts/device/setup.sh
[ -n "${SKIP_GOLDEN:-}" ] || nf4_golden --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|ulp|exact" | tail -12
for arch in "${@:-mistral-7b}"; do
  dir=/tmp/$arch
  t0=$(date +%s); python3 scripts/bench/load_memory_ref.py --model $dir --create $arch; echo "created $dir in $(( $(date +%s) - t0 )) s"
  lora-ft bench load --model $dir --dtype f16 --device cuda:0 2>&1 | grep -v " INFO " | tee /tmp/ours.txt
  python3 scripts/bench/load_memory_ref.py --model $dir 2>&1 | grep -v Warn | tail -3 | tee /tmp/ref.txt
  grep -h '^{' /tmp/ours.txt /tmp/ref.txt >> $OUT/nf4_load.jsonl || true
done
