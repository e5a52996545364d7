#!/usr/bin/env bash
# Here, before GPU-machine runs: packs what a run needs into a git-ignored folder to name in the
# device tool's `carry` (64 MiB a call, the working tree included); on the machine, `mv` it to
# .gpu, where scripts/device/setup.sh unpacks the *.xz into /tmp/bin and installs the *.whl.
#   bash scripts/device/pack.sh cuda    # (CARGO_TARGET_DIR: the CUDA build's, default target/cuda)
#                                       # .gpu-cuda: the CUDA binary and the test binaries with CUDA tests
#   bash scripts/device/pack.sh bench   # .gpu-bench: the CUDA binary, bitsandbytes, the PEFT anchor
#   bash scripts/device/pack.sh cpu     # .gpu-cpu: the CPU build's binary and every test binary
#   bash scripts/device/pack.sh adamw   # .gpu-adamw: the CUDA lib test binary and bitsandbytes, for
#                                       # scripts/device/adamw8bit.sh (CARGO_TARGET_DIR is kept if set)
#   bash scripts/device/pack.sh unsloth # .gpu-unsloth: Unsloth and what it imports that the GPU
#                                       # machine lacks (scripts/device/unsloth_wheels.txt), installed
#                                       # here for Python 3.12 into one site folder, its web studio
#                                       # left out: unsloth-site.txz; with `bench`'s
#                                       # bitsandbytes for scripts/device/bench_train.sh UNSLOTH=1
#   bash scripts/device/pack.sh gguf    # .gpu-gguf1, .gpu-gguf2: the demo model's GGUF in four
#                                       # quarters (98 MB), two a call; scripts/device/tests.sh joins them
set -euo pipefail
cd "$(dirname "$0")/../.."

# name=path of each test binary of a build (cargo's own list, not a guess from file names)
test_binaries() {
  cargo test --release "$@" --no-run --message-format=json 2>/dev/null | python3 -c '
import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"] + "=" + m["executable"])'
}

pack() { xz -T2 -6 -c "$1" > "$2"; }

# bitsandbytes' wheel (43 MB) less the libraries of the CUDA and ROCm versions the GPU machine
# does not load (it has CUDA 13): 4 MB, so that it travels beside the binary within one carry
slim_bitsandbytes() {
  python3 - "$1" <<'PY'
import sys, zipfile, re, os
path = sys.argv[1]
drop = re.compile(r"bitsandbytes/libbitsandbytes_(cuda1[12]\d|rocm\d+|xpu\d+)\.so$")
tmp = path + ".tmp"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if drop.search(item.filename):
            continue
        data = src.read(item.filename)
        if item.filename.endswith(".dist-info/RECORD"):
            lines = [l for l in data.decode().splitlines() if not drop.search(l.split(",")[0])]
            data = ("\n".join(lines) + "\n").encode()
        dst.writestr(item, data)
os.replace(tmp, path)
PY
}

case "$1" in
  cuda|bench)
    eval "$(bash scripts/cuda-toolchain.sh)"
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
    cargo build --release --features cuda --all-targets -q
    out=.gpu-$1; rm -rf $out; mkdir -p $out
    pack $CARGO_TARGET_DIR/release/lora-ft $out/lora-ft.xz
    if [ "$1" = cuda ]; then
      for entry in $(test_binaries --features cuda); do
        name=${entry%%=*}
        case $name in
          lora_ft) pack ${entry#*=} $out/t_lib.xz ;;
          parity|nf4_golden|auto_batch_gpu|selective_checkpointing) pack ${entry#*=} $out/t_$name.xz ;;
        esac
      done
    else
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_24_x86_64 -d $out bitsandbytes==0.50.2
      slim_bitsandbytes $out/bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl
      cp ../shared/anchors/peft_qlora_baseline.py $out/
    fi ;;
  adamw)
    eval "$(bash scripts/cuda-toolchain.sh)"
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
    out=.gpu-adamw; rm -rf $out; mkdir -p $out
    for entry in $(test_binaries --features cuda --lib); do pack ${entry#*=} $out/t_lib.xz; done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_24_x86_64 -d $out bitsandbytes==0.50.2
    slim_bitsandbytes $out/bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl ;;
  cpu)
    cargo build --release --all-targets -q
    out=.gpu-cpu; rm -rf $out; mkdir -p $out
    pack target/release/lora-ft $out/lora-ft-cpu.xz
    for entry in $(test_binaries); do
      name=${entry%%=*}; [ "$name" = lora-ft ] && name=main; [ "$name" = lora_ft ] && name=lib
      pack ${entry#*=} $out/t_$name.xz
    done ;;
  unsloth)
    out=.gpu-unsloth; rm -rf $out /tmp/unsloth-site; mkdir -p $out /tmp/unsloth-site
    grep -v '^#' scripts/device/unsloth_wheels.txt | xargs python3 -m pip install -q --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --target /tmp/unsloth-site
    rm -rf /tmp/unsloth-site/studio /tmp/unsloth-site/bin
    find /tmp/unsloth-site -name __pycache__ -prune -exec rm -rf {} +
    tar -C /tmp/unsloth-site -cf - . | xz -T2 -9 > $out/unsloth-site.txz ;;
  gguf)
    gguf="${LORA_FT_CACHE:-$HOME/.cache/lora-ft}/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    rm -rf .gpu-gguf1 .gpu-gguf2; mkdir -p .gpu-gguf1 .gpu-gguf2
    quarter=$(( ($(stat -c %s "$gguf") + 3) / 4 ))
    split -b $quarter -d -a 1 "$gguf" /tmp/smollm2.part
    mv /tmp/smollm2.part0 /tmp/smollm2.part1 .gpu-gguf1/; mv /tmp/smollm2.part2 /tmp/smollm2.part3 .gpu-gguf2/ ;;
  *) echo "usage: $0 cuda|bench|cpu|adamw|unsloth|gguf" >&2; exit 2 ;;
esac
du -sh .gpu-* | sort -k2
