#!/usr/bin/env python3
"""The reference of scripts/gguf_llamacpp_families.py, computed by transformers (CPU) and
committed, so that tests/gguf_llamacpp.rs needs only llama.cpp and numpy: for each tiny fixture
family and the demo SmolLM2 (with tests/golden/peft_smollm2_adapter), and for each case (the
base; the adapter merged; the base's weights rounded before the adapter is applied, as llama.cpp
applies an --adapter-only file), the float64 logits of the check's sequences, e32 and ew of f16
and q8_0 (gguf-py's quantizer), from the script's own functions.

    python3 scripts/golden/gguf_llamacpp_reference.py [--model ~/.cache/lora-ft/smollm2-hf]
      (needs torch, transformers, gguf, safetensors; writes tests/golden/gguf_llamacpp.json,
      gguf_llamacpp.safetensors (the fixtures) and gguf_llamacpp_smollm2.safetensors)

The logits are stored rounded to float32, and the largest rounding of each case (`stored`) is
recorded: the check adds it to llama.cpp's difference, so its verdict is never laxer than
against the float64 values. Each model's and adapter's digest is recorded for the check to
compare with what it exports.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gguf_llamacpp_families as fam  # noqa: E402

TYPES = ["f16", "q8_0"]
CASES = {"base": (False, False), "adapter": (True, False), "lora_gguf": (True, True)}


def model_entry(name, source, adapter, real, tensors_file, tensors):
    """One model's cases; its logits go into `tensors` (float32) under `name.<base|adapter>.<i>`."""
    entry = {"model_sha256": fam.inputs_sha256(source), "adapter_sha256": fam.inputs_sha256(adapter),
             "tensors": tensors_file, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, name)
        fam.prepare(source, folder, real=real)
        for case, (with_adapter, lora_gguf) in CASES.items():
            r = fam.transformers_reference(folder, fam.SEQUENCES, adapter if with_adapter else None, lora_gguf, TYPES)
            which = "adapter" if with_adapter else "base"
            keys = [f"{name}.{which}.{i}" for i in range(len(r["ref"]))]
            stored = 0.0
            for key, logits in zip(keys, r["ref"]):
                rounded = logits.astype(np.float32)
                if key in tensors:  # the adapter's reference is the same for both adapter cases
                    assert np.array_equal(tensors[key], rounded), key
                tensors[key] = rounded
                stored = max(stored, float(np.abs(rounded.astype(np.float64) - logits).max()))
            entry["cases"][case] = {"logits": keys, "e32": r["e32"], "ew": r["ew"], "stored": stored}
            print(f"{name} {case}: e32 {r['e32']:.3e} ew {r['ew']} stored {stored:.1e}", flush=True)
    return entry


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/lora-ft/smollm2-hf"),
                    help="the demo model's HF folder (bash scripts/fetch-demo-model.sh)")
    ap.add_argument("--out", default="tests/golden")
    args = ap.parse_args()
    from importlib.metadata import version

    import torch
    from safetensors.numpy import save_file
    torch.set_num_threads(2)
    models, small, smollm2 = {}, {}, {}
    for name in fam.FAMILIES:
        source = os.path.join("tests/fixtures", name)
        models[name] = model_entry(name, source, os.path.join(source, "adapter"), False, "gguf_llamacpp.safetensors",
                                   small)
    name = os.path.basename(args.model.rstrip("/"))
    models[name] = model_entry(name, args.model, "tests/golden/peft_smollm2_adapter", True,
                               "gguf_llamacpp_smollm2.safetensors", smollm2)
    save_file(small, os.path.join(args.out, "gguf_llamacpp.safetensors"))
    save_file(smollm2, os.path.join(args.out, "gguf_llamacpp_smollm2.safetensors"))
    meta = {"about": "the reference of scripts/gguf_llamacpp_families.py; written by "
                     "scripts/golden/gguf_llamacpp_reference.py",
            "versions": {p: version(p) for p in ["torch", "transformers", "gguf", "numpy"]},
            "sequences": fam.SEQUENCES, "models": models}
    with open(os.path.join(args.out, "gguf_llamacpp.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
