"""Golden learning rates for src/optim/schedule.rs, from transformers' schedulers.

Drives each scheduler the way HF's Trainer does (optimizer.step(); scheduler.step()) and records
the lr used by optimizer step k (k = 0, 1, ...), i.e. base_lr * lambda(k) with k = the number of
optimizer steps already taken. Runs past total_steps to pin the behaviour after the end.

Writes tests/golden/schedule.json.
Run: /work/venv/bin/python scripts/golden/schedule_golden.py
"""

import json
from pathlib import Path

import torch
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "schedule.json"
BASE_LR = 2e-4
STEPS = 34  # beyond total_steps below


def record(kind, warmup, total):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
    if kind == "cosine":
        sched = get_cosine_schedule_with_warmup(opt, warmup, total)
    elif kind == "linear":
        sched = get_linear_schedule_with_warmup(opt, warmup, total)
    else:
        sched = get_constant_schedule_with_warmup(opt, warmup)
    lrs = []
    for _ in range(STEPS):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def main():
    cases = []
    for kind in ["cosine", "linear", "constant"]:
        for warmup, total in [(0, 30), (5, 30), (3, 7), (30, 30), (1, 1)]:
            cases.append(
                {"kind": kind, "base_lr": BASE_LR, "warmup_steps": warmup, "total_steps": total,
                 "lrs": record(kind, warmup, total)}
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
