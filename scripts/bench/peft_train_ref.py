#!/usr/bin/env python3
"""The reference QLoRA training step for any model folder: transformers + PEFT + bitsandbytes,
the recipe of ../shared/anchors/peft_qlora_baseline.py (NF4 + double quantization, gradient
checkpointing, LoRA r=16 alpha 32 on all seven projections, torch.optim.Adafactor at lr 2e-4,
clipping at 1.0, loss scaling in f16, random token ids as inputs and labels, 2 warm-up steps then
--steps timed ones), for the architectures of issue 18 (Llama 3.1, Qwen2.5, Qwen3, Mistral Nemo,
Gemma 2) as well: the anchor writes its own two models, this script reads the folder that
scripts/bench/load_memory_ref.py --create wrote, so both stacks train the same random model.

    peft_train_ref.py --model DIR [--shapes 512x8,2048x4,2048x8] [--dtype f16|bf16]
                      [--attn sdpa|eager] [--steps 4] [--out FILE]

One JSON line per shape (tokens/s, peak allocated and reserved GiB, loss); a shape that runs out
of GPU memory is recorded as {"error": "OOM"} and the next one runs. FILE (the anchor's format,
read by scripts/bench/compare_train.py) is rewritten after every shape, so a run stopped by a
time limit keeps the shapes it finished. `--device cpu --quant none --dtype f32` runs the same
loop without bitsandbytes, for checking the script on a machine with no GPU.
"""
import argparse
import contextlib
import gc
import json
import os
import time

import torch

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--model", required=True, help="HF folder (config.json + safetensors)")
ap.add_argument("--arch", default="", help="the name to print in the table (bench_models.MODELS)")
ap.add_argument("--shapes", default="512x8,2048x4,2048x8")
ap.add_argument("--dtype", default="f16", choices=["f16", "bf16", "f32"])
ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
ap.add_argument("--quant", default="nf4", choices=["nf4", "none"])
ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "peft_ref.json"))
args = ap.parse_args()

import peft  # noqa: E402
import transformers  # noqa: E402
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

cuda = args.device == "cuda"
compute = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
kwargs = dict(dtype=compute, attn_implementation=args.attn)
if args.quant == "nf4":
    kwargs["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute)
if cuda:
    kwargs["device_map"] = {"": 0}
t0 = time.time()
model = AutoModelForCausalLM.from_pretrained(args.model, **kwargs)
load_s = time.time() - t0
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                        gradient_checkpointing_kwargs={"use_reentrant": False})
lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
model = get_peft_model(model, lora)
model.train()  # checkpointing is only active in training mode
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.Adafactor(params, lr=2e-4)
scaling = cuda and compute == torch.float16
new_scaler = lambda: torch.amp.GradScaler("cuda", enabled=scaling)  # noqa: E731
scaler = new_scaler()
vocab = model.config.vocab_size
autocast = (lambda: torch.autocast(args.device, dtype=compute)) if compute != torch.float32 else contextlib.nullcontext


# SEQxBATCH: raise an out-of-memory error after that shape's first backward (gradients and
# checkpoints alive), to check on a CPU that the next shape still runs
INJECT_OOM = os.environ.get("PEFT_REF_INJECT_OOM", "")


def step(ids):
    with autocast():
        loss = model(input_ids=ids, labels=ids).loss
    scaler.scale(loss).backward()
    if INJECT_OOM == f"{ids.shape[1]}x{ids.shape[0]}":
        raise torch.OutOfMemoryError("injected: out of memory (PEFT_REF_INJECT_OOM)")
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def sync():
    if cuda:
        torch.cuda.synchronize()


def out_of_memory(e: Exception) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e) or "ALLOC_FAILED" in str(e)


def gib(v):
    return round(v / 2**30, 2)


info = dict(stack="transformers+peft+bitsandbytes" if args.quant == "nf4" else "transformers+peft",
            arch=args.arch or os.path.basename(os.path.normpath(args.model)), dtype=args.dtype, attn=args.attn,
            steps=args.steps, load_s=round(load_s, 1),
            gpu=torch.cuda.get_device_name(0) if cuda else "cpu",
            versions={"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
            n_lora=sum(p.numel() for p in params))
if args.quant == "nf4":
    import bitsandbytes
    info["versions"]["bitsandbytes"] = bitsandbytes.__version__
results = []
for shape in args.shapes.split(","):
    seq, bs = (int(x) for x in shape.split("x"))
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    failure = None
    try:
        ids = torch.randint(0, vocab, (bs, seq), device=args.device)
        for _ in range(2):
            step(ids)
        sync()
        t = time.time()
        for _ in range(args.steps):
            loss = step(ids)
        sync()
        dt = (time.time() - t) / args.steps
        r = dict(seq=seq, bs=bs, step_s=round(dt, 4), tok_s=round(bs * seq / dt, 1), loss=float(loss))
        if cuda:
            r.update(peak_alloc_gib=gib(torch.cuda.max_memory_allocated()),
                     peak_reserved_gib=gib(torch.cuda.max_memory_reserved()))
    except (torch.OutOfMemoryError, RuntimeError) as e:
        failure = "OOM" if out_of_memory(e) else f"{type(e).__name__}: {str(e)[:200]}"
    if failure:
        # the traceback's frames are gone here: free what the failed step left, start a new scaler
        # (its per-optimizer state may be mid-step) and go on with the next shape
        r = dict(seq=seq, bs=bs, error=failure)
        if cuda:
            r["peak_alloc_gib_at_error"] = gib(torch.cuda.max_memory_allocated())
        ids = loss = None
        opt.zero_grad(set_to_none=True)
        scaler = new_scaler()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    print(json.dumps(r), flush=True)
    results.append(r)
    json.dump(dict(info, results=results), open(args.out, "w"), indent=1)
