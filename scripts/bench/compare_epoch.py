#!/usr/bin/env python3
"""The table of scripts/device/bench_epoch.sh: one epoch of each dialogue set by lora-ft (packing)
and by TRL's SFTTrainer (packing "bfd"), side by side, with issue 19's targets under it.

    compare_epoch.py --arch NAME --out-dir DIR --sets customer-service support-long

Reads from DIR: tokens_NAME_SET-train.jsonl (the tokens both stacks trained: `lora-ft data
tokenize`), lora_ft_NAME_SET.metrics.jsonl (lora-ft's metrics: one line per step, the eval before
and after), trl_NAME.json (scripts/bench/trl_sft_ref.py) and lora_ft_NAME_random.jsonl (`lora-ft
bench train` at 2048x8). Epoch time is the sum of the optimizer steps' times on both sides (lora-ft:
tokens / tokens_per_s of each step record; TRL: its step callbacks), so neither side's evaluation,
model load or checkpoint counts; throughput is the dialogues' own tokens (no padding) over it.
"""
import argparse
import json
import os


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def lora_ft_epoch(metrics):
    """(step time sum, steps, peak GiB, first eval loss, last eval loss, last train loss)."""
    steps = [r for r in metrics if r.get("trained_tokens") is not None]
    evals = [r for r in metrics if r.get("eval_tokens") is not None]
    if not steps:
        return None
    times = [r["tokens"] / r["tokens_per_s"] for r in steps]
    time_s = sum(times)
    peak = max((r.get("gpu_peak_gib") or 0.0) for r in steps)
    return dict(step_time_s=time_s, steps=len(steps), peak_alloc_gib=peak, step_times_s=times,
                base_eval_loss=evals[0]["eval_loss"] if evals else None,
                eval_loss=evals[-1]["eval_loss"] if len(evals) > 1 else None, last_loss=steps[-1]["loss"])


