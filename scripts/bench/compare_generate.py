#!/usr/bin/env python3
"""The table of the generation benchmark (scripts/device/bench_generate.sh): per batch size,
lora-ft's tokens/s (end to end, prefill included; and its decode steps alone), its step time,
the bytes a step reads and its share of the GPU's memory-bandwidth limit (those bytes at the
GPU's peak bandwidth: the fastest a step can be), beside transformers + PEFT + bitsandbytes
`generate` measured in the same command, and the ratio; with --llamacpp, llama.cpp's
llama-batched-bench rows too (scripts/device/bench_llamacpp.sh: Q4_K_M + the adapter at run time),
end to end and decode alone, lora-ft's ratio to it and the device buffers it allocated; then the
time to the first token, and where given lora-ft's decode steps launched kernel by kernel
(--enforce-eager) beside the steps replayed from CUDA graphs.

    compare_generate.py LORA_FT.jsonl REFERENCE.jsonl --gpu NAME [--arch NAME] [--llamacpp LLAMACPP.jsonl]
                        [--eager EAGER.jsonl]
"""
import argparse
import json


def fmt(v, spec=".0f"):
    return "—" if v is None else format(v, spec)

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("ours")
ap.add_argument("reference")
ap.add_argument("--gpu", default="")
ap.add_argument("--arch", default="")
ap.add_argument("--eager", help="lora-ft's rows run with --enforce-eager")
ap.add_argument("--llamacpp", help="llama.cpp's rows (scripts/bench/llamacpp_generate.py rows)")
args = ap.parse_args()

# peak memory bandwidth, bytes/s (the SXM parts' datasheets)
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.04e12}
bandwidth = next((b for name, b in BANDWIDTH.items() if name in args.gpu), None)


def rows(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


ours, ref = rows(args.ours), rows(args.reference)
by_batch = {r["batch"]: r for r in ref if "batch" in r}
stack = next((r for r in ref if "stack" in r), {})
llama = rows(args.llamacpp) if args.llamacpp else None
llama_by_batch = {r["batch"]: r for r in llama or [] if "batch" in r}
llama_stack = next((r for r in llama or [] if "stack" in r), {})
title = stack.get("stack", "reference") + (" and llama.cpp" if llama is not None else "")
print(f"## {args.arch} on {args.gpu or 'an unnamed device'}: lora-ft engine vs {title}")
if stack.get("versions"):
    print("\nreference versions: " + ", ".join(f"{k} {v}" for k, v in stack["versions"].items()))
if llama_stack:
    print(f"\nllama.cpp: {llama_stack.get('versions', {}).get('llama.cpp', '?')}, Q4_K_M "
          f"({fmt(llama_stack.get('bits_per_weight'), '.2f')} bits/weight over the whole file), the adapter "
          f"applied at run time (--lora), flash attention on; build {fmt(llama_stack.get('build_s'), '.0f')} s "
          "(0: binaries carried or already built)")
extra_head = " llama.cpp tok/s | llama.cpp decode tok/s | lora-ft / llama.cpp | llama.cpp GiB |" if llama is not None else ""
print("\n| batch | lora-ft tok/s | decode tok/s | step ms | GB read/step | share of bandwidth limit | "
      "reference tok/s | lora-ft / reference | lora-ft peak GiB | reference peak GiB |" + extra_head)
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" * 4 if llama is not None else ""))


for r in ours:
    if "batch" not in r:
        continue
    b = r["batch"]
    other = by_batch.get(b, {})
    step_bytes = r.get("weight_bytes_per_step", 0) + r.get("kv_bytes_per_step", 0)
    share = None
    if bandwidth and r.get("step_ms"):
        share = (step_bytes / bandwidth) / (r["step_ms"] / 1e3)
    ratio = None
    if r.get("tokens_per_s") and other.get("tokens_per_s"):
        ratio = r["tokens_per_s"] / other["tokens_per_s"]
    note = r.get("error") or ""
    ref_cell = fmt(other.get("tokens_per_s"), ".1f") if other.get("tokens_per_s") else (other.get("error") or "—")
    extra = ""
    if llama is not None:
        lc = llama_by_batch.get(b, {})
        lc_ratio = r["tokens_per_s"] / lc["tokens_per_s"] if r.get("tokens_per_s") and lc.get("tokens_per_s") else None
        lc_cell = fmt(lc.get("tokens_per_s"), ".1f") if lc.get("tokens_per_s") else (lc.get("error") or "—")
        extra = (f" {lc_cell} | {fmt(lc.get('decode_tokens_per_s'), '.1f')} | {fmt(lc_ratio, '.2f')}× | "
                 f"{fmt(lc.get('peak_alloc_gib'), '.2f')} |")
    print(f"| {b} | {fmt(r.get('tokens_per_s'), '.1f')} | {fmt(r.get('decode_tokens_per_s'), '.1f')} | "
          f"{fmt(r.get('step_ms'), '.2f')} | {step_bytes / 1e9:.2f} | {fmt(share and 100 * share, '.0f')}% | "
          f"{ref_cell} | {fmt(ratio, '.2f')}× | {fmt(r.get('peak_alloc_gib'), '.2f')} | "
          f"{fmt(other.get('peak_alloc_gib'), '.2f')} |" + extra + (f" {note}" if note else ""))
ttft = next((r for r in ours if "ttft_ms" in r), None)
ref_ttft = next((r for r in ref if "ttft_ms" in r), None)
llama_ttft = next((r for r in llama or [] if "ttft_ms" in r), None)
if ttft:
    also = (f", llama.cpp {fmt(llama_ttft and llama_ttft.get('ttft_ms'), '.1f')} ms"
            + ("" if not llama_ttft or llama_ttft["ttft_prompt"] == ttft["ttft_prompt"]
               else f" (a {llama_ttft['ttft_prompt']}-token prompt)")) if llama is not None else ""
    print(f"\nTime to first token, one {ttft['ttft_prompt']}-token prompt: lora-ft {fmt(ttft.get('ttft_ms'), '.1f')} ms, "
          f"reference {fmt(ref_ttft and ref_ttft.get('ttft_ms'), '.1f')} ms{also}.")
if bandwidth:
    print(f"\nBandwidth limit: the step's bytes (weights as stored, the adapter, lm_head, the KV cache at the "
          f"mean length) at {bandwidth / 1e12:.2f} TB/s.")
if args.eager:
    eager = {r["batch"]: r for r in rows(args.eager) if "batch" in r}
    graphs = {r["batch"]: r for r in ours if "batch" in r}
    print("\nCUDA graphs: lora-ft's decode steps replayed from recorded graphs against the same steps "
          "launched kernel by kernel (--enforce-eager).\n")
    print("| batch | graphs step ms | eager step ms | graphs decode tok/s | eager decode tok/s | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b, e in sorted(eager.items()):
        g = graphs.get(b, {})
        speedup = (e["step_ms"] / g["step_ms"]) if g.get("step_ms") and e.get("step_ms") else None
        print(f"| {b} | {fmt(g.get('step_ms'), '.2f')} | {fmt(e.get('step_ms'), '.2f')} | "
              f"{fmt(g.get('decode_tokens_per_s'), '.1f')} | {fmt(e.get('decode_tokens_per_s'), '.1f')} | "
              f"{fmt(speedup, '.2f')}× |")
