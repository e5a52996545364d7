#!/usr/bin/env python3
"""Side-by-side table of the reference stack's JSON (../shared/anchors/peft_qlora_baseline.py or
scripts/bench/peft_train_ref.py) and `lora-ft bench train` JSON lines: tokens/s, their ratio,
MFU and hardware FLOP utilisation of each stack, peak allocated GPU memory and its ratio, per
shape; issue 18's targets checked under it; and, given the JSON line of
scripts/bench/first_step_ref.py, the time from process start to the end of the first step.

    compare_train.py PEFT_JSON LORA_FT_JSONL [FIRST_STEP_JSON] [--config DIR|config.json]
                     [--peer UNSLOTH_JSON]

With --peer, a second table sets lora-ft beside Unsloth (scripts/bench/unsloth_train_ref.py, the
same recipe and random model in the same command): tokens/s, their ratio, Unsloth's MFU, peaks.

With --config, the FLOPs per token come from the model's config.json (bench_models.py: MFU counts
4·N + 6·N_lora + 3·A per token, HFU 6·N + 8·N_lora + 4·A, both over 989 TFLOP/s); without it,
the table has lora-ft's own `mfu`: the same formula in rows written since 2026-11-26
(src/bench/flops.rs, beside `hfu`), 6·N over 790 TFLOP/s in earlier ones (the tables before issue 18).
"""
import argparse
import json
import os

import bench_models


def fmt(v):
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def pct(v):
    return f"{100 * v:.1f}%" if v else "-"


def cell(r, k):
    return r.get(k) if r.get(k) is not None else (r.get("error") or "-")


def kept_cell(o):
    """Layers kept whole: on the GPU, + in host memory where some were offloaded."""
    kept, off = o.get("kept_layers"), o.get("offloaded_layers") or 0
    if kept is None:
        return "-"
    return f"{kept - off} + {off}" if off else str(kept)


def read_ours(path):
    rows, errors = {}, []
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            rows[(r["seq"], r["bs"])] = r
        elif line.strip().lower().startswith(("error", "thread 'main' panicked")):
            errors.append(line.strip())
    return rows, errors


def targets(theirs, ours):
    """Issue 18's targets on the H100 at the shapes the run has."""
    out = []
    for key, floor in (((512, 8), 1.8), ((2048, 4), 1.8), ((2048, 8), 2.0)):
        t, o = theirs.get(key, {}), ours.get(key, {})
        if o.get("tok_s") and t.get("tok_s"):
            v = o["tok_s"] / t["tok_s"]
            out.append(f"speed at {key[0]} × {key[1]} {v:.2f}× (≥ {floor}) {'✓' if v >= floor else '✗'}")
        elif o.get("tok_s") and t.get("error"):
            out.append(f"speed at {key[0]} × {key[1]}: the reference failed ({t['error']})")
    t, o = theirs.get((2048, 8), {}), ours.get((2048, 8), {})
    if o.get("peak_alloc_gib") and t.get("peak_alloc_gib"):
        v = o["peak_alloc_gib"] / t["peak_alloc_gib"]
        out.append(f"memory at 2048 × 8 {v:.2f}× (≤ 0.5) {'✓' if v <= 0.5 else '✗'}")
    elif o.get("peak_alloc_gib") and t.get("error") == "OOM":
        seen = t.get("peak_alloc_gib_at_error")
        out.append("memory at 2048 × 8: the reference ran out of memory" + (f" (at {seen} GiB allocated)" if seen else ""))
    if o.get("peak_alloc_gib"):
        v = o["peak_alloc_gib"]
        out.append(f"lora-ft 8 × 2048 in {v:.2f} GiB (< 22) {'✓' if v < 22 else '✗'}")
    return out


def issue20_targets(theirs, ours, budget_gib):
    """Issue 20's targets with selective checkpointing: every shape >= 2x the reference's tokens/s,
    512 x 8 >= 3x, every peak within the budget."""
    out, slow, unmeasured = [], [], []
    for key in sorted(ours):
        t, o = theirs.get(key, {}), ours[key]
        if o.get("tok_s") and t.get("tok_s"):
            v = o["tok_s"] / t["tok_s"]
            floor = 3.0 if key == (512, 8) else 2.0
            if v < floor:
                slow.append(f"{key[0]} × {key[1]} {v:.2f}× (≥ {floor})")
        else:
            unmeasured.append(f"{key[0]} × {key[1]}")
    verdict = "✓" if not slow else "✗: " + ", ".join(slow)
    if unmeasured:
        # a shape either stack did not finish is not a pass
        verdict = ("✗: " + ", ".join(slow) + "; " if slow else "") + "not measured: " + ", ".join(unmeasured)
    out.append("every shape ≥ 2×, 512 × 8 ≥ 3× " + verdict)
    if budget_gib:
        over = [f"{k[0]} × {k[1]} {o['peak_alloc_gib']:.2f}" for k, o in sorted(ours.items())
                if o.get("peak_alloc_gib") and o["peak_alloc_gib"] > budget_gib]
        out.append(f"every peak ≤ {budget_gib:.2f} GiB " + ("✓" if not over else "✗: " + ", ".join(over)))
    return out


