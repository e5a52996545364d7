#!/usr/bin/env bash
# The training benchmark on the GPU machine, both stacks in one command on the same random model
# of a real architecture (scripts/bench/bench_models.py: its published config.json, weights drawn
# on the GPU by scripts/bench/load_memory_ref.py --create), then the side-by-side table with MFU
# (scripts/bench/compare_train.py) and issue 18's targets under it.
#   bash scripts/device/bench_train.sh MODEL [SHAPES]      (after `mv .gpu-bench .gpu`, pack.sh bench)
# MODEL: mistral-7b | llama2-13b (issue 4: the anchor ../shared/anchors/peft_qlora_baseline.py
#   carried in .gpu/, six shapes, 6 timed steps, both stacks' time to the first step), or
#   llama3.1-8b | qwen2.5-7b | qwen3-8b | qwen3-14b | mistral-nemo-12b | gemma2-9b (issue 18: the
#   anchor's recipe in scripts/bench/peft_train_ref.py, 512x8,2048x4,2048x8, 4 timed steps, no
#   first-step timing). Gemma 2 runs in bf16 on both stacks, its reference with eager attention
#   (bench_models.py says why; PEFT_ATTN=sdpa measures transformers' uncapped SDPA path instead).
# Expected wall time per issue 18 model on an H100, from issue 4's rates (PEFT ~3.4-4.0e13,
# lora-ft ~8.5e13 N·tokens/s) and the folder written at >= 1 GB/s: 2.2 min (Qwen2.5-7B) to 3.2 min
# (Qwen3-14B: 42 s to write 29.5 GB, PEFT 91 s, lora-ft 44 s); the 10-minute limit leaves ~3x.
# Environment: STEPS (timed steps), FIRST_STEP=0|1, COLD_WARM=0|1, PEFT_ATTN, GPU_MEM (lora-ft plans its selective
# checkpointing for a card of GPU_MEM GiB, --gpu-mem; the table checks issue 20's targets against
# 0.90 of it; HOLD_CARD=1 also holds the GPU's memory beyond that card, --hold-card), BUDGET_S (default 570: the device
# command's 600 s less a margin): the reference gets what is left after the model is written less
# lora-ft's share, so a slow reference is cut (its JSON keeps the shapes it finished), never lora-ft.
# UNSLOTH=1: Unsloth too, the peer (scripts/bench/unsloth_train_ref.py; `pack.sh unsloth` writes
# .gpu-unsloth/unsloth-site.txz, 4.3 MB: carry it beside bitsandbytes and move both into .gpu, where
# setup.sh unpacks it into /tmp/site), after PEFT and before lora-ft, on the same folder and shapes,
# and a second table of lora-ft beside it; PEFT gets 5/9 of the time left for the references, Unsloth
# the rest. UNSLOTH_SKIP=auto: Unsloth's own selective checkpointing (checkpoint_skip_layers = "auto")
# within GPU_MEM GiB, sized at the first shape.
# BENCH_DEVICE=cpu: a dry run of this whole command on a machine without a GPU, on the toy-sized
# config (bench_models.tiny), f32, no quantization (OUT and lora-ft must be set/found by the caller):
#   OUT=/tmp/out PATH=target/release:$PATH BENCH_DEVICE=cpu bash scripts/device/bench_train.sh qwen3-8b 16x2,32x2
source scripts/device/bench_setup.sh   # device=cuda|cpu, strict mode
arch=${1:-mistral-7b}
settings=$(python3 scripts/bench/bench_models.py --shell "$arch")
eval "$settings"   # dtype attn issue4 size_gib
if [ "$issue4" = 1 ]; then
  shapes=${2:-512x2,512x4,512x8,2048x2,2048x4,2048x8}; steps=${STEPS:-6}; first_step=${FIRST_STEP:-1}
else
  shapes=${2:-512x8,2048x4,2048x8}; steps=${STEPS:-4}; first_step=${FIRST_STEP:-0}
fi
attn=${PEFT_ATTN:-$attn}
budget=${BUDGET_S:-570}
dir=/tmp/$arch
create=(); peft=(--dtype $dtype); ours=(--device cuda:0 --dtype $dtype)
if [ "$device" = cpu ]; then
  dir=/tmp/$arch-tiny; create=(--device cpu --tiny); peft=(--device cpu --quant none --dtype f32)
  ours=(--device cpu --quantization none --dtype f32); issue4=0; first_step=0
