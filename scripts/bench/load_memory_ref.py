#!/usr/bin/env python3
"""The reference stack's model load: transformers + bitsandbytes NF4 (double quant, fp16 compute),
as in ../shared/anchors/peft_qlora_baseline.py. Prints one JSON line: load time,
torch.cuda.memory_allocated() after loading, and the growth of the device's used memory
(cuMemGetInfo, the same view `lora-ft bench load` reports).

    load_memory_ref.py --model /tmp/m7b --create mistral-7b   # write a random model once (fp16;
                                                              # any name of bench_models.MODELS)
    load_memory_ref.py --model /tmp/m7b                       # load it with bitsandbytes
"""
import argparse
import json
import os
import time

import torch

import bench_models

GIB = float(1 << 30)


def create(path: str, arch: str, device: str = "cuda", tiny: bool = False):
    """A random model of the exact architecture (memory and speed do not depend on the values):
    the published config.json of bench_models.py goes through transformers' own loader, as a
    download would, the weights are drawn on `device` in the benchmark's dtype (f16, bf16 for
    Gemma 2) with no fp32 copy (a 14B fp32 model would not fit beside it), and the folder keeps
    the published config.json, not transformers' rewrite of it."""
    from transformers import AutoConfig, AutoModelForCausalLM
    published = bench_models.tiny(arch) if tiny else bench_models.config(arch)
    dtype = torch.bfloat16 if bench_models.MODELS[arch][1] == "bf16" else torch.float16
    os.makedirs(path, exist_ok=True)
    config_path = os.path.join(path, "config.json")
    write_json = lambda: json.dump(published, open(config_path, "w"), indent=2)  # noqa: E731
    write_json()
    cfg = AutoConfig.from_pretrained(path)
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    m.save_pretrained(path, safe_serialization=True)
    write_json()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--create", choices=list(bench_models.MODELS), help="write a random model of this name")
    ap.add_argument("--device", default="cuda", help="where --create draws the weights (cpu for checks)")
    ap.add_argument("--tiny", action="store_true", help="--create the toy-sized config (bench_models.tiny)")
    args = ap.parse_args()
    if args.create:
        if not os.path.exists(os.path.join(args.model, "model.safetensors.index.json")) and \
                not os.path.exists(os.path.join(args.model, "model.safetensors")):
            t0 = time.time()
            create(args.model, args.create, args.device, args.tiny)
            print(json.dumps({"created": args.create, "model": args.model, "write_s": round(time.time() - t0, 1)}))
        return
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.float16)
    torch.cuda.init()
    free0, _ = torch.cuda.mem_get_info()
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=bnb, dtype=torch.float16,
                                                 device_map={"": 0})
    torch.cuda.synchronize()
    load_s = time.time() - t0
    free1, _ = torch.cuda.mem_get_info()
    print(json.dumps({
        "stack": "transformers+bitsandbytes", "model": args.model, "load_s": load_s,
        "allocated_gib": torch.cuda.memory_allocated() / GIB,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "reserved_gib": torch.cuda.memory_reserved() / GIB,
        "device_used_gib": (free0 - free1) / GIB,
        "n_params": sum(p.numel() for p in model.parameters()),
    }))


if __name__ == "__main__":
    main()
