"""Golden blocks for `lora-ft export-gguf --type q4_k_m`: fixed f32 rows quantized by llama.cpp
itself — ggml's `ggml_quantize_chunk` from the libggml-base.so that llama-cpp-python ships,
called through ctypes with no importance matrix, which is what `llama-quantize` runs for each
tensor (it lands in `quantize_row_q4_K_ref`, `quantize_row_q6_K_ref`, `quantize_row_q5_0_ref`,
...). Needs `pip install llama-cpp-python numpy`; run:

    python3 scripts/golden/gguf_kquants.py [OUT_JSON]

Writes tests/golden/gguf_kquants.json (inputs as f32 values, outputs as hex bytes per type),
read by tests/gguf_export.rs, which requires our blocks to equal these byte for byte.
"""

import ctypes
import importlib.metadata
import json
import os
import sys

import llama_cpp
import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/gguf_kquants.json"

# ggml_type values (ggml.h) and the bytes of one block of each
TYPES = {"q5_0": (6, 32, 22), "q8_0": (8, 32, 34), "q4_k": (12, 256, 144),
         "q5_k": (13, 256, 176), "q6_k": (14, 256, 210)}


def ggml():
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    f = lib.ggml_quantize_chunk
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_void_p]
    return f


def cases():
    rng = np.random.default_rng(2104)
    n = 256
    yield "zeros", np.zeros(n)
    yield "constant", np.full(n, 0.37)
    yield "constant_negative", np.full(n, -1.5)
    yield "negative_only", rng.uniform(-2.0, -0.01, n)
    yield "positive_only", rng.uniform(0.01, 3.0, n)
    yield "tiny", rng.normal(0, 1e-6, n)  # scales are f16 subnormals
    yield "below_f16", rng.normal(0, 1e-9, n)  # scales round to f16 zero
    yield "large", rng.normal(0, 3e3, n)
    yield "huge", rng.normal(0, 2e5, n)  # scales overflow f16 to inf
    outlier = rng.normal(0, 0.02, n)
    outlier[77] = 1.0
    yield "outlier", outlier
    sparse = np.zeros(n)
    sparse[[3, 40, 41, 200]] = [0.5, -0.25, 0.125, -1.0]
    yield "sparse", sparse
    halves = np.array([(i % 33 - 16) * 0.5 for i in range(n)])  # values on rounding ties
    yield "halves", halves
    yield "normal_4_blocks", rng.normal(0, 0.02, 4 * n)
    yield "weights_3x512", rng.normal(0, 0.05, (3, 512))


def main():
    quantize = ggml()
    out = []
    for name, values in cases():
        values = np.ascontiguousarray(np.asarray(values, dtype=np.float32))
        rows, per_row = (values.shape if values.ndim == 2 else (1, values.size))
        entry = {"name": name, "shape": list(values.shape), "values": [float(v) for v in values.ravel()]}
        for key, (ggml_type, block, size) in TYPES.items():
            dst = np.zeros(values.size // block * size, dtype=np.uint8)
            written = quantize(ggml_type, values.ctypes.data, dst.ctypes.data, 0, rows, per_row, None)
            assert written == dst.size, (name, key, written, dst.size)
            entry[key] = dst.tobytes().hex()
        out.append(entry)
    lines = ",\n".join(json.dumps(case) for case in out)
    version = importlib.metadata.version("llama_cpp_python")
    with open(OUT, "w") as f:
        f.write(f'{{"llama_cpp_python": "{version}", "cases": [\n{lines}\n]}}\n')
    print(f"wrote {OUT}: {len(out)} cases")


if __name__ == "__main__":
    main()
