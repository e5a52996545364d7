#!/usr/bin/env bash
# The ready configs' shapes on the random model of their architecture: batch x max_seq_len with
# LoRA dropout 0.05 in the config's dtype, as configs/*.toml train. The model folder is the one
# bench_train.sh writes (/tmp/MODEL), written here first when this command runs on its own.
# `bench train` does not accumulate: the f32 gradient sums that grad_accum > 1 keeps (0.16 GiB
# for Mistral-7B, 0.23 GiB for Llama-2-13B) are not in these peaks; `lora-ft estimate` counts them.
#   bash scripts/device/measure_configs.sh mistral-7b|llama2-13b|llama3.1-8b|qwen3-8b|qwen3-14b|gemma2-9b
source scripts/device/setup.sh
arch=$1
case $arch in
  mistral-7b) shapes=1024x4,2048x16 ;;  # configs/mistral-7b.toml, configs/mistral-7b-48g.toml
  llama2-13b) shapes=1024x8,2048x16 ;;  # configs/llama2-13b.toml, configs/llama2-13b-48g.toml
  # configs/NAME.toml and configs/NAME-48g.toml: 16 x 4096 since the MLP runs in row tiles
  # (benches/issue20/; issue 18's 24 GB configs were 8 x 4096 with grad_accum 2)
  llama3.1-8b|qwen3-8b|qwen3-14b|gemma2-9b) shapes=4096x16 ;;
  *) echo "mistral-7b, llama2-13b, llama3.1-8b, qwen3-8b, qwen3-14b or gemma2-9b" >&2; exit 2 ;;
esac
eval "$(python3 scripts/bench/bench_models.py --shell "$arch")"   # dtype attn issue4 size_gib
dir=/tmp/$arch
# a warm machine's disk (64 GiB) holds two or three model folders: make room for this one
if [ ! -e "$dir/model.safetensors" ] && [ ! -e "$dir/model.safetensors.index.json" ] \
    && [ "$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)" -lt $((size_gib + 4)) ]; then
  for other in $(python3 scripts/bench/bench_models.py --names); do [ "$other" = "$arch" ] || rm -rf "/tmp/$other"; done
fi
python3 scripts/bench/load_memory_ref.py --model $dir --create $arch 2>&1 | tail -1
lora-ft bench train --model $dir --shapes $shapes --lora-dropout 0.05 --dtype $dtype --device cuda:0 \
  --steps ${STEPS:-6} 2>&1 | grep -v " INFO " | tee $OUT/configs_$arch.jsonl
