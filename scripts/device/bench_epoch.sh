#!/usr/bin/env bash
# Issue 19's benchmark on real dialogues, both stacks in one command on the same random model of a
# real architecture with its real tokenizer and chat template: one epoch of
# datasets/customer-service and of datasets/support-long at max_seq_len 2048, batch 8, by
#   lora-ft (data.packing = true) and
#   TRL's SFTTrainer + PEFT + bitsandbytes (packing "bfd", Liger where it imports; scripts/bench/trl_sft_ref.py),
# both on exactly the same tokens (`lora-ft data tokenize`), then lora-ft's own 2048x8 random-token
# rate (`lora-ft bench train`), and the table (scripts/bench/compare_epoch.py).
#   bash scripts/device/bench_epoch.sh MODEL          (after `mv .gpu-epoch .gpu`: the CUDA lora-ft,
#                                                      bitsandbytes, TRL and its missing wheels, tok/)
# MODEL: mistral-7b-v0.3 (the v3 tokenizer: its template takes tools) | llama3.1-8b (Llama 3's
#   tokenizer, the Llama 3.1/3.3 template). The tokenizers are the fixtures of
#   tests/fixtures/tokenizers (copied into .gpu/tok/ by the caller: the carry limit leaves the test
#   fixtures behind).
# Environment: LR (default 2e-4, the usual QLoRA rate), SEED2 (default 7: a second lora-ft epoch
# with another seed, for lora-ft's own run-to-run spread of the eval loss; 0 = none),
# SETS (default, when unset, "customer-service support-long"; one set a command keeps a 7-8B model within the
# 10-minute limit), BENCH_RANDOM=0 (skip the 2048x8 random-token run), SKIP_TRL=1, ROWS=N (the
# first N rows only), BUDGET_S (default 580).
# BENCH_DEVICE=cpu: a dry run of this whole command on a machine with no GPU, on the tiny ChatML
# model of scripts/bench/tiny_chatml_model.py, f32, no quantization, a few rows:
#   OUT=/tmp/out PATH=target/release:$PATH BENCH_DEVICE=cpu bash scripts/device/bench_epoch.sh tiny
source scripts/device/bench_setup.sh   # device=cuda|cpu, strict mode
arch=${1:-mistral-7b-v0.3}
lr=${LR:-2e-4}
seed2=${SEED2:-7}
sets=${SETS-customer-service support-long}
budget=${BUDGET_S:-580}
dir=/tmp/$arch
case $arch in
  mistral-7b-v0.3) tok=.gpu/tok/mistral-v0.3 ;;
  llama3.1-8b) tok=.gpu/tok/llama-3 ;;
  tiny) tok= ;;
  *) echo "unknown model $arch" >&2; exit 2 ;;
esac
if [ "$device" = cpu ]; then
  dtype=f32; quant=none; rows=${ROWS:-24}; batch=2; seq=${SEQ:-1024}
  [ -e $dir/config.json ] || python3 scripts/bench/tiny_chatml_model.py $dir
