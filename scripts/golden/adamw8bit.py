"""Golden values for src/optim/adamw8bit.rs: bitsandbytes' AdamW8bit on CUDA.

bnb.optim.AdamW8bit (blockwise 8-bit state, min_8bit_size 4096) takes STEPS steps with fixed
gradients on parameters chosen to cover its cases: a matrix with a partial last 256-block, one of
exactly min_8bit_size elements (LoRA's A at r=16, hidden 256), and one below min_8bit_size
(32-bit state, bitsandbytes' 32-bit Adam kernel). The first 256-block of "wide" gets zero
gradients at step 1, so its state is all zero (absmax 0). Two configs: no weight decay, and
AdamW8bit's own default (0.01); the lr changes per step.

Writes tests/golden/adamw8bit.safetensors:
  init.<param>, grad.<step>.<param>                      f32
  qmap1, qmap2                                           the signed and unsigned dynamic maps
  <config>.step<k>.<param>                               params after step k
  <config>.step<k>.<param>.state1|state2|absmax1|absmax2 8-bit state (u8 codes, f32 absmax), or
  <config>.step<k>.<param>.exp_avg|exp_avg_sq            32-bit state
and tests/golden/adamw8bit.json (configs, parameter names, device, bitsandbytes and torch versions).

The authoritative file comes from the GPU (bitsandbytes' CUDA kernels):
    python3 scripts/golden/adamw8bit.py --out tests/golden/adamw8bit.safetensors
bitsandbytes' CPU backend computes a different formula (weight decay before the update, another
rounding of codes), so there is no CPU run; the Rust test insists on device "cuda".
"""
import argparse
import json

import torch
import bitsandbytes as bnb
from safetensors.torch import save_file

STEPS = 4
SHAPES = {"wide": [33, 130], "lora_a": [16, 256], "small": [10, 40]}
CONFIGS = {
    "no_wd": dict(betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0, lrs=[1e-3, 2e-3, 3e-3, 1e-3]),
    "wd": dict(betas=[0.9, 0.995], eps=1e-8, weight_decay=0.01, lrs=[5e-3] * STEPS),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden/adamw8bit.safetensors")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "bitsandbytes' 8-bit optimizer golden needs its CUDA kernels"
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(8)
    init = {n: torch.randn(s, generator=gen) * 0.05 for n, s in SHAPES.items()}
    grads = []
    for k in range(STEPS):
        step = {}
        for n, s in SHAPES.items():
            # magnitudes over several decades, so the codes spread over the maps
            scale = torch.exp(torch.randn(s, generator=gen) * 1.5) * 1e-3
            step[n] = torch.randn(s, generator=gen) * scale
        if k == 0:
            step["wide"].view(-1)[:256] = 0.0
        grads.append(step)
    out = {f"init.{n}": t.contiguous() for n, t in init.items()}
    for k, step in enumerate(grads, 1):
        out.update({f"grad.{k}.{n}": t.contiguous() for n, t in step.items()})
    for name, c in CONFIGS.items():
        params = [init[n].clone().to(dev).requires_grad_(True) for n in SHAPES]
        opt = bnb.optim.AdamW8bit(params, lr=c["lrs"][0], betas=tuple(c["betas"]), eps=c["eps"],
                                  weight_decay=c["weight_decay"])
        for k in range(STEPS):
            for group in opt.param_groups:
                group["lr"] = c["lrs"][k]
            for p, n in zip(params, SHAPES):
                p.grad = grads[k][n].to(dev).clone()
            opt.step()
            torch.cuda.synchronize()
            for p, n in zip(params, SHAPES):
                key = f"{name}.step{k + 1}.{n}"
                out[key] = p.detach().cpu().clone()
                st = opt.state[p]
                if st["state1"].dtype == torch.uint8:
                    for s in ("state1", "state2", "absmax1", "absmax2"):
                        out[f"{key}.{s}"] = st[s].detach().cpu().clone().contiguous()
                    out["qmap1"], out["qmap2"] = st["qmap1"].cpu().clone(), st["qmap2"].cpu().clone()
                else:
                    out[f"{key}.exp_avg"] = st["state1"].detach().cpu().clone().contiguous()
                    out[f"{key}.exp_avg_sq"] = st["state2"].detach().cpu().clone().contiguous()
    meta = dict(steps=STEPS, params=list(SHAPES), configs=CONFIGS, device="cuda",
                gpu=torch.cuda.get_device_name(), bitsandbytes=bnb.__version__, torch=torch.__version__)
    save_file(out, args.out)
    with open(args.out.removesuffix(".safetensors") + ".json", "w") as f:
        f.write(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {args.out}: {len(out)} tensors, bitsandbytes {bnb.__version__} on {meta['gpu']}")


if __name__ == "__main__":
    main()
