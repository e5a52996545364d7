#!/usr/bin/env bash
# The generation benchmark on the GPU machine (issue 38), both stacks in one command on the same
# random model of a real architecture (scripts/bench/bench_models.py's config, written by
# scripts/bench/load_memory_ref.py --create): `lora-ft bench generate` (the engine, NF4, a rank-16
# adapter unmerged) and transformers + PEFT + bitsandbytes `generate` (scripts/bench/generate_ref.py),
# 512-token prompts, 256 new tokens, at each batch size, then the table
# (scripts/bench/compare_generate.py) with each stack's share of the GPU's memory-bandwidth limit.
#   bash scripts/device/bench_generate.sh MODEL [BATCHES]    (after `mv .gpu-bench .gpu`, pack.sh bench)
# MODEL: llama3.1-8b (default) | qwen3-8b | any bench_models.py name. Environment: BUDGET_S (default
# 570), REF_BATCHES (the reference's batch sizes, default BATCHES), NEW_TOKENS (default 256),
# EAGER_BATCHES (lora-ft again at these batch sizes with --enforce-eager, no CUDA graphs; default
# none).
# LLAMACPP=1: llama.cpp too (scripts/device/bench_llamacpp.sh; carry .gpu-llamacpp), after lora-ft
# and before the reference, in at most LLAMACPP_S seconds (default 240; its build, when no built
# binaries are carried, counts in them and is reported as its own row), and its columns in the table.
# BENCH_DEVICE=cpu: a dry run on the toy-sized config without a GPU (lora-ft alone, f32).
source scripts/device/bench_setup.sh   # device=cuda|cpu, strict mode
arch=${1:-llama3.1-8b}
batches=${2:-1,8,64,256}
ref_batches=${REF_BATCHES:-$batches}
new=${NEW_TOKENS:-256}
eval "$(python3 scripts/bench/bench_models.py --shell "$arch")"   # dtype attn issue4 size_gib
budget=${BUDGET_S:-570}
dir=/tmp/$arch; create=(); ours=(--device cuda:0 --dtype $dtype)
if [ "$device" = cpu ]; then
  dir=/tmp/$arch-tiny; create=(--device cpu --tiny); ours=(--device cpu --quantization none --dtype f32)
fi
if [ ! -e "$dir/model.safetensors" ] && [ ! -e "$dir/model.safetensors.index.json" ] \
    && [ "$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)" -lt $((size_gib + 4)) ]; then
  for other in $(python3 scripts/bench/bench_models.py --names); do [ "$other" = "$arch" ] || rm -rf "/tmp/$other"; done
fi
python3 scripts/bench/load_memory_ref.py --model $dir --create $arch "${create[@]}" 2>&1 | tail -3 || true
echo "{\"model_written_at_s\": $SECONDS, \"dtype\": \"$dtype\", \"arch\": \"$arch\"}"
# lora-ft first, then the reference in what is left (a slow reference is cut, never lora-ft)
timeout $((budget - SECONDS - 90)) lora-ft bench generate --model $dir "${ours[@]}" --batches $batches \
  --new-tokens $new 2>&1 | grep '^{' | tee $OUT/lora_ft_generate_$arch.jsonl || true
if [ -n "${EAGER_BATCHES:-}" ]; then
  timeout $((budget - SECONDS - 90)) lora-ft bench generate --model $dir "${ours[@]}" --batches $EAGER_BATCHES \
    --new-tokens $new --ttft-prompt 0 --enforce-eager 2>&1 | grep '^{' | tee $OUT/lora_ft_generate_${arch}_eager.jsonl || true
fi
echo "{\"lora_ft_done_at_s\": $SECONDS}"
llamacpp=()
if [ "${LLAMACPP:-0}" = 1 ]; then
  # the reference keeps at least two minutes; llama.cpp's own script stops itself at its budget
  llama_s=$(( budget - SECONDS - 120 )); [ $llama_s -lt ${LLAMACPP_S:-240} ] || llama_s=${LLAMACPP_S:-240}
  if [ $llama_s -gt 30 ]; then
    BUDGET_S=$llama_s NEW_TOKENS=$new bash scripts/device/bench_llamacpp.sh $arch $batches || true
  fi
  [ -e $OUT/llamacpp_generate_$arch.jsonl ] || : > $OUT/llamacpp_generate_$arch.jsonl
  llamacpp=(--llamacpp $OUT/llamacpp_generate_$arch.jsonl)
  echo "{\"llamacpp_done_at_s\": $SECONDS}"
fi
if [ "$device" = cuda ]; then
  ref_s=$((budget - SECONDS - 15)); [ $ref_s -gt 60 ] || ref_s=60
  timeout $ref_s python3 scripts/bench/generate_ref.py --model $dir --batches $ref_batches --new-tokens $new \
    --dtype $dtype --budget-s $((ref_s - 40)) 2>&1 | tee $OUT/ref_generate_$arch.log | grep '^{' \
    | tee $OUT/ref_generate_$arch.jsonl || true
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
else
  : > $OUT/ref_generate_$arch.jsonl; gpu=cpu
fi
eager=(); [ -s $OUT/lora_ft_generate_${arch}_eager.jsonl ] && eager=(--eager $OUT/lora_ft_generate_${arch}_eager.jsonl)
python3 scripts/bench/compare_generate.py $OUT/lora_ft_generate_$arch.jsonl $OUT/ref_generate_$arch.jsonl \
  --gpu "$gpu" --arch $arch "${eager[@]}" "${llamacpp[@]}" | tee $OUT/table_generate_$arch.md
