#!/usr/bin/env bash
# llama.cpp as the generation benchmark's dedicated engine (issue 38), on the GPU machine: builds
# llama.cpp from the carried sources (scripts/device/llamacpp_source.sh: .gpu-llamacpp/llama.cpp.txz)
# for sm_90, converts the benchmark's random model (the folder bench_generate.sh uses) to GGUF f16
# with convert_hf_to_gguf.py, quantizes it to Q4_K_M, converts a PEFT rank-16 adapter on all seven
# projections with convert_lora_to_gguf.py (applied unmerged at run time, `--lora`), and runs
# llama-batched-bench at each batch size (one run each, its KV cache sized to the batch), then once
# more for the time to the first token of one TTFT_PROMPT-token prompt.
#   bash scripts/device/bench_llamacpp.sh MODEL [BATCHES]   (carry .gpu-llamacpp; also run by
#                                                           LLAMACPP=1 bash scripts/device/bench_generate.sh)
# Writes llamacpp_generate_MODEL.jsonl in $OUT (rows like lora-ft's: scripts/bench/llamacpp_generate.py
# rows) and $OUT/llamacpp_MODEL.log. Environment: BUDGET_S (default 570, the whole script: a batch
# that would start past it is reported as skipped), PROMPT_LEN (512), NEW_TOKENS (256),
# TTFT_PROMPT (2048, 0: none), UBATCH (512), WAIT_FOR (a file: the benchmark runs start once it
# exists, so the build and conversion can overlap another program's GPU work in the same command). The build's time is its own row ({"llamacpp_build_s"}).
# A fresh build also leaves its binaries in $OUT/llamacpp-bin.txz.partN (15 MiB parts): copied into
# .gpu-llamacpp/ and carried, a later call unpacks them instead of building.
# BENCH_DEVICE=cpu: the same pipeline on the toy-sized config with a CPU build (the check here:
# scripts/bench/check_llamacpp_pipeline.sh).
source scripts/device/bench_setup.sh   # device=cuda|cpu, strict mode
arch=${1:-llama3.1-8b}
batches=${2:-1,8,64,256}
prompt=${PROMPT_LEN:-512}; new=${NEW_TOKENS:-256}; ttft=${TTFT_PROMPT:-2048}; ubatch=${UBATCH:-512}
budget=${BUDGET_S:-570}
eval "$(python3 scripts/bench/bench_models.py --shell "$arch")"   # dtype attn issue4 size_gib
carried=.gpu-llamacpp; [ -e $carried/llama.cpp.txz ] || carried=.gpu
work=${LLAMACPP_WORK:-/tmp/llamacpp}; build=$work/build; bin=$build/bin
log=$OUT/llamacpp_$arch.log; : > "$log"
jobs=$(nproc)
if [ "$device" = cuda ]; then
  dir=/tmp/$arch; create=(); ngl=99
else
  dir=/tmp/$arch-tiny; create=(--device cpu --tiny); ngl=0
fi
gguf=$dir-gguf
step() { echo "{\"llamacpp_step\": \"$1\", \"at_s\": $SECONDS}"; }
left() { local t=$((budget - SECONDS - ${1:-0})); [ $t -gt 1 ] && echo $t || echo 1; }   # for timeout

# 1. the binaries: carried ones from an earlier call, a build left on this machine, or a build now
build_s=0
if [ ! -x $bin/llama-batched-bench ] && ls $carried/llamacpp-bin.txz.part* >/dev/null 2>&1; then
  mkdir -p $build && cat $carried/llamacpp-bin.txz.part* | tar xJf - -C $build
  step "carried binaries unpacked"
