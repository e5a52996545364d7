#!/usr/bin/env python3
"""Reads `lora-ft bench train` rows run with LORA_FT_TIMELINE=1 (src/profile.rs `timeline`) and
prints where the last step's GPU time went, region by region: the GPU's time from the previous
mark, the host's, and the lag (GPU clock minus host clock at the mark: near 0 means the GPU had
caught up with the host there, so the host was the bottleneck). Regions of the same kind
(forward of a kept layer, of an offloaded one, of the layer after an offloaded one, backward...)
are summed.
    python3 scripts/bench/timeline.py ROWS.jsonl [--all]
"""
import collections
import json
import re
import sys


def kind(name, prev_offloaded):
    if name.startswith("forward") or name.startswith("backward"):
        what, k = name.split()[0], name.split()[-1]
        after = prev_offloaded and k != "Offloaded" and what == "forward"
        return f"{what}, {k}" + (" (after an offloaded one)" if after else "")
    return re.sub(r" \d+$", "", name)


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
    for row in rows:
        marks = row.get("timeline")
        if not marks:
            continue
        print(f"## {row['seq']} x {row['bs']}: step {row['step_s'] * 1e3:.1f} ms (timed steps)\n")
        # the steps: each from its `step` mark (device idle) to its last mark; between one's last
        # mark and the next one's `step called`, the host alone; then the wait for the device
        starts = [i for i, m in enumerate(marks) if m[0] == "step"]
        print("| step | GPU ms, start to last mark | host ms after it, before the next call | wait for the device ms | period ms |")
        print("|---:|---:|---:|---:|---:|")
        for n, i in enumerate(starts):
            end = (starts[n + 1] - 1 if n + 1 < len(starts) else len(marks)) - 1  # before `step called`
            span = marks[end][1] - marks[i][1]
            if n + 1 < len(starts):
                called = marks[starts[n + 1] - 1]
                outside, wait = called[2] - marks[end][2], marks[starts[n + 1]][2] - called[2]
                period = marks[starts[n + 1]][2] - marks[i][2]
                print(f"| {n} | {span:.2f} | {outside:.2f} | {wait:.2f} | {period:.2f} |")
            else:
                print(f"| {n} | {span:.2f} | | | |")
        print()
        marks = marks[starts[-1]:]
        sums = collections.OrderedDict()
        prev_offloaded = False
        detail = []
        for (name, g, h), (_, g0, h0) in zip(marks[1:], marks[:-1]):
            k = kind(name, prev_offloaded)
            prev_offloaded = name.endswith("Offloaded")
            s = sums.setdefault(k, [0, 0.0, 0.0, float("inf")])
            s[0] += 1
            s[1] += g - g0
            s[2] += h - h0
            s[3] = min(s[3], g - h)
            detail.append((name, g - g0, h - h0, g - h))
        print("| region | count | GPU ms | GPU ms each | host ms | least lag ms |\n|---|---:|---:|---:|---:|---:|")
        for k, (n, g, h, lag) in sums.items():
            print(f"| {k} | {n} | {g:.2f} | {g / n:.3f} | {h:.2f} | {lag:.2f} |")
        if "--all" in sys.argv:
            print("\n| mark | GPU ms | host ms | lag ms |\n|---|---:|---:|---:|")
            for name, g, h, lag in detail:
                print(f"| {name} | {g:.3f} | {h:.3f} | {lag:.2f} |")
        print()


if __name__ == "__main__":
    main()
