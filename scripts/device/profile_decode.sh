#!/usr/bin/env bash
# Where a decode step's GPU time goes (issue 38), on the GPU machine: Nsight Compute times every
# kernel of a few decode steps of `lora-ft bench generate` on the benchmark's random model (the
# folder bench_generate.sh uses), eager (no CUDA graphs: each kernel its own launch; a graph
# replays the same kernels), at each batch size; loading, quantizing, the warm-up and the prefill
# fall outside the profiled range (LORA_FT_PROFILE_RANGE=1, src/profile.rs). Then the same steps
# unprofiled (graphs and eager) for the wall time a step takes beside the kernels' sum.
#   bash scripts/device/profile_decode.sh MODEL [BATCHES]   (after `mv .gpu-bench .gpu`, pack.sh bench)
# Writes, in $OUT, the tables of scripts/bench/ncu_kernels.py for each batch size (profile_ then the
# model's name, .md), the raw and summed kernel times (ncu_ files) and the unprofiled steps' rows
# (steps_ files). Environment: STEPS (decode steps profiled, default 8).
source scripts/device/bench_setup.sh   # device=cuda, strict mode
arch=${1:-llama3.1-8b}
batches=${2:-1,64}
steps=${STEPS:-8}
eval "$(python3 scripts/bench/bench_models.py --shell "$arch")"   # dtype attn issue4 size_gib
dir=/tmp/$arch
python3 scripts/bench/load_memory_ref.py --model $dir --create $arch 2>&1 | tail -3 || true
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
ours=(--model $dir --device cuda:0 --dtype $dtype --ttft-prompt 0)
lora-ft bench generate "${ours[@]}" --batches $batches --new-tokens 64 2>&1 | grep '^{' | tee $OUT/steps_$arch.jsonl || true
lora-ft bench generate "${ours[@]}" --batches $batches --new-tokens 64 --enforce-eager 2>&1 | grep '^{' \
  | tee -a $OUT/steps_$arch.jsonl || true
for b in ${batches//,/ }; do
  csv=$OUT/ncu_${arch}_b$b.csv
  LORA_FT_PROFILE_RANGE=1 timeout 300 $ncu --clock-control none --profile-from-start off \
    --metrics gpu__time_duration.sum --csv --page raw --log-file $csv \
    lora-ft bench generate "${ours[@]}" --batches $b --new-tokens $((steps + 1)) --enforce-eager 2>&1 | grep '^{' || true
  python3 scripts/bench/ncu_kernels.py $csv --label "$arch, batch $b, eager, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    | tee -a $OUT/profile_$arch.md || true
done
