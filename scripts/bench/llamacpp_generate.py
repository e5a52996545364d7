#!/usr/bin/env python3
"""llama.cpp's side of the generation benchmark (scripts/device/bench_llamacpp.sh): what its
converters need from the benchmark's random model, and its results as rows like the other stacks'.

    llamacpp_generate.py source MODEL_DIR OUT_DIR    # the model folder as convert_hf_to_gguf.py reads it
    llamacpp_generate.py adapter MODEL_DIR OUT_DIR   # a PEFT rank-16 adapter on the seven projections
    llamacpp_generate.py rows --prompt-len P --new-tokens N BENCH.log...   # JSON rows on stdout

`source`: the random model has weights and config.json but no tokenizer, and convert_hf_to_gguf.py
always writes a vocabulary; OUT_DIR links the model's files and adds a small SentencePiece model
(byte fallback, so llama.cpp finds its byte tokens) that the converter pads to the config's
vocab_size. The benchmark feeds random token ids, so the vocabulary's text never matters.

`adapter`: the adapter generate_ref.py builds through PEFT (bench_models.LORA_R, lora_alpha 32, all
seven projections, B drawn from N(0, 0.01) as a trained adapter's, A as PEFT initializes it:
uniform in ±1/sqrt(in_features)), written straight in PEFT's file format (adapter_config.json,
adapter_model.safetensors, the model's dtype) without loading the 8B model.

`rows`: each BENCH.log is the output of one `llama-batched-bench --output-format jsonl` run (its
log lines included); one row per result line with lora-ft's field names: tokens_per_s (generated
tokens over the whole time, prefill included), decode_tokens_per_s (S_TG), prefill_tokens_per_s
(S_PP), and peak_alloc_gib, the device buffers llama.cpp reported allocating in that run
(weights, adapter, KV cache, compute buffers). A result with new_tokens 1 is the time to the first
token of one prompt: {"ttft_prompt", "ttft_ms"}, the best of its runs. The first row names the
stack: llama.cpp's version, the build's seconds, the GGUF file's size and bits per weight.
"""
import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models  # noqa: E402

LORA_ALPHA = 32  # generate_ref.py's LoraConfig


def source(model_dir: str, out_dir: str):
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(model_dir):
        if name == "config.json" or name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
            link = os.path.join(out_dir, name)
            if not os.path.lexists(link):
                os.symlink(os.path.abspath(os.path.join(model_dir, name)), link)
    model = os.path.join(out_dir, "tokenizer.model")
    if not os.path.exists(model):
        import io
        import sentencepiece as spm
        text = [" ".join(f"w{i * j % 997} x{j}" for j in range(40)) for i in range(200)]
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=buf, vocab_size=400,
                                       model_type="bpe", byte_fallback=True, minloglevel=2)
        with open(model, "wb") as f:
            f.write(buf.getvalue())
    print(json.dumps({"gguf_source": out_dir}))


def weights_dtype(model_dir: str):
    """The dtype the model's weights are stored in (the first tensor of its first safetensors file)."""
    import struct
    import torch
    name = next(n for n in sorted(os.listdir(model_dir)) if n.endswith(".safetensors"))
    with open(os.path.join(model_dir, name), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    first = next(v for k, v in header.items() if k != "__metadata__")
    return {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}[first["dtype"]]


def adapter(model_dir: str, out_dir: str):
    import torch
    from safetensors.torch import save_file
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    h, inter, heads, kv, d = bench_models._sizes(c)
    shapes = {  # (in_features, out_features) of each projection
        "self_attn.q_proj": (h, heads * d), "self_attn.k_proj": (h, kv * d), "self_attn.v_proj": (h, kv * d),
        "self_attn.o_proj": (heads * d, h), "mlp.gate_proj": (h, inter), "mlp.up_proj": (h, inter),
        "mlp.down_proj": (inter, h),
    }
    assert sorted(k.split(".")[1] for k in shapes) == sorted(bench_models.PROJECTIONS)
    dtype = weights_dtype(model_dir)
    r = bench_models.LORA_R
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(c["num_hidden_layers"]):
        for proj, (fan_in, fan_out) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.{proj}"
            bound = 1.0 / math.sqrt(fan_in)
            tensors[f"{key}.lora_A.weight"] = ((torch.rand(r, fan_in, generator=g) * 2 - 1) * bound).to(dtype)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(fan_out, r, generator=g) * 0.01).to(dtype)
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": os.path.abspath(model_dir),
        "r": r, "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": list(bench_models.PROJECTIONS), "inference_mode": True,
    }
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(json.dumps({"adapter": out_dir, "rank": r, "tensors": len(tensors)}))


