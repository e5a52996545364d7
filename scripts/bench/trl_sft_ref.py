#!/usr/bin/env python3
"""The reference epoch on real dialogues (issue 19): TRL's SFTTrainer + PEFT + bitsandbytes with
its best settings here, on exactly the tokens lora-ft trains (`lora-ft data tokenize`: rendered by
the model's chat template, labels -100 outside the assistant's replies, truncated to max_len).

Settings, the same as lora-ft's side of scripts/device/bench_epoch.sh: NF4 + double quantization,
LoRA r=16 alpha 32 dropout 0 on all seven projections, transformers' Adafactor (optim="adafactor":
absolute lr, no parameter scaling: lora-ft's optim.flavor = "hf"), the same lr and schedule,
clipping at 1.0, f16 (loss scaling) or bf16, gradient checkpointing (non-reentrant), one epoch,
batch 8 rows of max_len. TRL's best: packing with its best-fit-decreasing strategy ("bfd", which
turns on padding-free batches), Liger's kernels where they import (RMSNorm, RoPE, SwiGLU; TRL
keeps its own chunked LM head and loss), SDPA attention (flash-attn has no wheel for this
machine: transformers then builds the packed rows' block-diagonal mask from position_ids).

    trl_sft_ref.py --model DIR --run NAME:TRAIN_TOKENS:EVAL_TOKENS [--run ...] [--dtype f16]
                   [--lr 1e-3] [--max-len 2048] [--batch 8] [--out FILE]

Each --run trains a fresh adapter and writes
one JSON object (each run loads the base anew: TRL patches the model it is given): the epoch's wall time (trainer.train), the sum of its optimizer steps' times,
peak allocated/reserved GPU memory during training, the final training loss, and the eval loss
after the epoch: the mean over every trained token of the eval file (one dialogue per forward,
no packing), as `lora-ft eval` computes it.
"""
import argparse
import gc
import json
import math
import os
import time

import torch

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--model", required=True)
ap.add_argument("--run", action="append", required=True, help="NAME:TRAIN_TOKENS.jsonl:EVAL_TOKENS.jsonl")
ap.add_argument("--dtype", default="f16", choices=["f16", "bf16", "f32"])
ap.add_argument("--lr", type=float, default=2e-4)
ap.add_argument("--score", action="append", default=[],
                help="NAME:ADAPTER_DIR:EVAL_TOKENS: also the eval loss of another stack's PEFT adapter (lora-ft's), "
                     "by this script's evaluator on a fresh base")
ap.add_argument("--schedule", default="cosine")
ap.add_argument("--max-len", type=int, default=2048)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--liger", default="auto", choices=["auto", "on", "off"])
ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of this script")
ap.add_argument("--quant", default="nf4", choices=["nf4", "none"])
ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "trl_epoch.json"))
args = ap.parse_args()

import datasets  # noqa: E402
import peft  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TrainerCallback  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

compute = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
cuda = args.device == "cuda"
liger = args.liger != "off"
if liger:
    try:
        import liger_kernel  # noqa: F401
    except ImportError as e:
        if args.liger == "on":
            raise
        print(json.dumps({"liger": f"not used: {e}"}), flush=True)
        liger = False



def load_model():
    """The base as the reference loads it (each run starts from a fresh one: TRL patches the model
    it is given)."""
    kwargs = dict(dtype=compute, attn_implementation="sdpa")
    if args.quant == "nf4":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute)
    if cuda:
        kwargs["device_map"] = {"": 0}
    return AutoModelForCausalLM.from_pretrained(args.model, **kwargs)


tokenizer = AutoTokenizer.from_pretrained(args.model)


def sync():
    if cuda:
        torch.cuda.synchronize()


def read_tokens(path):
    rows = [json.loads(line) for line in open(path)]
    return [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]


class StepTimes(TrainerCallback):
    """The optimizer steps' own times (data loading and logging between steps excluded), the
    measure lora-ft's metrics.jsonl gives per step."""

    def __init__(self):
        self.total, self.steps, self.started, self.times = 0.0, 0, None, []

    def on_step_begin(self, args_, state, control, **kw):
        sync()
        self.started = time.time()

    def on_step_end(self, args_, state, control, **kw):
        sync()
        self.times.append(time.time() - self.started)
        self.total += self.times[-1]
        self.steps += 1


