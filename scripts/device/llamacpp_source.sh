#!/usr/bin/env bash
# Here, before a GPU-machine run of scripts/device/bench_llamacpp.sh (which has no network): fetches
# llama.cpp's sources as llama-cpp-python's sdist vendors them (pinned version, sha256 checked) and
# packs only what a CUDA build of llama-batched-bench, llama-bench and llama-quantize needs (ggml
# with its CPU and CUDA backends, src, common, vendor, those three tools, the CMake files), plus
# convert_hf_to_gguf.py (with its conversion/ package), convert_lora_to_gguf.py and gguf-py, into one xz tarball:
#   bash scripts/device/llamacpp_source.sh    # -> .gpu-llamacpp/llama.cpp.txz (git-ignored; carry it)
# The crates.io crate llama-cpp-sys-2 vendors llama.cpp too but leaves out the tools' sources,
# gguf-py and the LoRA converter, so the sdist is the source here. pip fetches the sdist (its
# metadata step needs cmake, so a venv with the cmake wheel is made under /tmp when none is given).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=0.3.36                # llama-cpp-python; the llama.cpp it vendors is at LLAMACPP_COMMIT
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMACPP_COMMIT=0c1e57098bba43ac29e6e3b677cdceebdd22334f
VENV=${LLAMACPP_VENV:-/tmp/llamacpp-venv}
out=.gpu-llamacpp
sdist=/tmp/llama_cpp_python-$VERSION.tar.gz

if ! echo "$SHA256  $sdist" | sha256sum -c --quiet 2>/dev/null; then
  [ -x "$VENV/bin/cmake" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q scikit-build-core cmake ninja; }
  dl=$(mktemp -d)
  # --no-build-isolation: the metadata step uses the venv's scikit-build-core and cmake instead of
  # building its own build dependencies from source
  PATH="$VENV/bin:$PATH" "$VENV/bin/pip" download -q --no-deps --no-binary=llama-cpp-python \
    --no-build-isolation -d "$dl" "llama-cpp-python==$VERSION"
  mv "$dl/llama_cpp_python-$VERSION.tar.gz" "$sdist"; rm -rf "$dl"
  echo "$SHA256  $sdist" | sha256sum -c --quiet
fi

stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
top=llama_cpp_python-$VERSION
tar xzf "$sdist" -C "$stage" "$top/vendor/llama.cpp" "$top/.git/modules/vendor/llama.cpp/HEAD"
[ "$(cat "$stage/$top/.git/modules/vendor/llama.cpp/HEAD")" = "$LLAMACPP_COMMIT" ] \
  || { echo "the sdist's llama.cpp is not $LLAMACPP_COMMIT" >&2; exit 1; }
src=$stage/$top/vendor/llama.cpp
dst=$stage/llama.cpp; mkdir -p "$dst/ggml/src" "$dst/tools"
keep() { for p in "$@"; do mkdir -p "$dst/$(dirname "$p")"; cp -r "$src/$p" "$dst/$p"; done; }
keep CMakeLists.txt LICENSE cmake include src common vendor \
  convert_hf_to_gguf.py convert_lora_to_gguf.py conversion gguf-py/gguf gguf-py/pyproject.toml gguf-py/LICENSE \
  ggml/CMakeLists.txt ggml/cmake ggml/include \
  tools/batched-bench tools/llama-bench tools/quantize
# ggml's own sources (files at the top of ggml/src) and the two backends built: CPU and CUDA (the
# other backends' folders are only entered when their GGML_<NAME> option is on)
find "$src/ggml/src" -maxdepth 1 -type f -exec cp {} "$dst/ggml/src/" \;
cp -r "$src/ggml/src/ggml-cpu" "$src/ggml/src/ggml-cuda" "$dst/ggml/src/"
# tools/CMakeLists.txt lists every tool; the packed tree has three
cat > "$dst/tools/CMakeLists.txt" <<'EOF'
# trimmed by lora-ft's scripts/device/llamacpp_source.sh: the tools the benchmark runs
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
add_subdirectory(quantize)
EOF
# Two changes to llama-batched-bench at this commit: it parses --lora but loads the model without
# common_init_from_params, so the adapter was never applied (now loaded and set on the context as
# common_init_from_params does); and its logger thread is left running at exit, so the last lines
# (the result of the last run) could be lost (now flushed by pausing the logger before exit).
python3 - "$dst/tools/batched-bench" <<'PY'
import sys
d = sys.argv[1]
path = d + "/batched-bench.cpp"
src = open(path).read()
anchor = "    const llama_vocab * vocab   = llama_model_get_vocab(model);\n"
assert src.count(anchor) == 1, "batched-bench.cpp changed: the LoRA patch's anchor is missing"
lora = """    // lora-ft's benchmark: apply --lora adapters, as common_init_from_params does
    for (auto & la : params.lora_adapters) {
        la.ptr = llama_adapter_lora_init(model, la.path.c_str());
        if (la.ptr == nullptr) {
            fprintf(stderr, "%s: error: failed to load lora adapter '%s'\\n", __func__, la.path.c_str());
            return 1;
        }
        LOG_INF("%s: lora adapter '%s' applied, scale %.2f\\n", __func__, la.path.c_str(), la.scale);
    }
    if (!params.lora_adapters.empty()) {
        common_set_adapter_lora(ctx, params.lora_adapters);
    }

"""
open(path, "w").write(src.replace(anchor, lora + anchor))
open(d + "/main.cpp", "w").write("""#include "log.h"

int llama_batched_bench(int argc, char ** argv);

int main(int argc, char ** argv) {
    const int ret = llama_batched_bench(argc, argv);
    // lora-ft's benchmark: flush the logger's queue (the results) before exit
    common_log_pause(common_log_main());
    return ret;
}
""")
PY
echo "$LLAMACPP_COMMIT (llama-cpp-python $VERSION)" > "$dst/LLAMACPP_VERSION"
find "$dst" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p $out
tar -C "$stage" --sort=name --mtime=@0 --owner=0 --group=0 -cf - llama.cpp | xz -T2 -9e > $out/llama.cpp.txz
echo "$out/llama.cpp.txz: $(du -h $out/llama.cpp.txz | cut -f1) (llama.cpp $LLAMACPP_COMMIT)"
