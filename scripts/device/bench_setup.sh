# Sourced first by the benchmark scripts (bench_train.sh, bench_epoch.sh, scaling.sh): on the GPU
# machine (BENCH_DEVICE unset or cuda) setup.sh's setup; with BENCH_DEVICE=cpu, a dry run on a
# machine without a GPU, in strict mode alone. Sets `device` (cuda | cpu).
device=${BENCH_DEVICE:-cuda}
if [ "$device" = cuda ]; then
  source scripts/device/setup.sh
else
  set -euo pipefail
fi
export PYTHONUNBUFFERED=1
