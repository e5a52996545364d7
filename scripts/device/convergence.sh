#!/usr/bin/env bash
# Issue 4's convergence check on the GPU machine: lora-ft, then transformers + PEFT + bitsandbytes
# replaying its trace (same initial adapter, batches and hyperparameters), on SmolLM2-135M-Instruct
# in NF4 with f16 compute (scripts/convergence/smollm2.toml).
# The GGUF (98 MB) is over what one call carries (64 MiB), so it travels in parts over calls made
# back to back while the machine is warm, each stashed in /tmp/parts:
#   bash scripts/device/convergence.sh stash              # carry .gpu/smollm2.gguf.part-*
#   bash scripts/device/convergence.sh lora-ft            # join the parts, import, train --trace
#   bash scripts/device/convergence.sh peft               # replay in PEFT (carry the bnb wheel), compare
source scripts/device/setup.sh
mkdir -p /tmp/parts
cp .gpu/smollm2.gguf.part-* /tmp/parts/ 2>/dev/null || true
export LORA_FT_CACHE=/tmp/cache
run=runs/convergence-smollm2
case "${1:?stash, lora-ft or peft}" in
  stash) ls -la /tmp/parts ;;
  lora-ft)
    cat /tmp/parts/smollm2.gguf.part-* > /tmp/smollm2.gguf
    (cd /tmp && sha256sum -c "$OLDPWD/scripts/convergence/smollm2.gguf.sha256")
    lora-ft import /tmp/smollm2.gguf $LORA_FT_CACHE/smollm2-hf
    lora-ft train scripts/convergence/smollm2.toml --device cuda:0 --trace /tmp/trace 2>&1 | grep -v " INFO "
    mkdir -p /tmp/run && cp -r $run/. /tmp/run/   # the next call starts from a fresh copy of the tree
    cp $run/metrics.jsonl $OUT/lora_ft_metrics.jsonl ;;
  peft)
    PYTHONUNBUFFERED=1 python3 scripts/convergence/peft_replay.py --model $LORA_FT_CACHE/smollm2-hf \
      --trace /tmp/trace --run /tmp/run --out $OUT/peft_metrics.jsonl 2>&1 | grep -v Warning | tail -5
    cp /tmp/run/metrics.jsonl $OUT/lora_ft_metrics.jsonl
    python3 scripts/convergence/compare.py /tmp/run/metrics.jsonl $OUT/peft_metrics.jsonl | tee $OUT/convergence.md ;;
esac
