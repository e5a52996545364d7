#!/usr/bin/env bash
# Issue 20's cold start on the GPU machine, one command: what each kernel module costs to load
# on a fresh machine (`CUDA_CACHE_DISABLE=1 lora-ft bench kernels`: ours from fatbins, candle's
# compiled from PTX), then the time from process start to the end of the first training step
# (512 x 2, the model files in the page cache) of lora-ft on a cold (CUDA_CACHE_DISABLE=1), a fresh
# (empty cache) and a warm driver JIT cache (`bench train --first-step-cold-warm`), beside the
# reference's (transformers + PEFT + bitsandbytes, scripts/bench/first_step_ref.py) in the same run.
#   bash scripts/device/cold_start.sh [MODEL]      (after pack.sh bench, its folder moved to .gpu/)
# STAGE=ours runs lora-ft's part only, STAGE=ref the reference's and the table (two calls on a warm
# machine when the binary and the bitsandbytes wheel do not fit in one call's carry); default both.
# STAGE=profile: where the start goes instead — lora-ft's first step on a cold, a fresh and a warm
# JIT cache with LORA_FT_PROFILE=1, each row's `startup` (milestones from process start, the first
# step's sections, the PTX the driver still compiled).
source scripts/device/setup.sh
export PYTHONUNBUFFERED=1
arch=${1:-mistral-7b}
eval "$(python3 scripts/bench/bench_models.py --shell "$arch")"   # dtype attn issue4 size_gib
dir=/tmp/$arch
stage=${STAGE:-all}; res=/tmp/cold_start; mkdir -p $res
python3 scripts/bench/load_memory_ref.py --model $dir --create $arch 2>&1 | tail -1 || true
cat $dir/*.safetensors > /dev/null   # into the page cache, as for the reference
if [ "$stage" = profile ]; then
  cache=/tmp/cold_start_jit; rm -rf $cache
  for run in cold fresh warm; do
    echo "== $run"
    env=(CUDA_CACHE_PATH=$cache); [ $run = cold ] && env=(CUDA_CACHE_DISABLE=1)
    env "${env[@]}" LORA_FT_PROFILE=1 lora-ft bench train --model $dir --shapes 512x2 --steps 1 --dtype $dtype \
      2>&1 | grep -v " INFO " | tee $res/startup_${run}_$arch.jsonl
  done
  cp $res/startup_* $OUT/
  exit 0
fi
if [ "$stage" != ref ]; then
  echo "== CUDA_CACHE_DISABLE=1 lora-ft bench kernels"
  CUDA_CACHE_DISABLE=1 lora-ft bench kernels | tee $res/kernels_$arch.jsonl
  echo "== lora-ft's first steps (cold, fresh, warm), then 512 x 2 timed"
  lora-ft bench train --model $dir --shapes 512x2 --steps 3 --dtype $dtype --first-step-cold-warm 2>&1 \
    | grep -v " INFO " | tee $res/first_steps_$arch.jsonl || true
fi
if [ "$stage" != ours ]; then
  echo "== the reference's first step"
  python3 scripts/bench/first_step_ref.py --model $dir --shape 512x2 --dtype $dtype --attn $attn 2>&1 \
    | grep '^{' | tee $res/first_step_ref_$arch.json || true
fi
cp $res/*_$arch.json* $OUT/ 2>/dev/null || true
[ "$stage" = ours ] && exit 0
python3 - "$res/first_step_ref_$arch.json" "$res/first_steps_$arch.jsonl" <<'PY' | tee $OUT/cold_start_$arch.md
import json, sys
ref = next((json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")), None)
ours = next((json.loads(l) for l in open(sys.argv[2]) if l.startswith("{") and "first_steps" in l), None)
if ref and ours:
    f = ours["first_steps"]
    print("| first step from process start (512 x 2) | seconds | vs reference |\n|---|---:|---:|")
    print(f"| transformers + PEFT + bitsandbytes | {ref['first_step_s']:.2f} | 1.00 |")
    for k, name in [("cold_s", "lora-ft, cold (CUDA_CACHE_DISABLE=1)"), ("fresh_s", "lora-ft, fresh (empty cache)"),
                    ("warm_s", "lora-ft, warm")]:
        print(f"| {name} | {f[k]:.2f} | {f[k] / ref['first_step_s']:.2f} |")
PY
