#!/usr/bin/env python3
"""The round trip of lora-ft's files through PEFT and transformers, for every tiny family.

For each tiny random model in tests/fixtures/ (tiny-llama, -llama31, -yarn, -linear, -mistral,
-nemo, -qwen2, -qwen3, -gemma2, -gemma3) and the adapter lora-ft exported for it (formula
weights on all seven projections, r=2; tests/golden/peft_families/<case>/, written by
    LORA_FT_BLESS_PEFT=1 cargo test --release --test peft_families exports_are
), this script
  1. loads the adapter with `PeftModel.from_pretrained` on the transformers model of the
     fixture, checks that every LoRA weight PEFT holds is the file's (and none is missing), and
     computes the logits of a fixed [2, 8] batch in float64 (`hf_parity.exact_float64`: norms,
     RoPE and softmax in float64 too) and in float32: torch's own float32 error;
  2. runs `lora-ft merge --dtype f32` (the CLI, as users run it) on the fixture and adapter,
     loads the folder with `AutoModelForCausalLM.from_pretrained(..., output_loading_info=True)`
     and requires no missing, unexpected or mismatched keys, the file's tensors exactly in the
     model, tied embeddings still tied; its float32 logits must equal PEFT's float64 ones within
     MULTIPLE x torch's unmerged float32 error, and its merged weights PEFT's `merge_and_unload`
     within twice the f32 rounding bound of W + s*B*A (each is within it of the exact value);
  3. does the same for the default `lora-ft merge` (float16): transformers loads it as float16
     with no key missing, and its float16 logits are within MULTIPLE x torch's own float16 error
     (the PEFT model cast to float16) of PEFT's float64 logits.
Written: tests/golden/peft_families_<case>.safetensors (input_ids, PEFT's float64 logits,
torch_f32_err.logits of PEFT's float32 run, torch_f32_err.merged_logits of transformers' run of
the merged folder) and tests/golden/peft_families.json (per case: what PEFT loaded, the loading
info and the tensor names and shapes of the merged folder, every error measured).
tests/peft_families.rs checks lora-ft against these without Python (CI has no torch).

    /work/venv/bin/python scripts/golden/peft_families_golden.py [--case tiny-qwen2 ...] [--check]

--check is the live round trip: every check above, nothing written. lora-ft is
target/release/lora-ft unless --lora-ft says otherwise (build it first: cargo build --release).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import peft
import torch
import transformers
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from hf_parity import exact_float64, rel_err  # noqa: E402
from peft_adapter_golden import check_loaded  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
FIXTURES = REPO / "tests" / "fixtures"
CASES = ["tiny-llama", "tiny-llama31", "tiny-yarn", "tiny-linear", "tiny-mistral", "tiny-nemo",
         "tiny-qwen2", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3"]
# the rule of src/testing.rs: at most MULTIPLE x the reference's own error, read as at least FLOOR
MULTIPLE = 4.0
FLOOR = 8 * torch.finfo(torch.float32).eps
U32 = torch.finfo(torch.float32).eps / 2  # unit roundoff of float32


def batch(index: int) -> torch.Tensor:
    """[2, 8] ids in 1..255, longer than the 5-token windows of Mistral and the Gemmas."""
    g = torch.Generator().manual_seed(1800 + index)
    return torch.randint(1, 256, (2, 8), generator=g, dtype=torch.int64)


def peft_model(case: str, dtype=torch.float32):
    base = AutoModelForCausalLM.from_pretrained(FIXTURES / case, dtype=dtype, attn_implementation="eager")
    return PeftModel.from_pretrained(base, GOLDEN / "peft_families" / case).eval()


def run_merge(lora_ft: Path, case: str, out: Path, dtype: str | None) -> str:
    adapter = GOLDEN / "peft_families" / case
    cmd = [str(lora_ft), "merge", "--model", str(FIXTURES / case), "--adapter", str(adapter), str(out)]
    if dtype:
        cmd[2:2] = ["--dtype", dtype]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return " ".join(["lora-ft", *cmd[1:]]).replace(str(REPO) + "/", "").replace(str(out), "OUT")


def load_merged(case: str, out: Path, want_dtype: torch.dtype):
    """transformers loads the merged folder as a user would: no missing, unexpected or mismatched
    keys, every tensor of the file exactly in the model, tied embeddings tied."""
    model, info = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", output_loading_info=True)
    info = {k: sorted(map(str, v)) for k, v in info.items()}
    for key, v in info.items():
        assert not v, f"{case}: transformers reports {key} {v}"
    state = model.state_dict()
    with safe_open(out / "model.safetensors", "pt") as f:
        tensors = {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
        for name in f.keys():
            assert torch.equal(state[name], f.get_tensor(name)), f"{case}: {name} differs from the file"
    tied = model.config.tie_word_embeddings
    if tied:
        assert "lm_head.weight" not in tensors
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), case
    assert set(state) - set(tensors) <= {"lm_head.weight"}, f"{case}: {set(state) - set(tensors)} not in the file"
    assert next(model.parameters()).dtype == want_dtype, f"{case}: loaded as {next(model.parameters()).dtype}"
    return model.eval(), {"loading_info": info, "tensors": tensors, "tied_lm_head": tied}


def check_against_peft_merge(case: str, out: Path, r: int, scale: float) -> dict:
    """Our merged f32 weights against PEFT's merge_and_unload of the same adapter: both within
    (r + 3) u (|W| + s|B||A|) of the exact W + s B A, so within twice that of each other."""
    ours = load_file(out / "model.safetensors")
    pm = peft_model(case)
    lora = {k: v.detach().double() for k, v in pm.state_dict().items() if "lora_" in k}
    theirs = pm.merge_and_unload().state_dict()
    worst, identical, elements = 0.0, 0, 0
    for name, t in ours.items():
        prefix = "base_model.model." + name.removesuffix(".weight")
        a, b = lora.get(f"{prefix}.lora_A.default.weight"), lora.get(f"{prefix}.lora_B.default.weight")
        if a is None:
            assert torch.equal(t, theirs[name]), f"{case}: {name} is not the base's"
            continue
        size = theirs[name].double().abs() + scale * (b.abs() @ a.abs())
        excess = ((t.double() - theirs[name].double()).abs() / (2 * (r + 3) * U32 * size)).max().item()
        worst, identical = max(worst, excess), identical + (t == theirs[name]).sum().item()
        elements += t.numel()
    assert worst <= 1.0, f"{case}: merged weights differ from PEFT's merge_and_unload by {worst} x the bound"
    return {"adapted_elements_bit_identical_to_peft_merge_and_unload": identical / elements,
            "worst_diff_over_bound_vs_peft_merge_and_unload": worst}


def run_case(case: str, index: int, lora_ft: Path, scratch: Path):
    print(f"[{case}]")
    input_ids = batch(index)
    pm = peft_model(case)
    adapter_file = GOLDEN / "peft_families" / case / "adapter_model.safetensors"
    n_loaded = check_loaded(pm, adapter_file)
    cfg = pm.peft_config["default"]
    r, scale = cfg.r, pm.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"]
    with torch.no_grad():
        logits32 = pm(input_ids=input_ids).logits
        with pm.disable_adapter():
            base32 = pm(input_ids=input_ids).logits
        with exact_float64():
            logits64 = pm.double()(input_ids=input_ids).logits
        half = peft_model(case).half()
        logits16 = half(input_ids=input_ids).logits
    peft_err, moved = rel_err(logits32, logits64), rel_err(base32, logits64)
    peft16_err = rel_err(logits16, logits64)
    assert moved > 100 * MULTIPLE * max(peft_err, FLOOR), f"{case}: the adapter moves the logits by {moved}"
    print(f"  PEFT loaded {n_loaded} LoRA tensors; f32 err {peft_err:.2e}, f16 err {peft16_err:.2e}; "
          f"the adapter moves the logits by {moved:.2e}")

    out = scratch / f"{case}-f32"
    command = run_merge(lora_ft, case, out, "f32")
    merged, loaded = load_merged(case, out, torch.float32)
    with torch.no_grad():
        merged32 = merged(input_ids=input_ids).logits
    merged_err = rel_err(merged32, logits64)
    bound = MULTIPLE * max(peft_err, FLOOR)
    assert merged_err <= bound, f"{case}: merged logits off PEFT's by {merged_err} > {bound}"
    vs_peft_merge = check_against_peft_merge(case, out, r, scale)
    print(f"  merged f32: {len(loaded['tensors'])} tensors, rel err {merged_err:.2e} (bound {bound:.2e}); "
          f"{vs_peft_merge['adapted_elements_bit_identical_to_peft_merge_and_unload']:.1%} of the adapted "
          "weights' elements bit-identical to PEFT's merge_and_unload (the others, B·A "
          f"summed in another order, at {vs_peft_merge['worst_diff_over_bound_vs_peft_merge_and_unload']:.2f} "
          "of the rounding bound at most)")

    out16 = scratch / f"{case}-f16"
    command16 = run_merge(lora_ft, case, out16, None)
    merged16, loaded16 = load_merged(case, out16, torch.float16)
    assert loaded16["tensors"] == loaded["tensors"], case
    with torch.no_grad():
        merged16_err = rel_err(merged16(input_ids=input_ids).logits, logits64)
    bound16 = MULTIPLE * peft16_err
    assert merged16_err <= bound16, f"{case}: f16 merged logits off PEFT's by {merged16_err} > {bound16}"
    print(f"  merged f16 (the default): rel err {merged16_err:.2e} (bound {bound16:.2e})")

    tensors = {
        "input_ids": input_ids,
        "logits": logits64.double(),
        "torch_f32_err.logits": torch.tensor([peft_err], dtype=torch.float64),
        "torch_f32_err.merged_logits": torch.tensor([merged_err], dtype=torch.float64),
    }
    summary = {
        "adapter": {"dir": str(adapter_file.parent.relative_to(REPO)), "lora_tensors_loaded_by_peft": n_loaded,
                    "r": r, "lora_alpha": cfg.lora_alpha, "use_rslora": cfg.use_rslora, "scaling": scale},
        "batch": "input_ids [2, 8]: torch.randint(1, 256, generator seed 1800 + case index); no attention_mask",
        "errors": {"peft_f32_logits": peft_err, "peft_f16_logits": peft16_err,
                   "base_without_adapter_logits": moved, "merged_f32_logits": merged_err,
                   "merged_f16_logits": merged16_err},
        "merged": {"command": command, **loaded, **vs_peft_merge},
        "merged_f16": {"command": command16, "loading_info": loaded16["loading_info"], "loaded_dtype": "float16"},
    }
    return tensors, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=CASES, help="only these (default: all)")
    ap.add_argument("--lora-ft", type=Path, default=REPO / "target" / "release" / "lora-ft")
    ap.add_argument("--check", action="store_true", help="the live round trip only: write no golden")
    args = ap.parse_args()
    if not args.lora_ft.is_file():
        raise SystemExit(f"{args.lora_ft}: no lora-ft binary (cargo build --release)")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    index_path = GOLDEN / "peft_families.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index["about"] = {
        "generator": "scripts/golden/peft_families_golden.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
        "logits": "PEFT's float64 run (norms, RoPE, softmax in float64) of the fixture + the committed adapter",
        "metric": "relative error = max|x - golden| / max|golden|",
        "rule": f"an f32 result is within {MULTIPLE} x max(torch's own f32 error, {FLOOR:.3e}) of the float64 logits",
    }
    with tempfile.TemporaryDirectory(prefix="peft-families-") as scratch:
        for case in args.case or CASES:
            tensors, summary = run_case(case, CASES.index(case), args.lora_ft, Path(scratch))
            if not args.check:
                golden = GOLDEN / f"peft_families_{case}.safetensors"
                save_file({k: v.contiguous() for k, v in tensors.items()}, golden,
                          metadata={"generator": f"scripts/golden/peft_families_golden.py --case {case}"})
                index.setdefault("cases", {})[case] = summary
    if not args.check:
        # one line per list of numbers (the tensor shapes)
        text = re.sub(r"\[[\d,\s]+\]", lambda m: "[" + ", ".join(m.group(0)[1:-1].split()).replace(",,", ",") + "]",
                      json.dumps(index, indent=2))
        index_path.write_text(text + "\n")
        print(f"wrote {index_path.relative_to(REPO)}")
    else:
        print("live round trip: every check passed (nothing written)")


if __name__ == "__main__":
    main()