fi
# the GPU machine's disk (64 GiB) holds two or three of these folders (14-28 GiB each): on a warm
# machine, make room by removing the other models' folders
if [ ! -e "$dir/model.safetensors" ] && [ ! -e "$dir/model.safetensors.index.json" ] \
    && [ "$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)" -lt $((size_gib + 4)) ]; then
  for other in $(python3 scripts/bench/bench_models.py --names); do [ "$other" = "$arch" ] || rm -rf "/tmp/$other"; done
fi
python3 scripts/bench/load_memory_ref.py --model $dir --create $arch "${create[@]}" 2>&1 | tail -3 || true
echo "{\"model_written_at_s\": $SECONDS, \"dtype\": \"$dtype\", \"reference_attention\": \"$attn\", \"steps\": $steps}"
# FIRST_STEP=1: the reference's time-to-first-step (a second load of the model: ~1 min for 13B)
if [ "$first_step" = 1 ]; then
  python3 scripts/bench/first_step_ref.py --model $dir --shape ${shapes%%,*} --dtype $dtype --attn $attn 2>&1 \
    | grep '^{' | tee $OUT/first_step_ref.json || true
fi
# lora-ft's share: its load, quantization and kernels' first use, then about half the reference's step time
ours_s=$((60 + 3 * size_gib)); peft_s=$((budget - SECONDS - ours_s))
unsloth=${UNSLOTH:-0}; [ "$device" = cuda ] || unsloth=0
[ "$unsloth" = 1 ] && peft_s=$((peft_s * 5 / 9))
[ $peft_s -gt 60 ] || peft_s=60
if [ "$issue4" = 1 ]; then
  timeout $peft_s python3 .gpu/peft_qlora_baseline.py --arch $arch --model $dir --shapes $shapes --steps $steps \
    --out $OUT/peft_$arch.json 2>&1 | grep '^{' || true
else
  timeout $peft_s python3 scripts/bench/peft_train_ref.py --model $dir --arch $arch --shapes $shapes "${peft[@]}" \
    --attn $attn --steps $steps --out $OUT/peft_$arch.json 2>&1 | tee $OUT/peft_$arch.log | grep '^{' || true
fi
peer_args=()
if [ "$unsloth" = 1 ]; then
  unsloth_s=$((budget - SECONDS - 60 - 3 * size_gib)); [ $unsloth_s -gt 60 ] || unsloth_s=60
  skip=(--checkpoint-skip "${UNSLOTH_SKIP:-0}")
  [ "${UNSLOTH_SKIP:-0}" = auto ] && [ -n "${GPU_MEM:-}" ] && skip+=(--gpu-mem "$GPU_MEM")
  timeout $unsloth_s python3 scripts/bench/unsloth_train_ref.py --model $dir --arch $arch --shapes $shapes \
    --dtype $dtype --steps $steps "${skip[@]}" --out $OUT/unsloth_$arch.json 2>&1 | tee $OUT/unsloth_$arch.log \
    | grep '^{' || true
  peer_args=(--peer $OUT/unsloth_$arch.json)
fi
ours_s=$((budget - SECONDS)); [ $ours_s -gt 30 ] || ours_s=30
budget_args=()
# COLD_WARM=1: lora-ft also times its first step on a cold, fresh and warm driver JIT cache
[ "${COLD_WARM:-0}" = 1 ] && ours+=(--first-step-cold-warm)
if [ -n "${GPU_MEM:-}" ]; then
  ours+=(--gpu-mem "$GPU_MEM")
  # HOLD_CARD=1: lora-ft has only what a GPU_MEM card would have (the rest of the GPU held)
  [ "${HOLD_CARD:-0}" = 1 ] && ours+=(--hold-card); budget_args=(--budget-gib "$(python3 -c "print(0.90 * $GPU_MEM)")")
fi
timeout $ours_s lora-ft bench train --model $dir --shapes $shapes "${ours[@]}" --steps $steps 2>&1 \
  | grep -v " INFO " | tee $OUT/lora_ft_$arch.jsonl || true
echo "{\"both_stacks_done_at_s\": $SECONDS}"
[ -e $OUT/peft_$arch.json ] || echo "{\"results\": [], \"arch\": \"$arch\", \"error\": \"no reference JSON\"}" > $OUT/peft_$arch.json
python3 scripts/bench/compare_train.py $OUT/peft_$arch.json $OUT/lora_ft_$arch.jsonl $OUT/first_step_ref.json \
  --config $dir "${budget_args[@]}" "${peer_args[@]}" | tee $OUT/table_$arch.md
