#!/usr/bin/env python3
"""Issue 21: `lora-ft export-gguf --type q4_k_m` against llama.cpp's own Q4_K_M. llama.cpp
(`llama_model_quantize` of llama-cpp-python, what `llama-quantize SRC OUT Q4_K_M` runs, no
imatrix) quantizes SRC, an export of the same model in f32 (like with like: both quantize the
same f32 values) or f16 (llama.cpp then quantizes f16-rounded weights, so some blocks differ);
then every tensor's name, shape, type and bytes and every metadata key of OURS are compared
with llama.cpp's file.

    python3 scripts/gguf_q4km_check.py --ours OUT_q4_k_m.gguf --source OUT_f32.gguf [--golden F]

--golden writes each tensor's type in llama.cpp's file and the CRC-32 of its bytes
(tests/golden/gguf_q4km_smollm2.json, from the demo SmolLM2's f32 export), which
tests/gguf_q4km.rs compares our export with. Exits 1 if a type or the tensor data differ.
"""
import argparse
import ctypes
import importlib.metadata
import json
import os
import sys
import tempfile
import zlib

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES


def llama_quantize(src, dst):
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 2
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama_model_quantize failed on {src}")


def fields(reader):
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = [bytes(field.parts[i]).hex() for i in field.data]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", required=True)
    ap.add_argument("--source", required=True, help="our f32 (or f16) export of the same model")
    ap.add_argument("--golden", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        theirs_path = os.path.join(tmp, "llama_cpp_q4_k_m.gguf")
        llama_quantize(args.source, theirs_path)
        ours, theirs = GGUFReader(args.ours), GGUFReader(theirs_path)
        t_ours = {t.name: t for t in ours.tensors}
        t_theirs = {t.name: t for t in theirs.tensors}
        # llama.cpp writes the tensors in its loader's order (by layer), ours in the HF order
        assert sorted(t_ours) == sorted(t_theirs), "the tensor names differ"
        counts, type_diff, byte_diff, blocks = {}, [], [], [0, 0]
        for name, a in t_ours.items():
            b = t_theirs[name]
            counts[b.tensor_type.name] = counts.get(b.tensor_type.name, 0) + 1
            if a.tensor_type != b.tensor_type or list(a.shape) != list(b.shape):
                type_diff.append(f"{name}: ours {a.tensor_type.name} {list(a.shape)}, llama.cpp {b.tensor_type.name}")
                continue
            da, db = np.asarray(a.data).view(np.uint8).ravel(), np.asarray(b.data).view(np.uint8).ravel()
            if not np.array_equal(da, db):
                byte_diff.append(name)
            _, size = GGML_QUANT_SIZES[a.tensor_type]
            n = da.size // size
            same = (da.reshape(n, size) == db.reshape(n, size)).all(axis=1).sum()
            blocks[0] += int(same)
            blocks[1] += n
        golden = {name: {"type": t.tensor_type.name, "crc32": zlib.crc32(np.asarray(t.data).view(np.uint8).tobytes())}
                  for name, t in sorted(t_theirs.items())}
        meta_ours, meta_theirs = fields(ours), fields(theirs)
        meta_diff = sorted(k for k in set(meta_ours) | set(meta_theirs) if meta_ours.get(k) != meta_theirs.get(k))
    print(json.dumps({"tensors": len(t_ours), "llama.cpp types": counts, "type differences": type_diff,
                      "tensors with other bytes": len(byte_diff), "identical blocks": f"{blocks[0]} of {blocks[1]}",
                      "metadata keys differing": meta_diff}, indent=1))
    if byte_diff:
        print("first tensors with other bytes:", byte_diff[:8])
    if args.golden:
        lines = ",\n".join(f"{json.dumps(name)}: {json.dumps(v)}" for name, v in golden.items())
        version = importlib.metadata.version("llama_cpp_python")
        with open(args.golden, "w") as f:
            f.write(f'{{"llama_cpp_python": "{version}", "source": {json.dumps(os.path.basename(args.source))}, '
                    f'"tensors": {{\n{lines}\n}}}}\n')
    sys.exit(1 if type_diff or byte_diff else 0)


if __name__ == "__main__":
    main()