fi
if [ ! -x $bin/llama-batched-bench ]; then
  rm -rf $work/llama.cpp $build; mkdir -p $work
  tar xJf $carried/llama.cpp.txz -C $work
  flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_CCACHE=OFF
         -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
         -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT="$(cut -c1-7 $work/llama.cpp/LLAMACPP_VERSION)")
  command -v ninja >/dev/null && flags+=(-G Ninja)
  if [ "$device" = cuda ]; then
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=$nvcc)
    # cuBLAS: the toolkit's own if it has the link library, else the CUDA 13 wheel PyTorch uses
    # (its cublas headers alone, beside the toolkit's others, and its versioned libraries, which
    # LD_LIBRARY_PATH already points at)
    root=$(dirname "$(dirname "$(readlink -f $nvcc)")")
    if ! ls $root/lib64/libcublas.so $root/lib/libcublas.so $root/targets/x86_64-linux/lib/libcublas.so >/dev/null 2>&1; then
      cu=$(python3 -c "import nvidia,os;print(os.path.join(nvidia.__path__[0],'cu13'))")
      mkdir -p $work/cudalib $work/cudainc
      for l in cublas cublasLt; do ln -sf $cu/lib/lib$l.so.13 $work/cudalib/lib$l.so; done
      ln -sf $cu/include/cublas*.h $work/cudainc/
      flags+=(-DCUDA_cublas_LIBRARY=$work/cudalib/libcublas.so -DCUDA_cublasLt_LIBRARY=$work/cudalib/libcublasLt.so
              -DCMAKE_CUDA_FLAGS=-I$work/cudainc -DCMAKE_CXX_FLAGS=-I$work/cudainc)
      echo "cuBLAS from $cu" | tee -a "$log"
    fi
  else
    flags+=(-DGGML_CUDA=OFF)
  fi
  t0=$SECONDS
  { cmake --version | head -1; [ "$device" = cuda ] && $nvcc --version | tail -2; } >> "$log" || true
  cmake -S $work/llama.cpp -B $build "${flags[@]}" > $work/build.log 2>&1 || { tail -40 $work/build.log | tee -a "$log"; exit 1; }
  ok=0; timeout $(left 60) nice cmake --build $build -j $jobs --target llama-batched-bench llama-quantize \
    >> $work/build.log 2>&1 || ok=$?
  build_s=$((SECONDS - t0)); tail -5 $work/build.log >> "$log"
  echo "{\"llamacpp_build_s\": $build_s, \"jobs\": $jobs, \"rc\": $ok}"
  [ $ok = 0 ] || { tail -40 $work/build.log | tee -a "$log"; exit 1; }
  if [ "$device" = cuda ]; then
    (cd $build && tar cf - bin/*.so* bin/llama-batched-bench bin/llama-quantize | xz -T0 -6 | split -b 15M -d -a 1 - $OUT/llamacpp-bin.txz.part)
    ls -l $OUT/llamacpp-bin.txz.part* >> "$log"
  fi
fi
src=$work/llama.cpp
[ -e $src/convert_hf_to_gguf.py ] || { mkdir -p $work; tar xJf $carried/llama.cpp.txz -C $work; }
version=$(cat $src/LLAMACPP_VERSION)

# 2. the random model (bench_generate.sh's) and its GGUF files; the f16 file only on the way to Q4_K_M
q4=$gguf/model-Q4_K_M.gguf
need=2   # GiB of /tmp still to write: the model unless written, the f16 GGUF and Q4_K_M unless quantized
[ -e $dir/config.json ] || need=$((need + size_gib)); [ -e $q4 ] || need=$((need + size_gib * 4 / 3))
if [ "$device" = cuda ] && [ "$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)" -lt $need ]; then
  for other in $(python3 scripts/bench/bench_models.py --names); do [ "$other" = "$arch" ] || rm -rf "/tmp/$other" "/tmp/$other-gguf"; done
fi
python3 scripts/bench/load_memory_ref.py --model $dir --create $arch "${create[@]}" 2>&1 | tail -3 || true
step "model ready"
if [ ! -e $q4 ]; then
  python3 scripts/bench/llamacpp_generate.py source $dir $gguf/src
  timeout $(left 30) python3 $src/convert_hf_to_gguf.py $gguf/src --outtype f16 --outfile $gguf/model-f16.gguf > $work/convert.log 2>&1 \
    || { tail -30 $work/convert.log | tee -a "$log"; exit 1; }
  tail -3 $work/convert.log >> "$log"; step "converted to GGUF f16"
  timeout $(left 30) $bin/llama-quantize $gguf/model-f16.gguf $q4.part Q4_K_M $jobs > $work/quantize.log 2>&1 \
    || { tail -30 $work/quantize.log | tee -a "$log"; exit 1; }
  mv $q4.part $q4; rm -f $gguf/model-f16.gguf
  grep -E "model size|quant size|fallback" $work/quantize.log | head -5 >> "$log" || true
  step "quantized to Q4_K_M"
fi
if [ ! -e $gguf/lora.gguf ]; then
  python3 scripts/bench/llamacpp_generate.py adapter $dir $gguf/adapter
  python3 $src/convert_lora_to_gguf.py --base $gguf/src --outtype f16 --outfile $gguf/lora.gguf $gguf/adapter \
    > $work/lora.log 2>&1 || { tail -30 $work/lora.log | tee -a "$log"; exit 1; }
  step "adapter converted"
fi

# 3. llama-batched-bench: one run per batch size (the KV cache holds that batch's sequences), then
# the time to the first token (two runs of one prompt, the best kept)
while [ -n "${WAIT_FOR:-}" ] && [ ! -e "$WAIT_FOR" ] && [ $((budget - SECONDS)) -gt 30 ]; do sleep 2; done
step "GPU free"
common=(-m $q4 --lora $gguf/lora.gguf -b 2048 -ub $ubatch -ngl $ngl -fa on --output-format jsonl -lv 4)
[ "$device" = cuda ] || common+=(-t $jobs)
logs=(); skipped=()
for b in ${batches//,/ }; do
  left=$((budget - SECONDS - 10))
  if [ $left -lt 20 ]; then skipped+=($b); continue; fi
  timeout $left $bin/llama-batched-bench "${common[@]}" -c $((b * (prompt + new))) -npp $prompt -ntg $new -npl $b \
    > $work/bench_$b.log 2>&1 || echo "{\"batch\": $b, \"rc\": $?}"
  logs+=($work/bench_$b.log); grep '^{' $work/bench_$b.log || tail -20 $work/bench_$b.log
done
if [ "$ttft" -gt 0 ] && [ $((budget - SECONDS)) -gt 30 ]; then
  timeout $(left 5) $bin/llama-batched-bench "${common[@]}" -c $((ttft + 1)) -npp $ttft,$ttft -ntg 1 -npl 1 \
    > $work/bench_ttft.log 2>&1 || true
  logs+=($work/bench_ttft.log)
fi
for f in "${logs[@]}"; do echo "== $(basename $f)" >> "$log"; grep -v '^{' $f | grep -E "BPW|buffer size|applied|error|failed" >> "$log" || true; done
python3 scripts/bench/llamacpp_generate.py rows "${logs[@]}" --prompt-len $prompt --new-tokens $new --device $device \
  --version "$version" --build-s $build_s --skipped "$(IFS=,; echo "${skipped[*]}")" \
  | tee $OUT/llamacpp_generate_$arch.jsonl
