#!/usr/bin/env python3
"""Golden NF4 + double-quantization results from bitsandbytes, for lora-ft's bit-exact tests.

Quantizes a set of tensors with
    bitsandbytes.functional.quantize_4bit(A, quant_type="nf4", blocksize=64, compress_statistics=True)
and stores inputs and every output (packed codes, raw absmax, 8-bit absmax codes, second-level
absmax, offset, dynamic map, dequantized values) in one safetensors file.

The authoritative file comes from the CUDA kernels (run on the GPU machine):
    python3 scripts/golden/nf4_bnb.py --out tests/golden/nf4_bnb.safetensors
`--device cpu` runs bitsandbytes' CPU backend instead, for development only; the device is kept in
the file's metadata and the Rust tests insist on "cuda".
"""
import argparse
import json

import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from safetensors.torch import save_file

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]


def cases(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Named inputs; each stresses one part of the format."""
    randn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    c = {}
    c["normal_128x320"] = randn(128, 320) * 0.02  # weight-like: 640 blocks, 2.5 absmax blocks
    c["normal_len1000"] = randn(1000)  # last 64-block partial; 16 absmax (partial 256-block)
    c["len_1"] = randn(1)
    c["len_63"] = randn(63)
    c["len_65"] = randn(65)
    c["len_16385"] = randn(16385) * 3.0  # 257 absmax values: a second 256-block with one entry
    # heavy tails: Student-t with 1.5 degrees of freedom
    chi = torch.distributions.Chi2(torch.tensor(1.5)).sample((128, 96))
    c["student_t_128x96"] = randn(128, 96) / torch.sqrt(chi / 1.5)
    z = randn(40, 64)
    z[3] = 0.0
    z[10:14] = 0.0
    z[20, :63] = 0.0  # one non-zero entry in the block
    c["zero_blocks_40x64"] = z
    h = randn(32, 64) * 1000.0
    h[::5] *= 50.0  # near the fp16 maximum (65504)
    c["huge_32x64"] = h.clamp(-65504.0, 65504.0)
    c["tiny_16x64"] = randn(16, 64) * 1e-6  # fp16 subnormals
    # exact codebook values and midpoints between neighbours (the decision tree's ties)
    nf4 = torch.tensor(NF4)
    mids = (nf4[1:] + nf4[:-1]) / 2
    ties = torch.cat([nf4, mids, mids + 1e-4, mids - 1e-4, -mids, torch.full((3,), 0.5)])
    blocks = ties.numel() // 63 + 1
    t = torch.zeros(blocks, 64)
    t[:, 0] = 1.0  # absmax 1 in every block so the values are their own scaled values
    vals = torch.zeros(blocks * 63)
    vals[: ties.numel()] = ties
    t[:, 1:] = vals.reshape(blocks, 63)
    c["codebook_ties"] = t
    # an absmax set whose mean-offset version hits the dynamic map's zero and sign boundaries
    a = torch.ones(300, 64) * 1e-3
    a[:, 0] = torch.linspace(0.001, 2.0, 300)
    c["absmax_spread_300x64"] = a
    c["const_8x64"] = torch.full((8, 64), 0.125)
    return c


def record(name, x, dtype, device, out):
    a = x.to(dtype).to(device)
    packed, qs = F.quantize_4bit(a, blocksize=64, compress_statistics=True, quant_type="nf4")
    _, qs_plain = F.quantize_4bit(a, blocksize=64, compress_statistics=False, quant_type="nf4")
    deq = F.dequantize_4bit(packed, qs)
    qs.dtype = torch.float32
    deq32 = F.dequantize_4bit(packed, qs)
    out[f"{name}.input"] = a.cpu().contiguous()
    out[f"{name}.packed"] = packed.cpu().reshape(-1).contiguous()
    out[f"{name}.absmax"] = qs_plain.absmax.cpu().float().contiguous()
    out[f"{name}.absmax_codes"] = qs.absmax.cpu().contiguous()
    out[f"{name}.absmax2"] = qs.state2.absmax.cpu().float().contiguous()
    out[f"{name}.offset"] = qs.offset.reshape(1).cpu().float()
    out[f"{name}.dequant"] = deq.cpu().contiguous()
    out[f"{name}.dequant_f32"] = deq32.cpu().contiguous()
    if "dynamic_map" not in out:
        out["dynamic_map"] = qs.state2.code.cpu().float().contiguous()
        out["nf4_code"] = qs.code.cpu().float().contiguous()
    assert qs.state2.blocksize == 256, qs.state2.blocksize


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: the golden file must come from bitsandbytes' CUDA kernels")
    gen = torch.Generator().manual_seed(20261122)
    out = {}
    for name, x in cases(gen).items():
        record(name, x, torch.float16, args.device, out)
    # the kernels convert every input to f32 first; bf16 and f32 inputs check that path
    record("bf16_normal_64x128", torch.randn(64, 128, generator=gen) * 0.05, torch.bfloat16, args.device, out)
    record("f32_normal_len777", torch.randn(777, generator=gen), torch.float32, args.device, out)
    meta = {
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "bitsandbytes": bnb.__version__,
        "torch": torch.__version__,
        "cases": json.dumps(sorted({k.split(".")[0] for k in out if "." in k})),
    }
    save_file(out, args.out, metadata=meta)
    print(f"wrote {len(out)} tensors to {args.out}: {meta}")


if __name__ == "__main__":
    main()
