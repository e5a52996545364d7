# Sourced at the start of a GPU-machine command (see ../shared/cuda/README.md): installs the
# carried bitsandbytes wheel and unpacks carried site folders (.gpu/*.txz: Unsloth's, pack.sh
# unsloth) into /tmp/site, points at the CUDA 13 libraries, unpacks the carried binaries
# (.gpu/*.xz) into /tmp/bin, and makes the compile-time golden paths of test binaries resolve.
set -euo pipefail
if ls .gpu/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl; fi
mkdir -p /tmp/site
for t in .gpu/*.txz; do [ -e "$t" ] && tar xJf "$t" -C /tmp/site; done
export PYTHONPATH=/tmp/site
# CUDA 13 libraries, cuDNN's for the cuDNN attention path (src/cuda/cudnn_sdpa.rs), NCCL's for
# several ranks (distributed/nccl.rs)
export LD_LIBRARY_PATH=$(python3 -c "import nvidia,os;print(':'.join(os.path.join(nvidia.__path__[0],d,'lib') for d in ('cu13','cudnn','nccl')))")
# the GPU machine has cuDNN: the attention test must find it and use it (src/model/ops/attention/tests.rs)
export LORA_FT_TEST_NEEDS_CUDNN=1
# NVLink multicast stays off (KINDS.md: it can take the shared host's GPUs out of service); the
# machine sets these already, and the ranks lora-ft starts inherit them
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/bin
# unpacked beside and renamed over: a second setup (a background script's) while the binary runs
# would otherwise fail on writing a running file ("text file busy")
for f in .gpu/*.xz; do
  [ -e "$f" ] || continue; n=$(basename "$f" .xz)
  xz -dc "$f" > /tmp/bin/$n.new$$ && chmod +x /tmp/bin/$n.new$$ && mv -f /tmp/bin/$n.new$$ /tmp/bin/$n
done
export PATH=/tmp/bin:$PATH
# test binaries name golden files by the absolute path of the tree they were built in
mkdir -p /work/main && [ -e /work/main/tests ] || ln -s "$PWD/tests" /work/main/tests
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
