#!/usr/bin/env bash
# The test suite on the GPU machine, from what scripts/device/pack.sh packed (moved to .gpu/):
#   cuda: the CUDA tests (every kernel against the composed CPU ops; kept layers' gradients equal to full checkpointing's; parity with transformers on
#         CUDA in f32 and f16; NF4 against bitsandbytes' bytes; the batch probe), and the lib and parity tests on the CPU at RAYON_NUM_THREADS=1
#   gguf: keeps the carried quarters of the demo model's GGUF in /tmp/smollm2 (a warm machine
#         keeps /tmp between calls) and imports the model once all four are there
#   cpu:  every test binary of the CPU build, on the machine's CPU cores (RAYON default)
source scripts/device/setup.sh
mkdir -p /tmp/smollm2 /work/main/target/cuda/release /work/main/target/release
cp .gpu/smollm2.part* /tmp/smollm2/ 2>/dev/null || true
# tests start the binary by its build path
ln -sf /tmp/bin/lora-ft /work/main/target/cuda/release/lora-ft
[ -f /tmp/bin/lora-ft-cpu ] && ln -sf /tmp/bin/lora-ft-cpu /work/main/target/release/lora-ft
export LORA_FT_CACHE=/tmp/lora-ft-cache
if [ -f /tmp/smollm2/smollm2.part3 ] && [ ! -d $LORA_FT_CACHE/smollm2-hf ]; then
  mkdir -p $LORA_FT_CACHE/smollm2
  cat /tmp/smollm2/smollm2.part[0-3] > $LORA_FT_CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  want=$(cut -d' ' -f1 scripts/convergence/smollm2.gguf.sha256)
  [ "$(sha256sum < $LORA_FT_CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -d' ' -f1)" = "$want" ] \
    || echo "the joined SmolLM2 GGUF does not match scripts/convergence/smollm2.gguf.sha256"
  lora-ft import $LORA_FT_CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $LORA_FT_CACHE/smollm2-hf 2>&1 | tail -1
fi
ls /tmp/smollm2
lscpu | grep -E "^Model name|^CPU\(s\)|Flags" | sed 's/\(Flags:\).*\(avx512f\).*/\1 ... \2 .../' | cut -c1-120
cd /work/main
case "${1:-cuda}" in
  cuda)
    t_lib --test-threads 1 cuda fused offload streamed_loss 2>&1 | grep -E "^test |test result|panicked|rel err" | tail -40
    LORA_FT_TEST_DEVICE=cuda t_parity --test-threads 1 tiny --nocapture 2>&1 | grep -E "worst|test result|panicked|^test "
    echo "== t_selective_checkpointing (f32, f16, bf16)"
    LORA_FT_TEST_DEVICE=cuda t_selective_checkpointing --test-threads 1 2>&1 | grep -E "^test |test result|panicked"
    for t in t_nf4_golden t_auto_batch_gpu; do echo "== $t"; $t --test-threads 1 2>&1 | grep -E "^test |test result|panicked"; done
    echo "== CPU, RAYON_NUM_THREADS=1"
    RAYON_NUM_THREADS=1 t_lib --skip cuda --skip fused --skip offload --skip streamed_loss 2>&1 | grep -E "test result|panicked"
    RAYON_NUM_THREADS=1 t_parity tiny --nocapture 2>&1 | grep -E "worst|test result|panicked" ;;
  gguf) ;;
  cpu)
    for t in /tmp/bin/t_*; do
      echo "== $(basename $t), $(nproc) cores"
      $t --nocapture 2>&1 | grep -E "test result|panicked|FAILED|worst" | head -12
    done ;;
esac
