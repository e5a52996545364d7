#!/usr/bin/env bash
# Issue 7's GPU path on a machine with ONE GPU, until two are lent: a tiny ChatML model
# (scripts/bench/tiny_chatml_model.py), then
#   1. one process on cuda:0 (the baseline run works with cuDNN attention and NF4);
#   2. `--gpus 2`: rank 1 cannot open cuda:1, and the whole run must stop with one message, fast;
#   3. two ranks started by hand on the same GPU: NCCL loads and the unique id travels from rank 0,
#      then NCCL refuses two ranks on one GPU; both must stop with a message, not hang.
#   bash scripts/device/ddp_check.sh
source scripts/device/setup.sh
set +e  # steps 2 and 3 are meant to fail: their messages are the result
python3 scripts/bench/tiny_chatml_model.py /tmp/tiny-chatml
cat > /tmp/ddp.toml <<TOML
[model]
source = "/tmp/tiny-chatml"
[lora]
r = 8
alpha = 16
dropout = 0.0
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
[data]
train = "datasets/customer-service-v1/train.jsonl"
max_seq_len = 256
[train]
batch_size = 4
max_steps = 12
lr = 2e-3
compute_dtype = "f16"
device = "cuda"
[checkpoint]
every = 6
[output]
dir = "/tmp/ddp-run"
adapter_name = "ddp"
TOML
echo "== 1. one process"; rm -rf /tmp/ddp-run
timeout 300 lora-ft train /tmp/ddp.toml 2>&1 | grep -v " INFO " | tail -4
echo "== 2. --gpus 2 on one GPU"; rm -rf /tmp/ddp-run
start=$(date +%s%N)
timeout 120 lora-ft train /tmp/ddp.toml --gpus 2 2>&1 | grep -v " INFO " | head -40; echo "exit ${PIPESTATUS[0]} after $(( ($(date +%s%N) - start) / 1000000 )) ms"
echo "== 3. two ranks on cuda:0"; rm -rf /tmp/ddp-run
start=$(date +%s%N)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 NCCL_DEBUG=WARN \
    timeout 120 lora-ft train /tmp/ddp.toml > /tmp/rank$r.log 2>&1 &
done
wait; echo "both ranks ended after $(( ($(date +%s%N) - start) / 1000000 )) ms"
for r in 0 1; do echo "-- rank $r"; grep -v " INFO " /tmp/rank$r.log | tail -6; done
