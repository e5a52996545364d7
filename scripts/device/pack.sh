#!/usr/bin/env bash
# Here, before a GPU-machine run: builds the CUDA binary and test binaries (target/cuda) and packs
# them, xz-compressed, into .gpu/ (git-ignored; name it in the device tool's `carry`), where
# scripts/device/setup.sh unpacks them into /tmp/bin. With SMOLLM2_PART=1|2 it also puts that
# half of the demo model's GGUF in .gpu/ (the whole file is over the 64 MiB a call carries:
# scripts/device/tests.sh joins the halves from two calls on one warm machine).
#   bash scripts/device/pack.sh [test names...]    (default: lora-ft, the lib tests and parity)
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(bash scripts/cuda-toolchain.sh)"
export CARGO_TARGET_DIR=target/cuda
cargo build --release --features cuda --all-targets -q
mkdir -p .gpu && rm -f .gpu/*.xz .gpu/smollm2.part*
tests=("${@:-lib parity}")
# test binaries by name: the newest target/cuda/release/deps/<name>-<hash> that is executable
for t in ${tests[@]}; do
  [ "$t" = lib ] && pattern=lora_ft || pattern=$t
  bin=$(ls -t target/cuda/release/deps/${pattern}-* | grep -v '\.d$' | head -1)
  xz -T2 -6 -c "$bin" > .gpu/t_$t.xz
done
xz -T2 -6 -c target/cuda/release/lora-ft > .gpu/lora-ft.xz
if [ -n "${SMOLLM2_PART:-}" ]; then
  gguf="${LORA_FT_CACHE:-$HOME/.cache/lora-ft}/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
  if [ "$SMOLLM2_PART" = 1 ]; then head -c $half "$gguf" > .gpu/smollm2.part1; else tail -c +$((half + 1)) "$gguf" > .gpu/smollm2.part2; fi
fi
du -ch .gpu/* | tail -1
