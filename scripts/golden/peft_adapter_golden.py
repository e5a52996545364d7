#!/usr/bin/env python3
"""Golden logits of SmolLM2 + an adapter exported by lora-ft, as PEFT computes them.

tests/peft_adapter.rs writes the adapter (formula weights, r=2, rslora, q/v/down projections) with
    LORA_FT_BLESS_PEFT=1 cargo test --release --test peft_adapter
into tests/golden/peft_smollm2_adapter/; this script loads that folder with
`PeftModel.from_pretrained`, checks that every LoRA weight PEFT holds came from the file, and
stores the logits for a fixed token sequence:
    python3 scripts/golden/peft_adapter_golden.py --base ~/.cache/lora-ft/smollm2-hf
The full [seq, 49152] logits would be 1.5 MB, so the file keeps the first 2048 columns, the
log-sum-exp over the vocabulary and the argmax of every position.
"""
import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parent))
from peft_logits import load_model  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "golden"
# "<|im_start|>user\nWhere is my order FH-1234567?<|im_end|>\n<|im_start|>assistant\n" in SmolLM2's vocabulary
IDS = [1, 4093, 198, 9576, 314, 957, 1686, 46985, 29, 33, 34, 35, 36, 37, 38, 39, 47, 2, 198, 1, 520, 9531, 198]


def check_loaded(model, adapter_file: Path) -> int:
    """Every lora_A/lora_B PEFT holds equals the tensor of the same name in the file."""
    saved = load_file(adapter_file)
    n = 0
    for name, p in model.named_parameters():
        if "lora_" not in name:
            continue
        key = name.replace(".default.weight", ".weight")
        if key not in saved:
            raise SystemExit(f"PEFT has {name}, the adapter file has no {key}")
        if not torch.equal(p.detach(), saved[key]):
            raise SystemExit(f"{name}: PEFT's weight differs from the file")
        n += 1
    if n != len(saved):
        raise SystemExit(f"PEFT loaded {n} LoRA tensors, the file has {len(saved)}")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path)
    ap.add_argument("--adapter", type=Path, default=GOLDEN / "peft_smollm2_adapter")
    ap.add_argument("--out", type=Path, default=GOLDEN / "peft_smollm2_logits.safetensors")
    args = ap.parse_args()
    model = load_model(args.base.expanduser(), args.adapter, None, "eager")
    n = check_loaded(model, args.adapter / "adapter_model.safetensors")
    input_ids = torch.tensor([IDS])
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[0].float()
    out = {
        "input_ids": input_ids.to(torch.int64),
        "logits_head": logits[:, :2048].contiguous(),
        "logsumexp": torch.logsumexp(logits.double(), dim=-1).float(),
        "argmax": logits.argmax(-1).to(torch.int64),
    }
    save_file(out, args.out, metadata={"lora_tensors_loaded": str(n)})
    print(f"PEFT loaded {n} LoRA tensors; wrote {args.out}")


if __name__ == "__main__":
    main()