@torch.no_grad()
def eval_loss(m, rows):
    """Sum of -log p over every trained token / their count, one dialogue per forward."""
    m.eval()
    total, count = 0.0, 0
    for r in rows:
        ids = torch.tensor([r["input_ids"]], device=args.device)
        labels = torch.tensor(r["labels"][1:], device=args.device)
        with torch.autocast(args.device, dtype=compute, enabled=compute != torch.float32):
            logits = m(input_ids=ids).logits[0, :-1].float()
        keep = labels != -100
        if keep.any():
            total += torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum").item()
            count += int(keep.sum())
    m.train()
    return total / max(count, 1), count


info = dict(stack="trl+peft+bitsandbytes", model=args.model, dtype=args.dtype, lr=args.lr, max_len=args.max_len,
            batch=args.batch, gpu=torch.cuda.get_device_name(0) if cuda else "cpu", attn="sdpa",
            liger=liger, packing="bfd (padding-free)",
            versions={"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                      "trl": trl.__version__, "datasets": datasets.__version__})
try:
    import bitsandbytes
    info["versions"]["bitsandbytes"] = bitsandbytes.__version__
    if liger:
        info["versions"]["liger_kernel"] = __import__("importlib.metadata").metadata.version("liger-kernel")
except Exception:  # noqa: BLE001 - versions are information only
    pass
results = []
for spec in args.run:
    name, train_path, eval_path = spec.split(":")
    train_rows, eval_rows = read_tokens(train_path), read_tokens(eval_path)
    t = time.time()
    base = load_model()
    load_s = time.time() - t
    config = SFTConfig(
        output_dir=f"/tmp/trl_{name}", per_device_train_batch_size=args.batch, gradient_accumulation_steps=1,
        num_train_epochs=1, learning_rate=args.lr, lr_scheduler_type=args.schedule, warmup_steps=0,
        optim="adafactor", weight_decay=0.0, max_grad_norm=1.0, fp16=compute == torch.float16, use_cpu=not cuda,
        bf16=compute == torch.bfloat16, gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False}, packing=True, packing_strategy="bfd",
        max_length=args.max_len, use_liger_kernel=liger, logging_steps=1, save_strategy="no", eval_strategy="no",
        report_to=[], seed=42, dataloader_num_workers=2, disable_tqdm=True)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    timer = StepTimes()
    trainer = SFTTrainer(model=base, args=config, train_dataset=datasets.Dataset.from_list(train_rows),
                         peft_config=lora, processing_class=tokenizer, callbacks=[timer])
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.time()
    out = trainer.train()
    sync()
    wall = time.time() - t
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    reserved = torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    loss, tokens = eval_loss(trainer.model, eval_rows)
    real = sum(len(r["input_ids"]) for r in train_rows)
    r = dict(run=name, rows=len(train_rows), load_s=round(load_s, 1), steps=timer.steps, train_runtime_s=round(wall, 2), step_time_s=round(timer.total, 2),
             tokens=real, tok_s=round(real / timer.total, 1), peak_alloc_gib=round(peak, 2),
             peak_reserved_gib=round(reserved, 2), first_loss=losses[0] if losses else None,
             last_loss=losses[-1] if losses else None, eval_loss=round(loss, 5), eval_tokens=tokens,
             hf_train_runtime_s=out.metrics.get("train_runtime"), step_times_s=[round(x, 4) for x in timer.times])
    assert math.isfinite(loss), r
    print(json.dumps(r), flush=True)
    results.append(r)
    json.dump(dict(info, results=results), open(args.out, "w"), indent=1)
    del trainer, base
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
for spec in args.score:
    name, adapter, eval_path = spec.split(":")
    base = load_model()
    scored = peft.PeftModel.from_pretrained(base, adapter)
    loss, tokens = eval_loss(scored, read_tokens(eval_path))
    r = dict(scored=name, adapter=adapter, eval_loss=round(loss, 5), eval_tokens=tokens)
    print(json.dumps(r), flush=True)
    results.append(r)
    json.dump(dict(info, results=results), open(args.out, "w"), indent=1)
    del scored, base
    gc.collect()