def peer_table(path, ours, cfg):
    """lora-ft beside the peer (Unsloth's JSON, train_ref_loop.py's format), shape by shape."""
    if not os.path.exists(path):
        return [f"(no Unsloth JSON at {path})"]
    peer = json.load(open(path))
    rows = {(r["seq"], r["bs"]): r for r in peer.get("results", [])}
    v = peer.get("versions", {})
    out = [f"Unsloth {v.get('unsloth', '?')} (unsloth_zoo {v.get('unsloth_zoo', '?')}, transformers "
           f"{v.get('transformers', '?')}, peft {v.get('peft', '?')}, bitsandbytes {v.get('bitsandbytes', '?')}): "
           f"checkpointing \"unsloth\", checkpoint_skip_layers {peer.get('checkpoint_skip', '0')}"
           + (f" within {peer['gpu_mem_gib']:g} GiB" if peer.get("gpu_mem_gib") else "")
           + ("" if peer.get("block_compile", True) else ", decoder layers uncompiled (UNSLOTH_BLOCK_COMPILE=0)")
           + f", attention {peer.get('attn', '?')}, load {peer.get('load_s')} s"
           + (f"; its first step {peer['first_step_s']} s from process start (imports, load, compiles)"
              if peer.get("first_step_s") else ""), ""]
    out.append("| seq x batch | Unsloth tok/s | lora-ft tok/s | lora-ft / Unsloth | Unsloth MFU | lora-ft MFU "
               "| Unsloth peak GiB | lora-ft peak GiB | memory ratio |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(set(rows) | set(ours)):
        p, o = rows.get(key, {}), ours.get(key, {})
        speed = o.get("tok_s") and p.get("tok_s") and o["tok_s"] / p["tok_s"]
        mem = o.get("peak_alloc_gib") and p.get("peak_alloc_gib") and o["peak_alloc_gib"] / p["peak_alloc_gib"]
        f = cfg and bench_models.flops_per_token(cfg, key[0])
        mfu = lambda r: f and r.get("tok_s") and r["tok_s"] * f["model"] / bench_models.PEAK_FLOPS  # noqa: E731
        out.append(f"| {key[0]} x {key[1]} | {fmt(cell(p, 'tok_s'))} | {fmt(cell(o, 'tok_s'))} | "
                   f"{fmt(speed) if speed else '-'} | {pct(mfu(p))} | {pct(mfu(o))} | "
                   f"{fmt(cell(p, 'peak_alloc_gib'))} | {fmt(cell(o, 'peak_alloc_gib'))} | {fmt(mem) if mem else '-'} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref")
    ap.add_argument("ours")
    ap.add_argument("first_step_ref", nargs="?", default="")
    ap.add_argument("--config", default="", help="the model folder or its config.json (FLOPs per token)")
    ap.add_argument("--peer", default="", help="Unsloth's JSON (unsloth_train_ref.py): a second table")
    ap.add_argument("--budget-gib", type=float, default=0.0,
                    help="lora-ft's memory budget (--gpu-mem x max_vram_fraction): issue 20's targets")
    args = ap.parse_args()
    ref = json.load(open(args.ref))
    theirs = {(r["seq"], r["bs"]): r for r in ref["results"]}
    ours, errors = read_ours(args.ours)
    cfg = None
    if args.config:
        path = os.path.join(args.config, "config.json") if os.path.isdir(args.config) else args.config
        if os.path.exists(path):
            cfg = json.load(open(path))
        else:
            print(f"({path} is missing: no FLOPs per token, lora-ft's own MFU instead)\n")

    head = f"{ref.get('gpu', '?')}, {ref.get('arch', '?')}, {ref.get('dtype', '?')}"
    if cfg:
        n, nl = bench_models.parameter_count(cfg), bench_models.lora_parameter_count(cfg)
        head += f" (N = {n / 1e9:.3f}e9, N_lora = {nl / 1e6:.1f}e6)"
    head += f"; reference attention {ref.get('attn', 'sdpa')}, load {ref.get('load_s')} s"
    if ref.get("steps"):
        head += f", {ref['steps']} timed steps"
    card = next((o["card_gib"] for o in ours.values() if o.get("card_gib")), None)
    if card:
        head += f"; lora-ft held to a {card:g} GiB card (--hold-card: the GPU's memory beyond it held)"
    print(head + "\n")
    kept = any(o.get("kept_layers") is not None for o in ours.values())
    layers = (cfg or {}).get("num_hidden_layers")
    if cfg:
        peak = bench_models.PEAK_FLOPS / 1e12
        print(f"MFU = (4·N + 6·N_lora + 3·A) × tok/s / {peak:.0f} TFLOP/s: the FLOPs training needs "
              "(frozen weights: forward and input gradient; LoRA: forward, input and weight gradients; "
              "attention: forward and backward), N every parameter (embeddings included, a tied matrix once, "
              "as the earlier tables), A the forward attention FLOPs per token at the row's length "
              "(4·heads·head_dim·keys seen, causal, windows applied). HFU = (6·N + 8·N_lora + 4·A) × tok/s / "
              f"{peak:.0f} TFLOP/s: the same with checkpointing's recomputed forward (the earlier tables' MFU "
              "was 6·N / 790 TFLOP/s).\n")
        if kept:
            print("kept: the layers lora-ft kept whole from the forward to the backward (selective checkpointing), "
                  "as on the GPU + in page-locked host memory where some were offloaded; "
                  "its HFU leaves their recompute out: (6·N + 8·N_lora + 4·A) − (kept / layers)·(2·N + 2·N_lora + A).\n")
        print("| seq x batch | PEFT tok/s | lora-ft tok/s | speed ratio | PEFT MFU | lora-ft MFU | PEFT HFU "
              "| lora-ft HFU | PEFT peak GiB | lora-ft peak GiB | memory ratio |" + (" kept |" if kept else ""))
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if kept else ""))
    else:
        print("| seq x batch | PEFT tok/s | lora-ft tok/s | speed ratio | PEFT MFU | lora-ft MFU "
              "| PEFT peak GiB | lora-ft peak GiB | memory ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(set(theirs) | set(ours)):
        t, o = theirs.get(key, {}), ours.get(key, {})
        speed = o.get("tok_s") and t.get("tok_s") and o["tok_s"] / t["tok_s"]
        mem = o.get("peak_alloc_gib") and t.get("peak_alloc_gib") and o["peak_alloc_gib"] / t["peak_alloc_gib"]
        row = f"| {key[0]} x {key[1]} | {fmt(cell(t, 'tok_s'))} | {fmt(cell(o, 'tok_s'))} | {fmt(speed) if speed else '-'} | "
        if cfg:
            f = bench_models.flops_per_token(cfg, key[0])
            use = lambda r, k: r.get("tok_s") and r["tok_s"] * f[k] / bench_models.PEAK_FLOPS  # noqa: E731
            ours_hw = f["hardware"]
            if o.get("kept_layers") and layers:
                ours_hw -= min(o["kept_layers"], layers) / layers * (f["hardware"] - f["model"])
            hw = o.get("tok_s") and o["tok_s"] * ours_hw / bench_models.PEAK_FLOPS
            row += f"{pct(use(t, 'model'))} | {pct(use(o, 'model'))} | {pct(use(t, 'hardware'))} | {pct(hw)} | "
        else:
            # the same FLOPs per token on both sides: the reference's MFU scales with its tokens/s
            ref_mfu = speed and o.get("mfu") and o["mfu"] / speed
            row += f"{pct(ref_mfu)} | {pct(o.get('mfu'))} | "
        row += f"{fmt(cell(t, 'peak_alloc_gib'))} | {fmt(cell(o, 'peak_alloc_gib'))} | {fmt(mem) if mem else '-'} |"
        if kept and cfg:
            row += f" {kept_cell(o)} |"
        print(row)
    for e in errors[:3]:
        print(f"\nlora-ft: {e}")
    # a warm-up step out of memory run again as `lora-ft train` does (train/recovery.rs)
    for key, o in sorted(ours.items()):
        if o.get("recovered"):
            print(f"\nlora-ft {key[0]} x {key[1]}, out of memory in its warm-up: " + "; ".join(o["recovered"]))
    if cfg and ours:
        checks = targets(theirs, ours)
        if checks:
            print("\nIssue 18's targets: " + "; ".join(checks))
        if kept:
            print("\nIssue 20's targets: " + "; ".join(issue20_targets(theirs, ours, args.budget_gib)))
    if args.peer:
        print("\n" + "\n".join(peer_table(args.peer, ours, cfg)))
    ours_first = next((r["first_step_s"] for r in ours.values() if r.get("first_step_s")), None)
    # --first-step-cold-warm: lora-ft's first step on a cold (CUDA_CACHE_DISABLE=1), fresh (empty
    # cache) and warm driver JIT cache, each a process of its own
    firsts = next((r["first_steps"] for r in ours.values() if r.get("first_steps")), None)
    if firsts:
        ours_first = firsts["cold_s"]
    if args.first_step_ref and os.path.exists(args.first_step_ref) and ours_first:
        lines = [json.loads(line) for line in open(args.first_step_ref) if line.startswith("{")]
        if lines:
            r = lines[0]
            cold = " cold (CUDA_CACHE_DISABLE=1)" if firsts else ""
            print(f"\nTime to the first step ({r['seq']} x {r['bs']}, from process start): PEFT {r['first_step_s']:.1f} s "
                  f"(load {r['load_s']:.1f} s), lora-ft{cold} {ours_first:.1f} s, ratio {ours_first / r['first_step_s']:.2f}")
    if firsts:
        print(f"\nlora-ft's first step from process start, each run a process of its own: cold (CUDA_CACHE_DISABLE=1) "
              f"{firsts['cold_s']:.2f} s, fresh machine (an empty CUDA_CACHE_PATH) {firsts['fresh_s']:.2f} s, warm "
              f"(that cache again) {firsts['warm_s']:.2f} s")


if __name__ == "__main__":
    main()
