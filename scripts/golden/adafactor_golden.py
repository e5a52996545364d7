"""Golden values for src/optim/adafactor.rs.

Runs torch.optim.Adafactor and transformers.optimization.Adafactor on CPU for STEPS steps with
fixed gradients, on a small set of parameters covering every shape class the optimizer handles
differently: 2-D matrices (factored), a 3-D tensor (factored over the last two dims), a vector
and a 0-dim scalar (not factored). Each config runs in float32 (the training dtype) and float64
(so that tiny updates such as hf's warmup_init, about 1e-6 of the parameter, are checked to many
digits instead of drowning in float32 rounding).

Writes tests/golden/adafactor.safetensors:
  init.<dtype>.<param>, grad.<step>.<dtype>.<param>
  <config>.<dtype>.step<k>.<param>          params after step k (k = 1..STEPS)
  <config>.<dtype>.state.<param>.<name>     optimizer state after the last step
and tests/golden/adafactor.json: the configs (as the Rust side's AdafactorSection), the per-step
lrs passed to the optimizer and the parameter names.

Run: /work/venv/bin/python scripts/golden/adafactor_golden.py
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers.optimization import Adafactor as HfAdafactor

STEPS = 5
SHAPES = {"w1": [6, 10], "b": [7], "w2": [10, 3], "w3": [2, 3, 4], "s": []}
OUT = Path(__file__).resolve().parents[2] / "tests" / "golden"

# Each config: the Rust-side AdafactorSection fields, the weight decay and the lr passed per step.
CONFIGS = {
    "torch_default": dict(
        section=dict(flavor="torch", decay_rate=-0.8, eps1=None, eps2=1e-3, clip_threshold=1.0),
        weight_decay=0.0,
        lrs=[1e-2] * STEPS,
    ),
    # lr varies per step (a schedule); 0.9 and 0.6 exceed 1/sqrt(t) at t = 2 and 4, so rho_t takes
    # both branches of min(lr, 1/sqrt(t)).
    "torch_wd_schedule": dict(
        section=dict(flavor="torch", decay_rate=-0.8, eps1=None, eps2=1e-3, clip_threshold=1.0),
        weight_decay=0.1,
        lrs=[0.02, 0.9, 0.4, 0.6, 0.1],
    ),
    "torch_eps_d": dict(
        section=dict(flavor="torch", decay_rate=-0.5, eps1=1e-3, eps2=1e-2, clip_threshold=2.0),
        weight_decay=0.0,
        lrs=[0.3] * STEPS,
    ),
    "hf_relative_warmup": dict(
        section=dict(
            flavor="hf", decay_rate=-0.8, eps1=1e-30, eps2=1e-3, clip_threshold=1.0,
            relative_step=True, scale_parameter=True, warmup_init=True,
        ),
        weight_decay=0.0,
        lrs=[1e-2] * STEPS,  # ignored with relative_step
    ),
    "hf_relative_scaled_wd": dict(
        section=dict(
            flavor="hf", decay_rate=-0.8, eps1=1e-30, eps2=1e-3, clip_threshold=1.0,
            relative_step=True, scale_parameter=True, warmup_init=False,
        ),
        weight_decay=0.05,
        lrs=[1e-2] * STEPS,
    ),
    "hf_beta1_fixed_lr": dict(
        section=dict(
            flavor="hf", decay_rate=-0.8, eps1=1e-30, eps2=1e-3, clip_threshold=1.0, beta1=0.9,
            relative_step=False, scale_parameter=False, warmup_init=False,
        ),
        weight_decay=0.1,
        lrs=[1e-2] * STEPS,
    ),
    # A schedule-varying lr scaled by the parameter RMS, and a tighter clip that actually bites.
    "hf_scaled_lr_clip": dict(
        section=dict(
            flavor="hf", decay_rate=-0.6, eps1=1e-20, eps2=1e-2, clip_threshold=0.5, beta1=0.5,
            relative_step=False, scale_parameter=True, warmup_init=False,
        ),
        weight_decay=0.0,
        lrs=[0.1, 0.2, 0.3, 0.2, 0.1],
    ),
}


def make_optimizer(params, section, weight_decay, lr):
    if section["flavor"] == "torch":
        return torch.optim.Adafactor(
            params, lr=lr, beta2_decay=section["decay_rate"], eps=(section["eps1"], section["eps2"]),
            d=section["clip_threshold"], weight_decay=weight_decay,
        )
    return HfAdafactor(
        params, lr=None if section["relative_step"] else lr,
        eps=(section["eps1"], section["eps2"]), clip_threshold=section["clip_threshold"],
        decay_rate=section["decay_rate"], beta1=section.get("beta1"), weight_decay=weight_decay,
        scale_parameter=section["scale_parameter"], relative_step=section["relative_step"],
        warmup_init=section["warmup_init"],
    )


def state_entries(state):
    """Optimizer state under the Rust side's names (row/col in keepdim layout)."""
    out = {}
    if "row_var" in state:  # torch: already keepdim
        out["row"], out["col"] = state["row_var"], state["col_var"]
    if "variance" in state:
        out["sq"] = state["variance"]
    if "exp_avg_sq_row" in state:  # hf: row [..., n], col [..., m]
        out["row"] = state["exp_avg_sq_row"].unsqueeze(-1)
        out["col"] = state["exp_avg_sq_col"].unsqueeze(-2)
    if "exp_avg_sq" in state:
        out["sq"] = state["exp_avg_sq"]
    if "exp_avg" in state:
        out["exp_avg"] = state["exp_avg"]
    return out


def main():
    gen = torch.Generator().manual_seed(1234)
    init = {n: torch.randn(s, generator=gen, dtype=torch.float64) for n, s in SHAPES.items()}
    # Gradients of varying scale per step, so that clipping and the decay schedule matter.
    grads = [
        {n: torch.randn(s, generator=gen, dtype=torch.float64) * (0.1 + 2.0 * k) for n, s in SHAPES.items()}
        for k in range(STEPS)
    ]
    tensors = {}
    for dname, dtype in [("f32", torch.float32), ("f64", torch.float64)]:
        for n in SHAPES:
            tensors[f"init.{dname}.{n}"] = init[n].to(dtype)
            for k in range(STEPS):
                tensors[f"grad.{k + 1}.{dname}.{n}"] = grads[k][n].to(dtype)
        for cname, cfg in CONFIGS.items():
            params = [init[n].to(dtype).clone().requires_grad_(True) for n in SHAPES]
            opt = make_optimizer(params, cfg["section"], cfg["weight_decay"], cfg["lrs"][0])
            for k in range(STEPS):
                for group in opt.param_groups:
                    if group["lr"] is not None:
                        group["lr"] = cfg["lrs"][k]
                for p, n in zip(params, SHAPES):
                    p.grad = tensors[f"grad.{k + 1}.{dname}.{n}"].clone()
                opt.step()
                for p, n in zip(params, SHAPES):
                    tensors[f"{cname}.{dname}.step{k + 1}.{n}"] = p.detach().clone()
            for p, n in zip(params, SHAPES):
                for sname, t in state_entries(opt.state[p]).items():
                    tensors[f"{cname}.{dname}.state.{n}.{sname}"] = t.detach().clone().to(dtype)
    OUT.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(OUT / "adafactor.safetensors"))
    meta = {"steps": STEPS, "params": list(SHAPES), "configs": CONFIGS}
    (OUT / "adafactor.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
