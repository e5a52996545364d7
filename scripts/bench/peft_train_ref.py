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

The loop, its JSON lines and FILE are train_ref_loop.py's (shared with unsloth_train_ref.py).
`--device cpu --quant none --dtype f32` runs the same
loop without bitsandbytes, for checking the script on a machine with no GPU.
"""
import argparse
import os
import time

import torch

import train_ref_loop

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
info = dict(stack="transformers+peft+bitsandbytes" if args.quant == "nf4" else "transformers+peft",
            arch=args.arch or os.path.basename(os.path.normpath(args.model)), dtype=args.dtype, attn=args.attn,
            load_s=round(load_s, 1),
            versions={"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__})
if args.quant == "nf4":
    import bitsandbytes
    info["versions"]["bitsandbytes"] = bitsandbytes.__version__
train_ref_loop.run(model, compute, args.device, args.shapes, args.steps, args.out, info)
