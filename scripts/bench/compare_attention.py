"""Side-by-side table of `lora-ft bench attention` against scripts/bench/attention_ref.py (JSON lines).

  python3 scripts/bench/compare_attention.py REF.jsonl LORA_FT.jsonl
"""
import json
import sys


def rows(path):
    with open(path) as f:
        return {(r["seq"], r["bs"]): r for r in map(json.loads, (l for l in f if l.startswith("{")))}


ref, ours = rows(sys.argv[1]), rows(sys.argv[2])
print("| seq x batch | SDPA fwd ms | lora-ft fwd ms | speed-up | SDPA bwd ms | lora-ft bwd ms | speed-up "
      "| lora-ft fwd / bwd TFLOP/s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for key in sorted(ours):
    o, r = ours[key], ref.get(key)
    if r is None:
        continue
    print(f"| {key[0]}x{key[1]} | {r['fwd_ms']:.2f} | {o['fwd_ms']:.2f} | {r['fwd_ms'] / o['fwd_ms']:.2f} "
          f"| {r['bwd_ms']:.2f} | {o['bwd_ms']:.2f} | {r['bwd_ms'] / o['bwd_ms']:.2f} "
          f"| {o['fwd_tflops']:.0f} / {o['bwd_tflops']:.0f} |")
