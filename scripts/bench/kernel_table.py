#!/usr/bin/env python3
"""Nsight Compute's per-kernel durations (scripts/device/kernel_times.sh: `ncu --metrics
gpu__time_duration.sum --csv`) as a table per training step: each kernel's ms and launches per step
and its share of the step, largest first, then the step's time by kind. The model load's
quantization kernels run once, before the steps: they are summed apart and left out of the step.

    kernel_table.py NCU_CSV [--steps 4]     (bench train: 2 warm-up + 2 timed steps)
"""
import argparse
import collections
import csv
import re

# run once at load: the NF4 quantization and its double quantization (src/cuda/nf4.cu)
LOAD = ("nf4_absmax", "nf4_pack", "dq_codes", "dq_absmax2")
# a step's kernels by kind, first match wins
KINDS = [
    ("GEMMs (cuBLAS)", r"nvjet|gemm|splitKreduce|cutlass"),
    ("NF4 dequantization", r"nf4_dequantize"),
    ("attention (cuDNN or own)", r"cudnn|sdpa|flash|fmha|attention"),
    ("gated MLP", r"gated"),
    ("RMSNorm", r"rms_norm"),
    ("loss", r"softmax|cross_entropy|target_logit|streamed_finish|rescale_add|logit"),
    ("RoPE", r"rope"),
    ("optimizer", r"adafactor|adamw"),
]


def kind(name):
    return next((k for k, pattern in KINDS if re.search(pattern, name)), "other")


def table(path, steps):
    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    head, rows = rows[0], rows[1:]
    ix = {k: i for i, k in enumerate(head)}
    tot, n = collections.Counter(), collections.Counter()
    for r in rows:
        if r[ix["Metric Name"]] != "gpu__time_duration.sum":
            continue
        name = re.sub(r"\(.*", "", r[ix["Kernel Name"]])[:90]
        tot[name] += float(r[ix["Metric Value"]].replace(",", "")) * 1e-6  # ns -> ms
        n[name] += 1
    load = {k: v for k, v in tot.items() if k.startswith(LOAD)}
    step = {k: v for k, v in tot.items() if k not in load}
    step_ms = sum(step.values()) / steps
    out = [f"{sum(n.values())} kernels, {sum(tot.values()):.1f} ms in all: the load's quantization "
           f"{sum(load.values()):.1f} ms ({sum(n[k] for k in load)} launches), the {steps} steps "
           f"{step_ms * steps:.1f} ms, {step_ms:.1f} ms a step.", "",
           "| kernel | ms/step | launches/step | share of the step |", "|---|---:|---:|---:|"]
    for k, v in sorted(step.items(), key=lambda kv: -kv[1])[:50]:
        out.append(f"| `{k}` | {v / steps:.2f} | {n[k] / steps:g} | {v / steps / step_ms:.1%} |")
    by_kind = collections.Counter()
    for k, v in step.items():
        by_kind[kind(k)] += v / steps
    out += ["", "| kind | ms/step | share of the step |", "|---|---:|---:|"]
    for k, v in by_kind.most_common():
        out.append(f"| {k} | {v:.2f} | {v / step_ms:.1%} |")
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    print(table(args.csv, args.steps))
