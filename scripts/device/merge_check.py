"""transformers loads what `lora-ft merge` writes, and its logits equal PEFT's base + adapter.

  python3 scripts/device/merge_check.py BASE_DIR ADAPTER_DIR MERGED_DIR TOLERANCE
"""
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

base_dir, adapter_dir, merged_dir, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
ids = torch.tensor([[1, 5, 9, 2, 7, 3, 11, 4]])
with torch.no_grad():
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    want = PeftModel.from_pretrained(base, adapter_dir)(ids).logits
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    stored = str(next(merged.parameters()).dtype)
    got = merged.float()(ids).logits
err = float((got - want).abs().max() / want.abs().max())
print(json.dumps({"merged": merged_dir, "loaded_dtype": stored, "max_rel_err": err, "tolerance": tol}))
assert err < tol, err
