#!/usr/bin/env python3
"""Where a decode step's GPU time goes, from Nsight Compute's raw CSV (one row per kernel):
each kernel name's launches and microseconds per step, largest first, with its share.
  python3 scripts/bench/ncu_kernels.py FILE.csv --steps N [--label TEXT] [--top 40]
The step count defaults to the launches of a kernel that runs once a step (the embedding gather).
FILE.csv: `ncu --csv --page raw --metrics gpu__time_duration.sum --log-file FILE.csv ...` over the
decode steps alone (`LORA_FT_PROFILE_RANGE=1` and `--profile-from-start off`)."""
import argparse, csv, io, json, re, sys
from collections import defaultdict

def rows(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if '"Kernel Name"' in l)
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = next(reader)
    name_i, time_i = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    units = next(reader)[time_i]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
             "s": 1e6, "second": 1e6}.get(units.strip(), 1e-3)   # ncu's default unit is ns
    for r in reader:
        if len(r) > time_i and r[time_i].replace(",", "").replace(".", "").isdigit():
            yield r[name_i], float(r[time_i].replace(",", "")) * scale

def short(name):
    name = re.sub(r"\(.*", "", name)           # arguments
    name = re.sub(r"<.*>", "<…>", name)        # template arguments
    return name.split("::")[-1][:70]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv"); ap.add_argument("--steps", type=int, default=0,
                    help="decode steps in the range (default: launches of --step-kernel)")
    ap.add_argument("--step-kernel", default="embedding_gather", help="a kernel launched once a step")
    ap.add_argument("--label", default=""); ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    calls, us = defaultdict(int), defaultdict(float)
    for name, t in rows(a.csv):
        calls[short(name)] += 1; us[short(name)] += t
    a.steps = a.steps or calls.get(a.step_kernel, 0)
    total = sum(us.values())
    if not a.steps:
        sys.exit(f"no launches of {a.step_kernel} in {a.csv}: pass --steps")
    if not total:
        sys.exit(f"no kernels in {a.csv}")
    print(f"## {a.label} — {sum(calls.values()) / a.steps:.0f} kernels and {total / a.steps:.0f} µs of GPU time a step ({a.steps} steps)\n")
    print("| kernel | launches/step | µs/step | share | µs/launch |\n| --- | ---: | ---: | ---: | ---: |")
    for k in sorted(us, key=us.get, reverse=True)[: a.top]:
        print(f"| `{k}` | {calls[k] / a.steps:.0f} | {us[k] / a.steps:.1f} | {100 * us[k] / total:.1f}% | {us[k] / calls[k]:.2f} |")
    print(json.dumps({"label": a.label, "kernels_per_step": sum(calls.values()) / a.steps,
                      "gpu_us_per_step": total / a.steps,
                      "by_kernel_us_per_step": {k: round(us[k] / a.steps, 1) for k in sorted(us, key=us.get, reverse=True)}}),
          file=open(a.csv.rsplit(".", 1)[0] + ".json", "w"))

if __name__ == "__main__":
    main()
