#!/usr/bin/env python3
"""Logits of a base model + PEFT adapter, computed by transformers + PEFT (CPU, float32).

This is how we show that PEFT loads the adapters lora-ft exports and computes what lora-ft
computes:

  peft_logits.py --base DIR --adapter DIR --ids "1,2,3;4,5,6" --out logits.safetensors
  peft_logits.py --base DIR --adapter DIR --compare lora_ft_logits.safetensors --key logits

--ids gives one row per ';' (all rows the same length; no attention mask, so pad on the right).
Without --ids, --compare's file must hold "input_ids" [batch, seq] and those are used.
--base may be an HF folder (config.json + *.safetensors) or, with --gguf-file NAME, a GGUF
file in DIR. The exit status is 1 when --max-rel-err is given and exceeded.
"""

import argparse
import sys
from pathlib import Path

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def parse_ids(text: str) -> torch.Tensor:
    try:
        rows = [[int(t) for t in row.split(",") if t.strip()] for row in text.split(";") if row.strip()]
    except ValueError as e:
        raise SystemExit(f"--ids: not a list of integers: {e}")
    if not rows or any(len(r) != len(rows[0]) for r in rows) or not rows[0]:
        raise SystemExit("--ids: need one or more non-empty rows of the same length, e.g. \"1,2,3;4,5,6\"")
    return torch.tensor(rows, dtype=torch.int64)


def load_model(base: Path, adapter: Path, gguf_file: str | None, attn: str):
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation=attn, **kwargs)
    return PeftModel.from_pretrained(model, adapter).eval()


def compare(mine: torch.Tensor, theirs: torch.Tensor, name: str) -> float:
    """Prints and returns max|theirs - mine| / max|mine| (mine = transformers + PEFT)."""
    if tuple(theirs.shape) != tuple(mine.shape):
        raise SystemExit(f"{name}: shape {list(theirs.shape)} in the compared file, PEFT gives {list(mine.shape)}")
    diff = (theirs.double() - mine.double()).abs()
    max_abs = diff.max().item()
    scale = mine.double().abs().max().item()
    rel = max_abs / max(scale, 1e-30)
    elem_rel = (diff / mine.double().abs().clamp_min(1e-3 * scale)).max().item()
    print(f"{name}: max abs err {max_abs:.3e}, max rel err {rel:.3e} (of max |logit| {scale:.3f}), "
          f"max elementwise rel err {elem_rel:.3e}")
    return rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="base model folder")
    ap.add_argument("--adapter", required=True, type=Path, help="PEFT adapter folder")
    ap.add_argument("--gguf-file", help="load the base from this GGUF file inside --base")
    ap.add_argument("--ids", help='token ids, rows separated by ";", e.g. "1,2,3;4,5,6"')
    ap.add_argument("--out", type=Path, help="write input_ids and logits here (safetensors)")
    ap.add_argument("--compare", type=Path, help="safetensors file with logits computed by lora-ft")
    ap.add_argument("--key", default="logits", help="tensor name in --compare (default: logits)")
    ap.add_argument("--max-rel-err", type=float, help="fail (exit 1) above this relative error")
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    args = ap.parse_args()
    if not args.out and not args.compare:
        ap.error("give --out, --compare, or both")

    theirs = load_file(args.compare) if args.compare else {}
    if args.ids:
        input_ids = parse_ids(args.ids)
    elif "input_ids" in theirs:
        input_ids = theirs["input_ids"].to(torch.int64)
    else:
        ap.error("give --ids (or a --compare file holding input_ids)")
    if args.compare and args.key not in theirs:
        raise SystemExit(f"{args.compare}: no tensor {args.key!r} (has: {', '.join(sorted(theirs))})")

    torch.set_num_threads(2)
    model = load_model(args.base, args.adapter, args.gguf_file, args.attn)
    with torch.no_grad():
        logits = model(input_ids=input_ids, use_cache=False).logits.float()

    if args.out:
        save_file({"input_ids": input_ids.contiguous(), "logits": logits.contiguous()}, args.out)
        print(f"wrote {args.out}: logits {list(logits.shape)}")
    if args.compare:
        rel = compare(logits, theirs[args.key].float(), args.key)
        if args.max_rel_err is not None and rel > args.max_rel_err:
            print(f"FAIL: {rel:.3e} > {args.max_rel_err:.1e}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
