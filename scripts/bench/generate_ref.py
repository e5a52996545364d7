#!/usr/bin/env python3
"""The reference generation for `lora-ft bench generate`: transformers' `generate` on the model
loaded in NF4 by bitsandbytes (double quantization), with PEFT's rank-16 adapter on all seven
projections left unmerged (B drawn at random, as a trained adapter's), greedy, random prompts of
--prompt-len tokens, each batch decoded to exactly --new-tokens (min_new_tokens: no early stop),
and the time to the first token of one --ttft-prompt prompt. One JSON line per batch size, the
same fields as lora-ft's rows.

    generate_ref.py --model DIR [--batches 1,8,64,256] [--prompt-len 512] [--new-tokens 256]
                    [--dtype bf16] [--ttft-prompt 2048] [--budget-s 300]

A batch that would start past --budget-s is reported as skipped. `--device cpu --quant none
--dtype f32` runs it without bitsandbytes, for checking the script on a machine with no GPU.
"""
import argparse
import json
import time

import torch

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--model", required=True)
ap.add_argument("--batches", default="1,8,64,256")
ap.add_argument("--prompt-len", type=int, default=512)
ap.add_argument("--new-tokens", type=int, default=256)
ap.add_argument("--ttft-prompt", type=int, default=2048)
ap.add_argument("--dtype", default="bf16", choices=["f16", "bf16", "f32"])
ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
ap.add_argument("--quant", default="nf4", choices=["nf4", "none"])
ap.add_argument("--budget-s", type=float, default=300.0)
args = ap.parse_args()

import peft  # noqa: E402
import transformers  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

started = time.time()
cuda = args.device == "cuda"
compute = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
kwargs = dict(dtype=compute)
if args.quant == "nf4":
    kwargs["quantization_config"] = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute)
if cuda:
    kwargs["device_map"] = {"": 0}
model = AutoModelForCausalLM.from_pretrained(args.model, **kwargs)
lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
model = get_peft_model(model, lora)
with torch.no_grad():
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.normal_(0.0, 0.01)
model.eval()
device = torch.device("cuda:0" if cuda else "cpu")
vocab = model.config.vocab_size
versions = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
if args.quant == "nf4":
    import bitsandbytes
    versions["bitsandbytes"] = bitsandbytes.__version__
print(json.dumps({"stack": "transformers+peft+bitsandbytes generate", "versions": versions,
                  "load_s": round(time.time() - started, 1)}), flush=True)


def sync():
    if cuda:
        torch.cuda.synchronize()


def run(batch, prompt_len, new_tokens, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=g).to(device)
    mask = torch.ones_like(ids)
    sync()
    t0 = time.time()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    sync()
    assert out.shape[1] == prompt_len + new_tokens, out.shape
    return time.time() - t0


run(1, 16, 4, 0)  # kernels' first use, outside the timings
for batch in [int(b) for b in args.batches.split(",")]:
    row = {"batch": batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens}
    if time.time() - started > args.budget_s:
        row["error"] = "skipped: past the time budget"
        print(json.dumps(row), flush=True)
        continue
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        seconds = run(batch, args.prompt_len, args.new_tokens, batch)
        row["tokens_per_s"] = batch * args.new_tokens / seconds
        if cuda:
            row["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30
    except torch.OutOfMemoryError as e:
        row["error"] = f"out of memory: {str(e).splitlines()[0]}"
        torch.cuda.empty_cache()
    print(json.dumps(row), flush=True)
if args.ttft_prompt > 0 and time.time() - started <= args.budget_s:
    best = min(run(1, args.ttft_prompt, 1, 1000 + s) for s in range(2))
    print(json.dumps({"ttft_prompt": args.ttft_prompt, "ttft_ms": 1e3 * best}), flush=True)