else
  eval "$(python3 scripts/bench/bench_models.py --shell "$arch")"   # dtype attn issue4 size_gib
  # bf16 on both sides: TRL casts a quantized model's LoRA weights to bf16 (QLoRA's recipe), which
  # f16's loss scaling then refuses ("_amp_foreach_non_finite_check_and_unscale_cuda" not
  # implemented for 'BFloat16')
  dtype=${DTYPE:-bf16}
  quant=nf4; rows=${ROWS:-0}; batch=8; seq=2048
  [ -e $dir/model.safetensors.index.json ] || python3 scripts/bench/load_memory_ref.py --model $dir --create $arch 2>&1 | tail -2
  for f in $tok/*; do
    case $f in *.gz) gzip -dc "$f" > $dir/$(basename "$f" .gz) ;; *) cp "$f" $dir/ ;; esac
  done
fi
echo "{\"model_written_at_s\": $SECONDS, \"dtype\": \"$dtype\", \"lr\": $lr}"

# the same tokens for both stacks: every kept row as lora-ft trains it
config() {  # NAME TRAIN EVAL [SEED] -> /tmp/epoch/NAME.toml
  cat > /tmp/epoch/$1.toml <<EOF
[model]
source = "$dir"
quantization = "$quant"
[lora]
r = 16
alpha = 32
dropout = 0.0
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
[data]
train = "$2"
eval = "$3"
max_seq_len = $seq
packing = true
[train]
batch_size = $batch
seed = ${4:-42}
epochs = 1.0
lr = $lr
schedule = "cosine"
warmup_steps = 0
max_grad_norm = 1.0
compute_dtype = "$dtype"
device = "$device"
eval_every = 0
log_every = 1
[optim]
flavor = "hf"
[checkpoint]
every = 0
resume = "never"
[output]
dir = "/tmp/epoch/run-$1"
adapters_dir = "/tmp/epoch/adapters"
adapter_name = "$1"
EOF
}
rm -rf /tmp/epoch; mkdir -p /tmp/epoch
runs=()
for set in $sets; do
  train=datasets/$set/train.jsonl; eval_=datasets/$set/eval.jsonl
  if [ "$rows" != 0 ]; then
    head -n $rows $train > /tmp/epoch/$set-train.jsonl; head -n $((rows / 4)) $eval_ > /tmp/epoch/$set-eval.jsonl
    train=/tmp/epoch/$set-train.jsonl; eval_=/tmp/epoch/$set-eval.jsonl
  fi
  config $set $train $eval_
  [ "$seed2" = 0 ] || config $set-seed$seed2 $train $eval_ $seed2
  lora-ft data tokenize $train --config /tmp/epoch/$set.toml --out $OUT/tokens_${arch}_$set-train.jsonl 2>&1 | grep -v INFO || true
  lora-ft data tokenize $eval_ --config /tmp/epoch/$set.toml --out /tmp/epoch/tokens_$set-eval.jsonl 2>&1 | grep -v INFO || true
  runs+=(--run $set:$OUT/tokens_${arch}_$set-train.jsonl:/tmp/epoch/tokens_$set-eval.jsonl)
  runs+=(--score lora-ft-$set:/tmp/epoch/adapters/$set:/tmp/epoch/tokens_$set-eval.jsonl)
done
echo "{\"tokenized_at_s\": $SECONDS}"

# lora-ft first (its share is about a third of the reference's), then the reference with what is left
for set in $sets; do
  lora-ft train /tmp/epoch/$set.toml 2>&1 | grep -v " INFO " | tail -4 || true
  cp /tmp/epoch/run-$set/metrics.jsonl $OUT/lora_ft_${arch}_$set.metrics.jsonl || true
  echo "{\"lora_ft_${set}_done_at_s\": $SECONDS}"
  if [ "$seed2" != 0 ]; then
    lora-ft train /tmp/epoch/$set-seed$seed2.toml 2>&1 | grep -v " INFO " | tail -2 || true
    cp /tmp/epoch/run-$set-seed$seed2/metrics.jsonl $OUT/lora_ft_${arch}_$set-seed$seed2.metrics.jsonl || true
  fi
done
if [ "$device" = cuda ] && [ "${BENCH_RANDOM:-1}" = 1 ]; then
  lora-ft bench train --model $dir --shapes 2048x8 --device cuda:0 --dtype $dtype --steps 4 2>&1 \
    | grep -v " INFO " | tee $OUT/lora_ft_${arch}_random.jsonl || true
fi
trl_device=(); [ "$device" = cuda ] || trl_device=(--device cpu --quant none)
echo "{\"lora_ft_done_at_s\": $SECONDS}"
if [ "${SKIP_TRL:-0}" != 1 ]; then
  timeout $((budget - SECONDS)) python3 scripts/bench/trl_sft_ref.py --model $dir "${runs[@]}" --dtype $dtype \
    --lr $lr --max-len $seq --batch $batch "${trl_device[@]}" --out $OUT/trl_$arch.json 2>&1 \
    | tee $OUT/trl_$arch.log | grep '^{' || true
fi
echo "{\"both_stacks_done_at_s\": $SECONDS}"
python3 scripts/bench/compare_epoch.py --arch $arch --out-dir $OUT --sets $sets | tee $OUT/table_epoch_$arch.md
