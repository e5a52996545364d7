#!/usr/bin/env bash
# Issue 20, deliver 5: tokens/s from 1 to N GPUs of one host, data-parallel (`lora-ft train --gpus N`),
# on the same random model of a real architecture with its real tokenizer and chat template (as
# bench_epoch.sh sets it up), datasets/support-long packed into rows of SEQ tokens (2048), BATCH rows
# a step on each GPU (4: the issue's 2048 × 4 per GPU; train.batch_size is per GPU, so the global
# batch is BATCH × N), LoRA dropout 0 (each rank the computation of one process), STEPS steps of which the
# first WARMUP are not timed; then the table (scripts/bench/compare_scaling.py: tokens/s, the speedup
# over one GPU, its efficiency, and each run's losses).
#   bash scripts/device/scaling.sh llama3.1-8b "1 2 4"     (on nvidia-h100-x4 / -h200-x4; with the
#                                     CUDA lora-ft as .gpu/lora-ft.xz: the tree and it fit one carry)
# MODEL: llama3.1-8b | mistral-7b-v0.3 (their tokenizers and templates from tests/fixtures/tokenizers,
# which travel with the tree). GPUS: the counts to run (default every count
# 1, 2, 4, 8 up to the GPUs nvidia-smi lists). Environment: SEQ, BATCH, STEPS (default 24), WARMUP
# (default 4), GPU_MEM (plan each rank's checkpointing for a card of that many GiB), DATA (the
# dialogues), BUDGET_S (580), WARM_STEPS (0; N: an untimed one-GPU run of N steps first, so that every
# counted run finds the machine's caches — the driver's compiled kernels — as a run before it left
# them; session 14's run 5 needed it, run 6, after the padding and the packed warm-up, did not),
# PACKING (true; false: one dialogue a row, padded per batch), PAD_TO (data.pad_to_multiple_of, 64).
# Each run's log comes back whole, with the steps whose new shapes built cuDNN graphs (debug lines).
# BENCH_DEVICE=cpu: a dry run of this whole command on CPU workers (`--gpus N --device cpu`), with
# the tiny model of the tests (TINY=DIR: a folder with config.json, safetensors, tokenizer and
# template, e.g. /tmp/lora-ft-tiny-smollm2-v1 after `cargo test --test oom_retry`), f32:
#   OUT=/tmp/out PATH=target/release:$PATH BENCH_DEVICE=cpu TINY=/tmp/lora-ft-tiny-smollm2-v1 \
#     bash scripts/device/scaling.sh tiny "1 2"
source scripts/device/bench_setup.sh   # device=cuda|cpu, strict mode
arch=${1:-llama3.1-8b}
budget=${BUDGET_S:-580}
steps=${STEPS:-24}; warmup=${WARMUP:-4}; batch=${BATCH:-4}
dir=/tmp/$arch
if [ "$device" = cpu ]; then
  gpus=${2:-1 2}; dir=${TINY:?BENCH_DEVICE=cpu needs TINY=DIR}; dtype=f32; quant=none; seq=${SEQ:-96}
  data=${DATA:-datasets/customer-service-v1/train.jsonl}   # no tool rows: the tiny template takes none
  device_args=(--device cpu)
else
  # the real tokenizer and template of the family, from the test fixtures that travel with the tree
  fixtures=tests/fixtures/tokenizers
  case $arch in
    mistral-7b-v0.3) tok=($fixtures/vocab/mistral-v0.3.tokenizer.json.gz $fixtures/mistral-v0.3/*) ;;
    llama3.1-8b) tok=($fixtures/vocab/llama3.tokenizer.json.gz $fixtures/llama-3.3/*) ;;
    *) echo "unknown model $arch (llama3.1-8b | mistral-7b-v0.3)" >&2; exit 2 ;;
  esac
  have=$(nvidia-smi -L | wc -l)
  gpus=${2:-$(for n in 1 2 4 8; do if [ $n -le "$have" ]; then printf "%s " $n; fi; done)}
  eval "$(python3 scripts/bench/bench_models.py --shell "$arch")"   # dtype attn issue4 size_gib
  quant=nf4; seq=${SEQ:-2048}; device_args=(); data=${DATA:-datasets/support-long/train.jsonl}
  [ -e $dir/model.safetensors.index.json ] || [ -e $dir/model.safetensors ] \
    || python3 scripts/bench/load_memory_ref.py --model $dir --create $arch 2>&1 | tail -2
  for f in "${tok[@]}"; do
    name=$(basename "$f" .gz); name=${name#*.tokenizer.json}; name=${name:-tokenizer.json}
    case $f in *.gz) gzip -dc "$f" > $dir/$name ;; *) cp "$f" $dir/ ;; esac
  done
fi
echo "{\"model_ready_at_s\": $SECONDS, \"dtype\": \"$dtype\", \"gpus\": \"$gpus\"}"

rm -rf /tmp/scaling; mkdir -p /tmp/scaling
export RUST_LOG=${RUST_LOG:-lora_ft=info,lora_ft::train::run_loop=debug}
runs=()
warm=${WARM_STEPS:-0}
[ "$warm" -gt 0 ] && gpus="warm $gpus"
for name in $gpus; do
  n=$name; config_steps=$steps
  if [ "$name" = warm ]; then n=1; config_steps=$warm; else name=gpus$n; fi
  gpu_mem=""; [ -n "${GPU_MEM:-}" ] && gpu_mem="gpu_mem = $GPU_MEM"
  cat > /tmp/scaling/$name.toml <<EOF
[model]
source = "$dir"
quantization = "$quant"
[lora]
r = 16
alpha = 32
dropout = 0.0
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
[data]
train = "$data"
max_seq_len = $seq
packing = ${PACKING:-true}
pad_to_multiple_of = ${PAD_TO:-64}
[train]
batch_size = $batch
max_steps = $config_steps
lr = 2e-4
warmup_steps = 0
compute_dtype = "$dtype"
device = "$device"
eval_every = 0
log_every = 1
$gpu_mem
[checkpoint]
every = 0
resume = "never"
[output]
dir = "/tmp/scaling/run-$name"
adapters_dir = "/tmp/scaling/adapters"
adapter_name = "$name"
EOF
  left=$((budget - SECONDS)); [ $left -gt 30 ] || left=30
  launch=(); [ "$n" -gt 1 ] && launch=(--gpus $n)
  # the whole log comes back; here its warnings (retries, new plans) and the summary
  if [ "$name" = warm ]; then
    timeout $left lora-ft train /tmp/scaling/warm.toml "${device_args[@]}" > $OUT/train_${arch}_warm.log 2>&1 || true
    echo "{\"warm_done_at_s\": $SECONDS}"; continue
  fi
  timeout $left lora-ft train /tmp/scaling/$name.toml "${launch[@]}" "${device_args[@]}" \
    > $OUT/train_${arch}_gpus$n.log 2>&1 || true
  { grep -E " (WARN|ERROR) " $OUT/train_${arch}_gpus$n.log | head -20; tail -2 $OUT/train_${arch}_gpus$n.log; } || true
  cp /tmp/scaling/run-$name/metrics.jsonl $OUT/lora_ft_${arch}_gpus$n.metrics.jsonl 2>/dev/null || true
  runs+=($n:$OUT/lora_ft_${arch}_gpus$n.metrics.jsonl)
  echo "{\"gpus_${n}_done_at_s\": $SECONDS}"
done
python3 scripts/bench/compare_scaling.py --arch $arch --seq $seq --batch $batch --warmup $warmup "${runs[@]}" \
  | tee $OUT/table_scaling_$arch.md
