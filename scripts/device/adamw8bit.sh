#!/usr/bin/env bash
# On the GPU machine, with .gpu-adamw carried (bash scripts/device/pack.sh adamw, here):
# bitsandbytes' AdamW8bit golden from its CUDA kernels (scripts/golden/adamw8bit.py, written into
# tests/golden/ and copied to $OUT to commit), then every AdamW test of the CUDA lib build: the
# CPU paths against the torch and bitsandbytes goldens, the fused CUDA steps against the CPU
# steps and against bitsandbytes' run.
rm -rf .gpu && mv .gpu-adamw .gpu
source scripts/device/setup.sh
python3 -c "import torch, bitsandbytes; print('torch', torch.__version__, 'bitsandbytes', bitsandbytes.__version__)"
python3 scripts/golden/adamw8bit.py --out tests/golden/adamw8bit.safetensors
cp tests/golden/adamw8bit.safetensors tests/golden/adamw8bit.json "$OUT"/
# the test binary names golden files under the tree it was built in
for tree in /work/main /work/wt-adamw; do
  mkdir -p $tree && { [ -e $tree/tests ] || ln -s "$PWD/tests" $tree/tests; }
done
t_lib --test-threads 1 adamw --nocapture 2>&1 | grep -E "^test |test result|panicked|differ|apart|NOTE|: [0-9.]+e-" | tail -80
