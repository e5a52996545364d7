#!/usr/bin/env python3
"""Sets lora-ft's metrics.jsonl beside the reference replay's (peft_replay.py): eval loss at each
evaluation and train loss at each step, with relative differences. Exits 1 when an eval loss
differs by more than --tolerance (issue 4: 2%).

    python3 compare.py RUN_DIR/metrics.jsonl peft_metrics.jsonl [--tolerance 0.02]
"""
import argparse
import json
import sys


def read(path):
    train, evals = {}, {}
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "eval_loss" in r:
            evals[r["step"]] = r["eval_loss"]
        elif "loss" in r:
            train[r["step"]] = r["loss"]
    return train, evals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("reference")
    ap.add_argument("--tolerance", type=float, default=0.02)
    args = ap.parse_args()
    (our_train, our_eval), (ref_train, ref_eval) = read(args.ours), read(args.reference)
    steps = sorted(set(our_eval) & set(ref_eval))
    if not steps:
        sys.exit("no evaluation step in common")
    print("| step | PEFT eval loss | lora-ft eval loss | relative difference |")
    print("|---:|---:|---:|---:|")
    worst = 0.0
    for s in steps:
        rel = abs(our_eval[s] - ref_eval[s]) / abs(ref_eval[s])
        worst = max(worst, rel)
        print(f"| {s} | {ref_eval[s]:.4f} | {our_eval[s]:.4f} | {100 * rel:.2f}% |")
    common = sorted(set(our_train) & set(ref_train))
    train_rel = [abs(our_train[s] - ref_train[s]) / abs(ref_train[s]) for s in common]
    mean_train = sum(train_rel) / max(len(train_rel), 1)
    print(f"\neval: {len(steps)} evaluations, largest relative difference {100 * worst:.2f}% "
          f"(tolerance {100 * args.tolerance:.1f}%)")
    if common:
        print(f"train loss: {len(common)} steps, mean relative difference {100 * mean_train:.2f}%, "
              f"largest {100 * max(train_rel):.2f}%; last step {common[-1]}: PEFT "
              f"{ref_train[common[-1]]:.4f}, lora-ft {our_train[common[-1]]:.4f}")
    sys.exit(0 if worst <= args.tolerance else 1)


if __name__ == "__main__":
    main()
