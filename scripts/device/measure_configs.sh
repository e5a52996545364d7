#!/usr/bin/env bash
# The ready configs' shapes on the random model of their architecture (made by bench_train.sh in
# the same command): batch x max_seq_len with LoRA dropout 0.05, as configs/*.toml train.
# `bench train` does not accumulate: the f32 gradient sums that grad_accum > 1 keeps (0.16 GiB
# for Mistral-7B, 0.23 GiB for Llama-2-13B) are not in these peaks; `lora-ft estimate` counts them.
#   bash scripts/device/measure_configs.sh mistral-7b|llama2-13b
source scripts/device/setup.sh
arch=$1
case $arch in
  mistral-7b) shapes=1024x4,2048x16 ;;  # configs/mistral-7b.toml, configs/mistral-7b-48g.toml
  llama2-13b) shapes=1024x8,2048x16 ;;  # configs/llama2-13b.toml, configs/llama2-13b-48g.toml
  *) echo "mistral-7b or llama2-13b" >&2; exit 2 ;;
esac
lora-ft bench train --model /tmp/$arch --shapes $shapes --lora-dropout 0.05 --device cuda:0 2>&1 \
  | grep -v " INFO " | tee $OUT/configs_$arch.jsonl
