#!/usr/bin/env bash
# Where a training step's GPU time goes, region by region (src/profile.rs `timeline`): `lora-ft
# bench train` with LORA_FT_TIMELINE=1 records a CUDA event and the host clock after every layer's
# forward and backward, the loss, the clip and the optimizer of the last timed step; `nvidia-smi
# dmon` logs power and clocks beside it (a GPU slowed by its power limit shows there).
#   GPU_MEM=24 bash scripts/device/timeline.sh [llama2-13b] [512x8]
source scripts/device/setup.sh
arch=${1:-llama2-13b}; shape=${2:-512x8}
dir=/tmp/$arch
mem=(); [ -n "${GPU_MEM:-}" ] && mem=(--gpu-mem "$GPU_MEM")
[ -e $dir/config.json ] || python3 scripts/bench/load_memory_ref.py --model $dir --create $arch
nvidia-smi dmon -s pc -d 1 > $OUT/dmon_$arch.txt 2>&1 & dmon=$!
LORA_FT_TIMELINE=1 lora-ft bench train --model $dir --shapes $shape --steps ${STEPS:-6} --device cuda:0 "${mem[@]}" \
  2>&1 | grep -v " INFO " | tee $OUT/timeline_$arch.jsonl
lora-ft bench train --model $dir --shapes $shape --steps ${STEPS:-6} --device cuda:0 "${mem[@]}" \
  2>&1 | grep -v " INFO " | tee $OUT/untimed_$arch.jsonl
kill $dmon || true
python3 scripts/bench/timeline.py $OUT/timeline_$arch.jsonl --all | tee $OUT/timeline_$arch.md
