#!/usr/bin/env bash
# The test suite on the GPU machine, from the binaries scripts/device/pack.sh put in .gpu/:
# the CUDA tests (every kernel against the composed CPU ops, parity with transformers on CUDA in
# f32 and f16), then every carried test binary on the CPU with RAYON_NUM_THREADS=1, 2 and the
# machine's default. The demo model arrives in two halves (SMOLLM2_PART in pack.sh), kept in
# /tmp/smollm2 between the calls of one warm machine, and is imported once both are there.
#   bash scripts/device/tests.sh cuda|cpu
source scripts/device/setup.sh
mkdir -p /tmp/smollm2 /work/main/target/cuda/release
cp .gpu/smollm2.part* /tmp/smollm2/ 2>/dev/null || true
ln -sf /tmp/bin/lora-ft /work/main/target/cuda/release/lora-ft   # tests start the binary by its build path
export LORA_FT_CACHE=/tmp/lora-ft-cache
if [ -f /tmp/smollm2/smollm2.part1 ] && [ -f /tmp/smollm2/smollm2.part2 ] && [ ! -d $LORA_FT_CACHE/smollm2-hf ]; then
  mkdir -p $LORA_FT_CACHE/smollm2
  cat /tmp/smollm2/smollm2.part1 /tmp/smollm2/smollm2.part2 > $LORA_FT_CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  want=$(cut -d' ' -f1 scripts/convergence/smollm2.gguf.sha256)
  [ "$(sha256sum < $LORA_FT_CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -d' ' -f1)" = "$want" ] \
    || echo "the joined SmolLM2 GGUF does not match scripts/convergence/smollm2.gguf.sha256"
  lora-ft import $LORA_FT_CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $LORA_FT_CACHE/smollm2-hf | tail -1
fi
lscpu | grep -E "^Model name|^CPU\(s\)|Flags" | sed 's/\(Flags:\).*\(avx512f\).*/\1 ... \2 .../' | cut -c1-120
cd /work/main
case "${1:-cuda}" in
  cuda)
    t_lib --test-threads 1 cuda fused offload streamed_loss 2>&1 | grep -E "^test |test result|panicked|rel err" | tail -40
    LORA_FT_TEST_DEVICE=cuda t_parity --test-threads 1 tiny --nocapture 2>&1 | grep -E "worst|test result|panicked|^test " ;;
  cpu)
    for n in 1 2 default; do
      if [ $n = default ]; then unset RAYON_NUM_THREADS; else export RAYON_NUM_THREADS=$n; fi
      for t in /tmp/bin/t_*; do
        echo "== $(basename $t) RAYON_NUM_THREADS=$n"
        $t 2>&1 | grep -E "test result|panicked|FAILED" | head -5
      done
    done ;;
esac
