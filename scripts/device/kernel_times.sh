#!/usr/bin/env bash
# Per-kernel GPU time of lora-ft's training step (Nsight Compute, one metric: each kernel's
# duration, clocks left alone as METHOD.md asks), summed by kernel name over the timed steps of
# `lora-ft bench train`: what the LORA_FT_PROFILE sections cannot say (they synchronize around
# every section, so small ones read high), kernel by kernel.
#   [GPU_MEM=24] bash scripts/device/kernel_times.sh [mistral-7b|llama2-13b] [SHAPE]
# Prints the kernels by time per step, largest first (ms, launches per step, share of the step),
# then the step's time by kind (GEMMs, NF4 dequantization, attention, ...). The model load's
# quantization kernels (nf4_absmax, nf4_pack, dq_codes, dq_absmax2) are summed apart: they are not
# part of a step.
source scripts/device/setup.sh
arch=${1:-llama2-13b}; shape=${2:-512x8}
dir=/tmp/$arch
mem=(); [ -n "${GPU_MEM:-}" ] && mem=(--gpu-mem "$GPU_MEM")
[ -e $dir/config.json ] || python3 scripts/bench/load_memory_ref.py --model $dir --create $arch
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
# 2 warm-up steps then 2 timed ones; model loading's kernels (quantization) are counted apart
"$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  lora-ft bench train --model $dir --shapes $shape --steps 2 --device cuda:0 "${mem[@]}" \
  > /tmp/ncu_$arch.csv 2>/tmp/ncu_$arch.err || { tail -20 /tmp/ncu_$arch.err; }
grep -v " INFO " /tmp/ncu_$arch.err | tail -3 || true
xz -c /tmp/ncu_$arch.csv > $OUT/ncu_${arch}_$shape.csv.xz
python3 scripts/bench/kernel_table.py /tmp/ncu_$arch.csv --steps 4 | tee $OUT/kernel_times_${arch}_$shape.md
