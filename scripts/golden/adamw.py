"""Golden values for src/optim/adamw.rs: torch.optim.AdamW on the CPU.

A few small parameters (a matrix, a vector, a 3-D tensor, a 0-dim scalar) take STEPS steps with
fixed gradients under several configs (weight decay on and off, a per-step lr as a schedule
gives, other betas and eps). Every config runs twice from the same f32-representable initial
values and gradients: in float32 (the training dtype) and in float64. The Rust test holds our
f32 result against the float64 run, to a small multiple of torch's own float32 error (the
distance between the two torch runs, which this file also records).

Writes tests/golden/adamw.safetensors:
  init.<param>, grad.<step>.<param>                 (f32 values, stored as f64)
  <config>.<dtype>.step<k>.<param>                  params after step k (k = 1..STEPS)
  <config>.<dtype>.state<k>.<param>.exp_avg|exp_avg_sq
and tests/golden/adamw.json: the configs (betas, eps, weight decay, lrs per step), the names.

Run (torch on the CPU): python3 scripts/golden/adamw.py
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

STEPS = 5
SHAPES = {"w1": [6, 10], "b": [7], "w3": [2, 3, 4], "s": []}
OUT = Path(__file__).resolve().parents[2] / "tests" / "golden"

CONFIGS = {
    "default": dict(betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0, lrs=[1e-2] * STEPS),
    # a warmup-then-decay lr, and decoupled weight decay large enough to matter
    "wd_schedule": dict(betas=[0.9, 0.999], eps=1e-8, weight_decay=0.1, lrs=[2e-3, 1e-2, 3e-2, 2e-2, 5e-3]),
    # other betas, and an eps that is not negligible beside sqrt(v) for the small gradients
    "betas_eps": dict(betas=[0.8, 0.95], eps=1e-3, weight_decay=0.01, lrs=[5e-2] * STEPS),
}


def main():
    gen = torch.Generator().manual_seed(20)
    init = {n: torch.randn(s, generator=gen).float().double() for n, s in SHAPES.items()}
    # gradients of mixed scales: some elements ~1e-3, so eps and sqrt(v) compete
    grads = []
    for _ in range(STEPS):
        step = {}
        for n, s in SHAPES.items():
            scale = torch.exp(torch.randn(s, generator=gen) * 2.0) * 1e-2
            step[n] = (torch.randn(s, generator=gen) * scale).float().double()
        grads.append(step)
    out = {f"init.{n}": t for n, t in init.items()}
    for k, step in enumerate(grads, 1):
        out.update({f"grad.{k}.{n}": t for n, t in step.items()})
    for name, c in CONFIGS.items():
        for dtype, dt in [(torch.float32, "f32"), (torch.float64, "f64")]:
            params = [init[n].to(dtype).clone().requires_grad_(True) for n in SHAPES]
            opt = torch.optim.AdamW(params, lr=c["lrs"][0], betas=tuple(c["betas"]), eps=c["eps"],
                                    weight_decay=c["weight_decay"], foreach=False)
            for k in range(STEPS):
                for group in opt.param_groups:
                    group["lr"] = c["lrs"][k]
                for p, n in zip(params, SHAPES):
                    p.grad = grads[k][n].to(dtype).clone()
                opt.step()
                for p, n in zip(params, SHAPES):
                    out[f"{name}.{dt}.step{k + 1}.{n}"] = p.detach().double().clone()
                    st = opt.state[p]
                    out[f"{name}.{dt}.state{k + 1}.{n}.exp_avg"] = st["exp_avg"].double().clone()
                    out[f"{name}.{dt}.state{k + 1}.{n}.exp_avg_sq"] = st["exp_avg_sq"].double().clone()
    OUT.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, str(OUT / "adamw.safetensors"))
    meta = dict(steps=STEPS, params=list(SHAPES), configs=CONFIGS, torch=torch.__version__)
    (OUT / "adamw.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {OUT / 'adamw.safetensors'} ({len(out)} tensors), torch {torch.__version__}")


if __name__ == "__main__":
    main()
