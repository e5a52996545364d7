"""Golden blocks for `lora-ft export-gguf`'s quantizer: fixed f32 tensors quantized by gguf-py
(`gguf.quants.quantize`, bit-exact with ggml-quants.c's reference `quantize_row_*_ref`) to Q8_0,
F16 and BF16. Needs only `pip install gguf numpy`; run:

    python3 scripts/golden/gguf_quants.py [OUT_JSON]

Writes tests/golden/gguf_quants.json (inputs as f32 values, outputs as hex bytes), read by
tests/gguf_export.rs, which requires our blocks to equal these byte for byte.
"""

import importlib.metadata
import json
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

OUT = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/gguf_quants.json"


def cases():
    rng = np.random.default_rng(21)
    block = 32
    yield "zeros", np.zeros(block)
    yield "tiny", rng.uniform(-1e-6, 1e-6, block)  # d is an f16 subnormal
    yield "below_f16", rng.uniform(-1e-9, 1e-9, block)  # d rounds to f16 zero
    negative_max = rng.uniform(-1, 1, block)
    negative_max[7] = -3.0
    yield "negative_max", negative_max
    # amax 127 gives d = 1: the halves show round-half-away-from-zero
    halves = np.array([127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5] + [0.25 * i for i in range(24)])
    yield "halves", halves
    yield "one_nonzero", np.eye(1, block, 5).ravel() * 0.1
    yield "large", rng.normal(0, 1e5, block)
    yield "normal_4_blocks", rng.normal(0, 0.02, 4 * block)
    yield "weights_2x64", rng.normal(0, 0.05, (2, 64))


def main():
    out = []
    for name, values in cases():
        values = np.asarray(values, dtype=np.float32)
        entry = {"name": name, "shape": list(values.shape), "values": [float(v) for v in values.ravel()]}
        for qtype, key in [(T.Q8_0, "q8_0"), (T.F16, "f16"), (T.BF16, "bf16")]:
            with np.errstate(over="ignore"):  # "large" overflows f16 to inf, as gguf-py writes it
                entry[key] = gguf.quants.quantize(values, qtype).tobytes().hex()
        out.append(entry)
    lines = ",\n".join(json.dumps(case) for case in out)
    with open(OUT, "w") as f:
        f.write(f'{{"gguf": "{importlib.metadata.version("gguf")}", "cases": [\n{lines}\n]}}\n')
    print(f"wrote {OUT}: {len(out)} cases")


if __name__ == "__main__":
    main()
