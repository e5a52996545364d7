#!/usr/bin/env bash
# Where lora-ft's training step goes on the GPU machine (issue 5's profile): `lora-ft bench train`
# unprofiled (tokens/s, MFU, peak memory), then with LORA_FT_PROFILE=1 (each kind of work in its
# own synchronized section, seconds per step), on the random model of the anchor's architecture.
#   [GPU_MEM=24] bash scripts/device/profile_train.sh [mistral-7b|llama2-13b] [SHAPES]
# GPU_MEM plans selective checkpointing for a card of that many GiB (`--gpu-mem`).
source scripts/device/setup.sh
arch=${1:-mistral-7b}; shapes=${2:-512x8,2048x8}
dir=/tmp/$arch
mem=(); [ -n "${GPU_MEM:-}" ] && mem=(--gpu-mem "$GPU_MEM")
[ -e $dir/config.json ] || python3 scripts/bench/load_memory_ref.py --model $dir --create $arch
lora-ft bench train --model $dir --shapes $shapes --device cuda:0 "${mem[@]}" 2>&1 | grep -v " INFO " | tee $OUT/bench_$arch.jsonl
LORA_FT_PROFILE=1 lora-ft bench train --model $dir --shapes $shapes --steps 3 --device cuda:0 "${mem[@]}" 2>&1 \
  | grep -v " INFO " | tee $OUT/profile_$arch.jsonl