def token_count(d, arch, name, theirs):
    """(rows, tokens) both stacks trained: from the tokens file where it is kept, else the
    reference's record of the same tokens (benches/issue19 keeps no tokens files)."""
    tokens = read_jsonl(os.path.join(d, f"tokens_{arch}_{name}-train.jsonl"))
    if tokens:
        return len(tokens), sum(len(r["input_ids"]) for r in tokens)
    return theirs.get("rows", "—") if theirs else "—", theirs["tokens"] if theirs else 0


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--sets", nargs="+", required=True)
    args = ap.parse_args()
    d, a = args.out_dir, args.arch
    trl_path = os.path.join(d, f"trl_{a}.json")
    trl = json.load(open(trl_path)) if os.path.exists(trl_path) else {"results": []}
    trl_runs = {r["run"]: r for r in trl.get("results", []) if "run" in r}
    random = [r for r in read_jsonl(os.path.join(d, f"lora_ft_{a}_random.jsonl")) if r.get("tok_s")]
    random_tok_s = random[0]["tok_s"] if random else None
    print(f"## One epoch of real dialogues: {a}, max_seq_len 2048, batch 8, packing on both sides\n")
    if trl.get("gpu"):
        v = trl.get("versions", {})
        print(f"{trl['gpu']}; reference: {', '.join(f'{k} {x}' for k, x in v.items())}; "
              f"attention {trl.get('attn')}, Liger {trl.get('liger')}, packing {trl.get('packing')}, lr {trl.get('lr')}\n")
    print("| set | rows | tokens | steps (ours/TRL) | lora-ft epoch s | TRL epoch s | speed-up | lora-ft tok/s "
          "| vs own 2048×8 random | lora-ft peak GiB | TRL peak GiB | memory ratio | eval loss before | "
          "lora-ft eval loss | TRL eval loss | difference |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    checks = []
    for s in args.sets:
        ours = lora_ft_epoch(read_jsonl(os.path.join(d, f"lora_ft_{a}_{s}.metrics.jsonl")))
        theirs = trl_runs.get(s)
        n_rows, n_tok = token_count(d, a, s, theirs)
        our_s = ours and ours["step_time_s"]
        their_s = theirs and theirs["step_time_s"]
        speed = their_s / our_s if our_s and their_s else None
        tok_s = n_tok / our_s if our_s else None
        own = tok_s / random_tok_s if tok_s and random_tok_s else None
        mem = ours["peak_alloc_gib"] / theirs["peak_alloc_gib"] if ours and theirs else None
        el, tl = ours and ours["eval_loss"], theirs and theirs["eval_loss"]
        diff = (el - tl) / tl if el is not None and tl else None
        steps = f"{ours['steps'] if ours else '—'}/{theirs['steps'] if theirs else '—'}"
        print(f"| {s} | {n_rows} | {n_tok} | {steps} | {fmt(our_s, '.1f')} | {fmt(their_s, '.1f')} | "
              f"{fmt(speed, '.2f')}× | {fmt(tok_s, ',.0f')} | {fmt(own and own * 100, '.0f')}% | "
              f"{fmt(ours and ours['peak_alloc_gib'], '.2f')} | {fmt(theirs and theirs['peak_alloc_gib'], '.2f')} | "
              f"{fmt(mem, '.2f')} | {fmt(ours and ours['base_eval_loss'], '.4f')} | {fmt(el, '.4f')} | "
              f"{fmt(tl, '.4f')} | {fmt(diff and diff * 100, '+.2f')}% |")
        checks.append((s, speed, own, mem, diff))
    if random_tok_s:
        print(f"\nlora-ft's own 2048×8 random-token rate in this command: {random_tok_s:,.0f} tok/s "
              f"(peak {random[0].get('peak_alloc_gib', 0):.2f} GiB).")
    print("\nEvery step after the first (the first builds cuDNN graphs and, on a fresh machine, compiles kernels "
          "on both sides), and the eval loss checks:\n")
    print("| set | lora-ft s (steps 2..) | TRL s (steps 2..) | speed-up | lora-ft tok/s (steps 2..) | vs own random "
          "| lora-ft eval loss by TRL's evaluator | lora-ft eval loss, seed 7 | TRL eval loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in args.sets:
        ours = lora_ft_epoch(read_jsonl(os.path.join(d, f"lora_ft_{a}_{s}.metrics.jsonl")))
        n_tok = token_count(d, a, s, trl_runs.get(s))[1]
        seed2 = lora_ft_epoch(read_jsonl(os.path.join(d, f"lora_ft_{a}_{s}-seed7.metrics.jsonl")))
        theirs = trl_runs.get(s)
        scored = next((r for r in trl.get("results", []) if r.get("scored") == f"lora-ft-{s}"), None)
        our_rest = sum(ours["step_times_s"][1:]) if ours else None
        their_rest = sum(theirs["step_times_s"][1:]) if theirs and theirs.get("step_times_s") else None
        # the first step's share of the tokens, taken as the average step's
        rest_tok = n_tok * (1 - 1 / ours["steps"]) if ours else None
        rate = rest_tok / our_rest if our_rest else None
        print(f"| {s} | {fmt(our_rest, '.1f')} | {fmt(their_rest, '.1f')} | "
              f"{fmt(their_rest / our_rest if our_rest and their_rest else None, '.2f')}× | {fmt(rate, ',.0f')} | "
              f"{fmt(rate / random_tok_s * 100 if rate and random_tok_s else None, '.0f')}% | "
              f"{fmt(scored and scored['eval_loss'], '.4f')} | {fmt(seed2 and seed2['eval_loss'], '.4f')} | "
              f"{fmt(theirs and theirs['eval_loss'], '.4f')} |")
    print("\nIssue 19's targets (H100): epoch ≥ 2.5× faster than TRL's, packed real-data throughput ≥ 90% of the "
          "2048×8 random-token rate, peak ≤ 0.6× TRL's, eval loss within 2% of TRL's.\n")
    for s, speed, own, mem, diff in checks:
        verdict = lambda ok: "—" if ok is None else ("met" if ok else "NOT met")  # noqa: E731
        print(f"- {s}: speed {verdict(speed and speed >= 2.5)}, own rate {verdict(own and own >= 0.9)}, "
              f"memory {verdict(mem and mem <= 0.6)}, eval loss {verdict(None if diff is None else abs(diff) <= 0.02)}")


if __name__ == "__main__":
    main()
