#!/usr/bin/env python3
"""Issue 21's per-family llama.cpp check: each tiny fixture family exported by `lora-ft export-gguf`
and run by llama.cpp itself (CPU, every position's logits: the prebuilt llama.cpp of
scripts/gguf_llamacpp_install.sh, through scripts/gguf_llamacpp_run.py), against transformers
running the same Hugging Face folder in float64 (the reference).

    python3 scripts/gguf_llamacpp_families.py [--lora-ft BIN] [--families a,b] [--types f16,q8_0]
                                              [--adapter]  (merge each fixture's adapter/ too)
                                              [--lora-gguf] (an --adapter-only file applied by llama.cpp)
                                              [--model DIR] (a real HF folder instead, e.g. SmolLM2's,
                                                             with its own tokenizer; --adapter-dir A)
                                              [--reference GOLDEN.json | transformers]

The reference (its logits, and e32 and ew below) is read from the golden tests/golden/
gguf_llamacpp.json (written by scripts/golden/gguf_llamacpp_reference.py from these functions;
its inputs' digests are checked, so a changed fixture fails until the golden is written again),
or computed here with `--reference transformers` (torch, transformers and gguf-py). The golden
stores the float64 logits rounded to float32; that rounding (at most `stored`, recorded beside
them) is added to llama.cpp's difference and taken off the bound for the top-1 test, so the
verdict is never laxer than against the float64 values. Without the golden, only numpy.

Each fixture is copied to a scratch folder with a tokenizer (256 GPT-2 byte symbols, one merge:
the tiny models have 256 ids and no tokenizer; the token ids are fed directly, so it only has to
load). Gemma's `query_pre_attn_scalar` is set to head_dim in the copy, since llama.cpp scales
queries by 1/sqrt(head_dim) and export-gguf refuses another scalar; tiny-mistral's sliding window
(5) is removed, since llama.cpp's llama graph has none and export-gguf refuses it.

The bound, per family and file type, from numbers measured here (nothing guessed):
  e32 = max |logit| difference of transformers float32 from the float64 reference (f32 arithmetic)
  ew  = the same for transformers float64 with every tensor the file stores in the file type
        rounded to that type (f16, or q8_0 quantize→dequantize via gguf-py), the rest exact
llama.cpp rounds three operands of each product to the file type's precision: the weights (ew),
the activations it converts to the weights' dot-product type (f16 for f16 weights, q8_0 for q8_0)
and the f16 K/V cache (the other factor of the same products: the same relative rounding, so the
same first-order size). First-order errors add, at worst linearly, so
  bound = 3 * ew + e32,
and llama.cpp passes when its max |logit - reference| is within it and its top-1 token equals the
reference's at every position whose reference top-2 gap exceeds the bound.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_llamacpp_run as llamacpp  # noqa: E402

FAMILIES = ["tiny-llama", "tiny-llama31", "tiny-mistral", "tiny-nemo", "tiny-qwen2", "tiny-qwen3",
            "tiny-gemma2", "tiny-gemma3"]
# token sequences (ids < 256)
SEQUENCES = [[1, 17, 200, 45, 9, 88, 131, 250, 3, 77, 64, 12], [2, 255, 0, 128, 7, 33, 99, 101, 180, 5]]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def prepare(src, dst, real=False):
    shutil.copytree(src, dst)
    if real:
        return json.load(open(os.path.join(dst, "config.json")))
    shutil.rmtree(os.path.join(dst, "adapter"), ignore_errors=True)
    vocab = {ch: b for b, ch in sorted(bytes_to_unicode().items())}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                               "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": ["Ġ Ġ"]}}  # one merge: llama.cpp needs the key, a string array
    json.dump(tok, open(os.path.join(dst, "tokenizer.json"), "w"))
    json.dump({}, open(os.path.join(dst, "tokenizer_config.json"), "w"))
    cfg_path = os.path.join(dst, "config.json")
    cfg = json.load(open(cfg_path))
    if cfg["model_type"].startswith("gemma"):
        cfg["query_pre_attn_scalar"] = cfg["head_dim"]
    if cfg["model_type"] == "mistral":
        cfg["sliding_window"] = None  # llama.cpp's llama graph has none: export-gguf refuses a window
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    return cfg


def hf_logits(folder, dtype, seqs, round_to=None, adapter=None, adapter_after_rounding=False):
    """Logits of each sequence; `round_to` rounds the 2-D weights (what the GGUF stores in the file
    type; 1-D tensors stay f32) after the adapter is merged, or before it where llama.cpp applies
    the adapter at run time (`adapter_after_rounding`)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
    if adapter and not adapter_after_rounding:
        merge_adapter(model, adapter)
    if round_to is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.copy_(round_to(p))
    if adapter and adapter_after_rounding:
        merge_adapter(model, adapter)
    out = []
    with torch.no_grad():
        for seq in seqs:
            out.append(model(torch.tensor([seq])).logits[0].double().numpy())
    return out


