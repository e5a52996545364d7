#!/usr/bin/env bash
# The llama.cpp side of the generation benchmark (scripts/device/bench_llamacpp.sh) end to end on a
# machine with no GPU, before any GPU time is spent on it: the packed sources
# (scripts/device/llamacpp_source.sh) built for the CPU, the toy-sized random model converted to
# GGUF f16, quantized to Q4_K_M, the PEFT adapter written and converted, llama-batched-bench run
# with it at two batch sizes with short prompts, and the rows parsed. Then checks: the adapter
# loads into PEFT onto the same model with every LoRA tensor matched, and the rows hold positive
# rates for each batch and a time to the first token.
#   bash scripts/bench/check_llamacpp_pipeline.sh [MODEL]    # default llama3.1-8b (its toy config)
# Python: a venv at LLAMACPP_VENV (default /tmp/llamacpp-venv) with torch, transformers, peft,
# safetensors, sentencepiece and the cmake and ninja wheels, made on first use. The build goes to
# LLAMACPP_WORK (default /tmp/llamacpp-cpu) and is reused; on two cores it takes about 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
arch=${1:-llama3.1-8b}
venv=${LLAMACPP_VENV:-/tmp/llamacpp-venv}
if ! "$venv/bin/python3" -c "import torch, transformers, peft, safetensors, sentencepiece, yaml, tqdm" 2>/dev/null \
    || [ ! -x "$venv/bin/cmake" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch transformers peft safetensors sentencepiece numpy pyyaml tqdm cmake ninja scikit-build-core
fi
export PATH=$venv/bin:$PATH LLAMACPP_VENV=$venv
[ -e .gpu-llamacpp/llama.cpp.txz ] || bash scripts/device/llamacpp_source.sh
OUT=$(mktemp -d); export OUT
export BENCH_DEVICE=cpu PROMPT_LEN=32 NEW_TOKENS=8 TTFT_PROMPT=64 BUDGET_S=${BUDGET_S:-3600}
export LLAMACPP_WORK=${LLAMACPP_WORK:-/tmp/llamacpp-cpu}
nice -n 19 bash scripts/device/bench_llamacpp.sh "$arch" 1,4
python3 - "$OUT/llamacpp_generate_$arch.jsonl" "/tmp/$arch-tiny" <<'PY'
import json, sys
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
stack = next(r for r in rows if "stack" in r)
assert stack["bits_per_weight"] > 4, stack
by_batch = {r["batch"]: r for r in rows if "batch" in r}
assert sorted(by_batch) == [1, 4], by_batch
for b, r in by_batch.items():
    assert (r["prompt_len"], r["new_tokens"]) == (32, 8), r
    assert r["tokens_per_s"] > 0 and r["decode_tokens_per_s"] > r["tokens_per_s"], r
    assert r["peak_alloc_gib"] > 0, r
ttft = next(r for r in rows if "ttft_ms" in r)
assert ttft["ttft_prompt"] == 64 and ttft["ttft_ms"] > 0, ttft
# the adapter as PEFT reads it: every saved tensor lands on a LoRA weight of the model
model_dir = sys.argv[2]
adapter = model_dir + "-gguf/adapter"
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), adapter)
saved = load_file(adapter + "/adapter_model.safetensors")
params = {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}
assert len(params) == len(saved), (len(params), len(saved))
for name, t in saved.items():
    assert torch.equal(params[name].detach().to(t.dtype), t), name
print(f"llama.cpp pipeline: {len(by_batch)} batch sizes, TTFT row, {stack['bits_per_weight']} BPW, "
      f"adapter {len(saved)} tensors matched through PEFT: ok")
PY
echo "rows: $OUT/llamacpp_generate_$arch.jsonl"