# "load_tensors:        CUDA0 model buffer size =  4403.49 MiB", "CUDA0 KV buffer size", "CUDA0
# compute buffer size", "CUDA0 LoRA buffer size" (host-side CPU/CUDA_Host buffers are not device memory)
BUFFER = re.compile(r"\b(CUDA\d+|CPU)\s+(\w+\s+)?buffer size\s*=\s*([\d.]+) MiB")


# "print_info: file size   = 4.58 GiB (4.89 BPW)": the whole file (embeddings and lm_head too)
BPW = re.compile(r"file size\s*=\s*([\d.]+) (GiB|MiB) \(([\d.]+) BPW\)")


def rows(paths, prompt_len: int, new_tokens: int, device: str, version: str, build_s: float, skipped: str):
    ttft, stack = {}, {"stack": "llama.cpp llama-batched-bench, Q4_K_M + LoRA", "versions": {"llama.cpp": version},
                       "build_s": build_s}
    texts = []
    for path in paths:
        with open(path) as f:
            texts.append(f.read())
    for text in texts:
        m = BPW.search(text)
        if m:
            stack["file_gib"] = float(m.group(1)) / (1 if m.group(2) == "GiB" else 1024)
            stack["bits_per_weight"] = float(m.group(3))
            break
    print(json.dumps(stack))
    for path, text in zip(paths, texts):
        # each kind of buffer once per device: the compute buffers are reserved again once the
        # adapter is set, and the last reservation is the one in use
        buffers = {(m.group(1), m.group(2)): float(m.group(3)) for m in BUFFER.finditer(text)
                   if m.group(1).startswith("CUDA" if device == "cuda" else "CPU")}
        mib = sum(buffers.values())
        for line in text.splitlines():
            line = line.strip()
            if not (line.startswith("{") and '"speed_tg"' in line):
                continue
            r = json.loads(line)
            if r["tg"] == 1:
                key = (r["pp"], r["pl"])
                ttft[key] = min(ttft.get(key, math.inf), r["t_pp"])
                continue
            print(json.dumps({
                "batch": r["pl"], "prompt_len": r["pp"], "new_tokens": r["tg"],
                "tokens_per_s": r["pl"] * r["tg"] / r["t"], "decode_tokens_per_s": r["speed_tg"],
                "prefill_tokens_per_s": r["speed_pp"], "prefill_s": r["t_pp"], "decode_s": r["t_tg"],
                "peak_alloc_gib": mib / 1024 if mib else None, "n_kv": r["n_kv"],
            }))
            if (r["pp"], r["tg"]) != (prompt_len, new_tokens):
                print(f"warning: a result for {r['pp']}+{r['tg']} tokens in {path}", file=sys.stderr)
    for b in filter(None, skipped.split(",")):
        print(json.dumps({"batch": int(b), "prompt_len": prompt_len, "new_tokens": new_tokens,
                          "error": "skipped: past the time budget"}))
    for (pp, _), t in sorted(ttft.items()):
        print(json.dumps({"ttft_prompt": pp, "ttft_ms": 1e3 * t}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("source", "adapter"):
        p = sub.add_parser(name)
        p.add_argument("model_dir")
        p.add_argument("out_dir")
    p = sub.add_parser("rows")
    p.add_argument("logs", nargs="*")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--version", default="", help="llama.cpp's commit, for the stack row")
    p.add_argument("--build-s", type=float, default=0.0, help="the build's seconds (0: carried or reused)")
    p.add_argument("--skipped", default="", help="batch sizes skipped for the time budget")
    args = ap.parse_args()
    if args.cmd == "source":
        source(args.model_dir, args.out_dir)
    elif args.cmd == "adapter":
        adapter(args.model_dir, args.out_dir)
    else:
        rows(args.logs, args.prompt_len, args.new_tokens, args.device, args.version, args.build_s, args.skipped)


if __name__ == "__main__":
    main()