def merge_adapter(model, adapter):
    """W += scale * B @ A, as `lora-ft merge` folds a PEFT adapter (f64 here)."""
    import torch
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    scale = cfg["lora_alpha"] / (cfg["r"] ** 0.5 if cfg.get("use_rslora") else cfg["r"])
    weights = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, a in weights.items():
            if ".lora_A." not in key:
                continue
            b = weights[key.replace(".lora_A.", ".lora_B.")]
            target = key.replace("base_model.model.", "").replace(".lora_A.weight", ".weight")
            p = params[target]
            p += scale * (b.double() @ a.double()).to(p.dtype)


def f16_round(p):
    import torch
    return p.to(torch.float16).to(p.dtype)


def q8_0_round(p):
    import torch
    from gguf import quants, GGMLQuantizationType
    arr = p.detach().to(torch.float32).numpy()
    if arr.shape[-1] % 32:
        return f16_round(p)  # gguf-py's fallback, as the export's
    back = quants.dequantize(quants.quantize(arr, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    return torch.from_numpy(back.astype(np.float64)).to(p.dtype)


ROUNDERS = {"f16": f16_round, "q8_0": q8_0_round}
GOLDEN = "tests/golden/gguf_llamacpp.json"


def llamacpp_logits(gguf, seqs, lora=None):
    return llamacpp.logits(gguf, seqs, lora)


def transformers_reference(folder, seqs, adapter, lora_gguf, types):
    """What the bound needs, from transformers: the float64 logits, e32 and ew of each file type."""
    import torch
    ref = hf_logits(folder, torch.float64, seqs, adapter=adapter)
    e32 = max_diff(hf_logits(folder, torch.float32, seqs, adapter=adapter), ref)
    ew = {t: max_diff(hf_logits(folder, torch.float64, seqs, ROUNDERS[t], adapter, lora_gguf), ref) for t in types}
    return {"ref": ref, "e32": e32, "ew": ew, "stored": 0.0}


def safetensors_read(path):
    """{name: (dtype, shape, bytes)} of a .safetensors file (numpy alone)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = memoryview(f.read())
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def inputs_sha256(folder):
    """A digest of what the logits come from: config.json / adapter_config.json's values and every
    tensor (name, dtype, shape, bytes) of the folder's .safetensors files (not its subfolders)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name in ("config.json", "adapter_config.json"):
            h.update(name.encode() + json.dumps(json.load(open(path)), sort_keys=True).encode())
        elif name.endswith(".safetensors"):
            for key, (dtype, shape, data) in sorted(safetensors_read(path).items()):
                h.update(f"{name}/{key}/{dtype}/{shape}".encode())
                h.update(data)
    return h.hexdigest()


def case_of(adapter, lora_gguf):
    return "lora_gguf" if lora_gguf else "adapter" if adapter else "base"


def golden_reference(golden, name, source, adapter, lora_gguf, types):
    """The reference of `name` (a fixture family, or a real model's folder name) from the golden,
    after checking that the model and adapter are those it was computed from."""
    regenerate = "write it again: python3 scripts/golden/gguf_llamacpp_reference.py (torch, transformers, gguf)"
    meta = json.load(open(golden))
    if meta["sequences"] != SEQUENCES:
        sys.exit(f"{golden} was computed for other sequences: {regenerate}")
    model = meta["models"].get(name)
    if model is None:
        sys.exit(f"{golden} has no reference for {name}: {regenerate}, or --reference transformers")
    if inputs_sha256(source) != model["model_sha256"]:
        sys.exit(f"{source} is not the model {golden} was computed from: {regenerate}")
    if adapter and inputs_sha256(adapter) != model["adapter_sha256"]:
        sys.exit(f"{adapter} is not the adapter {golden} was computed from: {regenerate}")
    case = model["cases"][case_of(adapter, lora_gguf)]
    missing = [t for t in types if t not in case["ew"]]
    if missing:
        sys.exit(f"{golden} has no ew for {name} {missing}: {regenerate}")
    tensors = safetensors_read(os.path.join(os.path.dirname(golden), model["tensors"]))
    ref = []
    for key in case["logits"]:
        dtype, shape, data = tensors[key]
        assert dtype == "F32", key
        ref.append(np.frombuffer(data, dtype=np.float32).reshape(shape).astype(np.float64))
    return {"ref": ref, "e32": case["e32"], "ew": case["ew"], "stored": case["stored"]}


def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lora-ft", default="target/release/lora-ft")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--types", default="f16,q8_0")
    ap.add_argument("--adapter", action="store_true", help="merge each fixture's adapter/ (export-gguf --adapter)")
    ap.add_argument("--lora-gguf", action="store_true",
                    help="apply an export-gguf --adapter-only file in llama.cpp over the base's GGUF")
    ap.add_argument("--model", default=None, help="a real HF folder (its own tokenizer) instead of the fixtures")
    ap.add_argument("--adapter-dir", default=None, help="with --model: the adapter for --adapter / --lora-gguf")
    ap.add_argument("--reference", default=GOLDEN,
                    help="the golden to read the reference from, or `transformers` to compute it here")
    args = ap.parse_args()
    failed = 0
    print("| family | file | max abs ref logit | max abs dlogit llama.cpp vs f64 | top-1 agree | e32 | ew | "
          "bound 3ew+e32 | pass |")
    print("|---|---|---|---|---|---|---|---|---|")
    families = [os.path.basename(args.model.rstrip("/"))] if args.model else args.families.split(",")
    for fam in families:
        with tempfile.TemporaryDirectory() as tmp:
            source = args.model or os.path.join("tests/fixtures", fam)
            folder = source if args.model else os.path.join(tmp, fam)  # a real folder is used as it is
            if not args.model:
                prepare(source, folder)
            fixture_adapter = args.adapter_dir or os.path.join("tests/fixtures", fam, "adapter")
            adapter = fixture_adapter if args.adapter or args.lora_gguf else None
            seqs = SEQUENCES
            types = args.types.split(",")
            if args.reference == "transformers":
                reference = transformers_reference(folder, seqs, adapter, args.lora_gguf, types)
            else:
                reference = golden_reference(args.reference, fam, source, adapter, args.lora_gguf, types)
            ref, e32, stored = reference["ref"], reference["e32"], reference["stored"]
            for ftype in types:
                ew = reference["ew"][ftype]
                out = os.path.join(tmp, f"{fam}-{ftype}.gguf")
                cmd = [args.lora_ft, "export-gguf", "--model", folder, out, "--type", ftype]
                lora = None
                if adapter and not args.lora_gguf:
                    cmd += ["--adapter", adapter]
                run = subprocess.run(cmd, capture_output=True, text=True)
                if run.returncode:
                    sys.exit(f"{fam}: export-gguf failed: {run.stderr[-2000:]}")
                if args.lora_gguf:
                    lora = os.path.join(tmp, f"{fam}-lora.gguf")
                    run = subprocess.run([args.lora_ft, "export-gguf", "--model", folder, "--adapter", adapter, lora,
                                          "--adapter-only"], capture_output=True, text=True)
                    if run.returncode:
                        sys.exit(f"{fam}: export-gguf --adapter-only failed: {run.stderr[-2000:]}")
                theirs = llamacpp_logits(out, seqs, lora)
                d = max_diff(theirs, ref) + stored  # at least llama.cpp's difference from the float64 values
                bound = 3 * ew + e32
                agree = total = 0
                ok = d <= bound
                for t, r in zip(theirs, ref):
                    for pos in range(len(r)):
                        top2 = np.sort(r[pos])[-2:]
                        total += 1
                        same = int(np.argmax(t[pos]) == np.argmax(r[pos]))
                        agree += same
                        if not same and top2[1] - top2[0] > bound - 2 * stored:
                            ok = False
                failed += not ok
                label = ftype + (" +lora.gguf" if args.lora_gguf else " +adapter" if adapter else "")
                scale = max(float(np.abs(r).max()) for r in ref)
                print(f"| {fam} | {label} | {scale:.3f} | {d:.3e} | {agree}/{total} | {e32:.1e} | {ew:.3e} | {bound:.3e} | "
                      f"{'yes' if ok else 'NO'} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
