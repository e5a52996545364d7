#!/usr/bin/env python3
"""Side-by-side table of the reference stack's anchor JSON and `lora-ft bench train` JSON lines:
tokens/s, MFU (6·N FLOPs per token over 790 TFLOP/s, as `lora-ft bench train` reports it) and
peak allocated GPU memory per shape, with lora-ft / reference ratios; and, given the JSON line of
scripts/bench/first_step_ref.py, the time from process start to the end of the first step."""
import json
import os
import sys


def main(ref_path: str, ours_path: str, first_step_ref: str = ""):
    ref = json.load(open(ref_path))
    theirs = {(r["seq"], r["bs"]): r for r in ref["results"]}
    ours = {}
    for line in open(ours_path):
        if line.startswith("{"):
            r = json.loads(line)
            ours[(r["seq"], r["bs"])] = r
    print(f"{ref.get('gpu', '?')}, {ref.get('arch', '?')}, {ref.get('dtype', '?')}; reference load {ref.get('load_s')} s\n")
    print("| seq x batch | PEFT tok/s | lora-ft tok/s | speed ratio | PEFT MFU | lora-ft MFU "
          "| PEFT peak GiB | lora-ft peak GiB | memory ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(set(theirs) | set(ours)):
        t, o = theirs.get(key, {}), ours.get(key, {})
        def cell(r, k):
            return r.get(k) if r.get(k) is not None else r.get("error", "-")
        speed = o.get("tok_s") and t.get("tok_s") and o["tok_s"] / t["tok_s"]
        mem = o.get("peak_alloc_gib") and t.get("peak_alloc_gib") and o["peak_alloc_gib"] / t["peak_alloc_gib"]
        fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
        # the same FLOPs per token on both sides: the reference's MFU scales with its tokens/s
        ref_mfu = speed and o.get("mfu") and o["mfu"] / speed
        pct = lambda v: f"{100 * v:.1f}%" if v else "-"  # noqa: E731
        print(f"| {key[0]} x {key[1]} | {fmt(cell(t, 'tok_s'))} | {fmt(cell(o, 'tok_s'))} | "
              f"{fmt(speed) if speed else '-'} | {pct(ref_mfu)} | {pct(o.get('mfu'))} | {fmt(cell(t, 'peak_alloc_gib'))} | "
              f"{fmt(cell(o, 'peak_alloc_gib'))} | {fmt(mem) if mem else '-'} |")
    ours_first = next((r["first_step_s"] for r in ours.values() if r.get("first_step_s")), None)
    if first_step_ref and os.path.exists(first_step_ref) and ours_first:
        r = next(json.loads(l) for l in open(first_step_ref) if l.startswith("{"))
        print(f"\nTime to the first step ({r['seq']} x {r['bs']}, from process start): PEFT {r['first_step_s']:.1f} s "
              f"(load {r['load_s']:.1f} s), lora-ft {ours_first:.1f} s, ratio {ours_first / r['first_step_s']:.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
