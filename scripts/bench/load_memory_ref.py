#!/usr/bin/env python3
"""The reference stack's model load: transformers + bitsandbytes NF4 (double quant, fp16 compute),
as in ../shared/anchors/peft_qlora_baseline.py. Prints one JSON line: load time,
torch.cuda.memory_allocated() after loading, and the growth of the device's used memory
(cuMemGetInfo, the same view `lora-ft bench load` reports).

    load_memory_ref.py --model /tmp/m7b --create mistral-7b   # write a random model once (fp16)
    load_memory_ref.py --model /tmp/m7b                       # load it with bitsandbytes
"""
import argparse
import json
import os
import time

import torch

GIB = float(1 << 30)


def create(path: str, arch: str):
    """A random model of the exact architecture (memory and speed do not depend on the values)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
    if arch == "mistral-7b":
        cfg = MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                            rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False)
        cls = MistralForCausalLM
    else:
        cfg = LlamaConfig(vocab_size=32000, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                          num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=4096,
                          rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
        cls = LlamaForCausalLM
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float16)  # no fp32 copy: a 13B fp32 model would not fit beside it
    with torch.device("cuda"):
        m = cls(cfg)
    m.save_pretrained(path, safe_serialization=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--create", choices=["mistral-7b", "llama2-13b"])
    args = ap.parse_args()
    if args.create:
        if not os.path.exists(os.path.join(args.model, "config.json")):
            create(args.model, args.create)
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
