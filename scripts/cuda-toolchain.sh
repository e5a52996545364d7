#!/usr/bin/env bash
# Installs a CUDA 13.0 build toolchain (nvcc, headers, cuBLAS/cuRAND/NVRTC link libraries, and
# the cuDNN + cudnn-frontend headers of the cuDNN attention shim) from PyPI wheels into a cache folder, so `cargo build --features cuda` works on a machine
# with no GPU and no system CUDA. The GPU machines run driver 580 (CUDA 13.0): keep nvcc at
# 13.0 so the PTX it emits loads there.
#
# Usage:   eval "$(scripts/cuda-toolchain.sh)"     # prints the exports to use
#          scripts/cuda-toolchain.sh --check        # verifies nvcc runs
set -euo pipefail
ROOT="${LORA_FT_CUDA_HOME:-$HOME/.cache/lora-ft-cuda}"
PY="$ROOT/py"; LIBS="$ROOT/libs"; STUB="$ROOT/stub"
CU="$PY/nvidia/cu13"

if [ ! -x "$CU/bin/nvcc" ]; then
  echo "installing nvcc 13.0 into $PY" >&2
  python3 -m pip install -q --target "$PY" "nvidia-cuda-nvcc==13.0.88" "nvidia-cuda-runtime==13.0.96" \
    "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*" >&2
  ln -sf libcudart.so.13 "$CU/lib/libcudart.so"
fi
if [ ! -e "$LIBS/nvidia/cu13/lib/libcublas.so" ]; then
  echo "installing cuBLAS/cuRAND/NVRTC link libraries into $LIBS" >&2
  python3 -m pip install -q --target "$LIBS" "nvidia-cublas==13.0.*" "nvidia-curand==10.4.0.*" \
    "nvidia-cuda-nvrtc==13.0.*" >&2
  ( cd "$LIBS/nvidia/cu13/lib" && for l in nvrtc cublas cublasLt; do ln -sf "lib$l.so.13" "lib$l.so"; done \
    && ln -sf libcurand.so.10 libcurand.so )
fi
CUDNN="$ROOT/cudnn"
if [ ! -e "$CUDNN/include/cudnn_frontend.h" ]; then
  # Headers only, for src/cuda/cudnn_sdpa.cpp: cuDNN itself is loaded when the program runs
  # (src/cuda/cudnn_sdpa.rs), so neither library is linked. 9.19 is the oldest cuDNN the build
  # expects (the one PyTorch 2.11 ships); newer 9.x libraries take the same calls.
  echo "fetching the cuDNN 9.19 and cudnn-frontend 1.32 headers into $CUDNN" >&2
  WHEELS=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 -d "$WHEELS" \
    "nvidia-cudnn-cu13==9.19.0.56" "nvidia-cudnn-frontend==1.32.0" >&2
  python3 - "$WHEELS" "$CUDNN/include" <<'PY'
import glob, os, sys, zipfile
wheels, dest = sys.argv[1], sys.argv[2]
for wheel in glob.glob(os.path.join(wheels, "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            for prefix in ("nvidia/cudnn/include/", "include/"):
                if name.startswith(prefix) and not name.endswith("/"):
                    out = os.path.join(dest, name[len(prefix):])
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    with open(out, "wb") as f:
                        f.write(z.read(name))
PY
  rm -rf "$WHEELS"
fi
if [ ! -e "$STUB/libcuda.so" ]; then
  # Link-time stand-in for the driver library (libcuda.so.1). It only carries the symbol names
  # that cudarc declares; the real driver library is the one loaded when the program runs.
  echo "making the libcuda link stub in $STUB" >&2
  mkdir -p "$STUB"
  SYS=$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-*/src/driver/sys 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$SYS" ]; then
    echo "cudarc sources not found: run 'cargo fetch' in the project first" >&2; exit 1
  fi
  grep -ohE "fn cu[A-Za-z0-9_]+\(" "$SYS"/*.rs | sed 's/fn //; s/(//' | sort -u \
    | awk '{print "void " $1 "(void) {}"}' > "$STUB/cuda_stub.c"
  gcc -shared -fPIC -o "$STUB/libcuda.so" -Wl,-soname,libcuda.so.1 "$STUB/cuda_stub.c"
fi

if [ "${1:-}" = "--check" ]; then "$CU/bin/nvcc" --version | tail -2; exit 0; fi
cat <<EOF
export CUDA_ROOT="$CU"
export PATH="$CU/bin:\$PATH"
export CUDA_COMPUTE_CAP=80
export CUDNN_INCLUDE="$CUDNN/include:$LIBS/nvidia/cu13/include"
export RUSTFLAGS="-L $STUB -L $LIBS/nvidia/cu13/lib -L $CU/lib"
EOF
