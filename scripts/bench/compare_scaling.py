"""The table of scripts/device/scaling.sh: lora-ft's tokens/s on 1, 2, 4, 8 GPUs of one host from each
run's metrics.jsonl (rank 0's; `tokens` is the step's global count), the speedup over one GPU and its
efficiency, and issue 20's deliver-5 targets (4 GPUs >= 3.7x, 8 GPUs >= 7.2x at 2048 x 4 per GPU).
Two rates per run: the mean (the timed steps' tokens over their time, one-off stalls included: a
kernel compiled for the machine's first run, a new shape's cuDNN graphs) and the steady one (the
median step's tokens/s). A stall in the one-GPU run alone makes the mean's speedup look better than
it is, so each target is judged on the smaller of the two speedups.

  python3 scripts/bench/compare_scaling.py --arch A --seq 2048 --batch 4 --warmup 4 1:m1.jsonl 4:m4.jsonl
"""
import argparse
import json
import os

TARGETS = {4: 3.7, 8: 7.2}


def read_steps(path):
    """step -> the metrics record of that step (a later line of a step wins)."""
    steps = {}
    if not os.path.exists(path):
        return steps
    for line in open(path):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r.get("step"), int) and "tokens" in r and "elapsed_s" in r:
            steps[r["step"]] = r
    return steps


def rate(steps, warmup):
    """(tokens/s over the steps after `warmup`, their count): their tokens over the time from the
    end of step `warmup` to the end of the last step."""
    timed = [s for s in sorted(steps) if s > warmup]
    if not timed or warmup not in steps:
        return None, 0
    seconds = steps[timed[-1]]["elapsed_s"] - steps[warmup]["elapsed_s"]
    tokens = sum(steps[s]["tokens"] for s in timed)
    return (tokens / seconds if seconds > 0 else None), len(timed)


def steady(steps, warmup):
    """The median of the timed steps' own tokens/s (None without any)."""
    rates = sorted(steps[s]["tokens_per_s"] for s in steps if s > warmup and "tokens_per_s" in steps[s])
    if not rates:
        return None
    mid = len(rates) // 2
    return rates[mid] if len(rates) % 2 else (rates[mid - 1] + rates[mid]) / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="?")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("runs", nargs="+", help="GPUS:metrics.jsonl")
    args = ap.parse_args()
    rows = []
    for run in args.runs:
        n, path = run.split(":", 1)
        steps = read_steps(path)
        tok_s, timed = rate(steps, args.warmup)
        losses = [steps[s]["loss"] for s in sorted(steps)]
        rows.append((int(n), tok_s, steady(steps, args.warmup), timed, losses))
    one = next((r[1] for r in rows if r[0] == 1 and r[1]), None)
    one_steady = next((r[2] for r in rows if r[0] == 1 and r[2]), None)
    print(f"{args.arch}: {args.seq} x {args.batch} per GPU (global batch {args.batch} x GPUs), data-parallel over "
          f"NCCL, tokens/s of the steps after the first {args.warmup}\n")
    print("| GPUs | tok/s (mean) | speedup | efficiency | tok/s (median step) | speedup | efficiency "
          "| timed steps | first / last loss |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    checks = []
    for n, tok_s, median, timed, losses in sorted(rows):
        by_mean = tok_s / one if (tok_s and one) else None
        by_median = median / one_steady if (median and one_steady) else None
        speed = min(by_mean, by_median) if (by_mean and by_median) else None
        loss = f"{losses[0]:.4f} / {losses[-1]:.4f}" if losses else "-"

        def cells(r, x):
            return (f"{f'{r:,.0f}' if r else 'failed'} | {f'{x:.2f}x' if x else '-'} | "
                    f"{f'{100 * x / n:.0f}%' if x else '-'}")
        print(f"| {n} | {cells(tok_s, by_mean)} | {cells(median, by_median)} | {timed} | {loss} |")
        if n in TARGETS:
            want = TARGETS[n]
            checks.append(f"{n} GPUs {speed:.2f}x (>= {want}) {'✓' if speed >= want else '✗'}" if speed
                          else f"{n} GPUs not measured")
    if checks:
        print("\nIssue 20's deliver-5 targets: " + "; ".join(checks))


if __name__ == "__main__":
    main()
