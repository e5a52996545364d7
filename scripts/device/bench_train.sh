#!/usr/bin/env bash
# Issue 4's benchmark on the GPU machine, both stacks in one command on the same random model:
# ../shared/anchors/peft_qlora_baseline.py (carried in .gpu/) and `lora-ft bench train`, then the
# side-by-side table (scripts/bench/compare_train.py), with both stacks' time to the first step
# (scripts/bench/first_step_ref.py; `first_step_s` of lora-ft's first shape).
#   bash scripts/device/bench_train.sh [mistral-7b|llama2-13b] [SHAPES]
source scripts/device/setup.sh
arch=${1:-mistral-7b}; shapes=${2:-512x2,512x4,512x8,2048x2,2048x4,2048x8}
dir=/tmp/$arch
# written in fp16 directly (the anchor's own writer builds fp32 first: 13B would not fit beside it)
python3 scripts/bench/load_memory_ref.py --model $dir --create $arch
# FIRST_STEP=0 skips the reference's time-to-first-step (a second load of the model: ~1 min for 13B)
if [ "${FIRST_STEP:-1}" = 1 ]; then
  python3 scripts/bench/first_step_ref.py --model $dir --shape ${shapes%%,*} 2>&1 | grep '^{' | tee $OUT/first_step_ref.json
fi
python3 .gpu/peft_qlora_baseline.py --arch $arch --model $dir --shapes $shapes --out $OUT/peft_$arch.json 2>&1 \
  | grep '^{' || true
lora-ft bench train --model $dir --shapes $shapes --device cuda:0 2>&1 | grep -v " INFO " | tee $OUT/lora_ft_$arch.jsonl
python3 scripts/bench/compare_train.py $OUT/peft_$arch.json $OUT/lora_ft_$arch.jsonl $OUT/first_step_ref.json | tee $OUT/table_$arch.md
