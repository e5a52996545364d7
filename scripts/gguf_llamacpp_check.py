#!/usr/bin/env python3
"""Issue 21's llama.cpp check: a GGUF file `lora-ft export-gguf` wrote, run by llama.cpp itself
(CPU: the prebuilt llama.cpp of scripts/gguf_llamacpp_install.sh, through scripts/gguf_llamacpp_run.py),
against `lora-ft chat` on the folder it came from: the same greedy reply to each of ten
customer-service prompts.

    python3 scripts/gguf_llamacpp_check.py --gguf OUT.gguf --model DIR [--adapter A] [--lora-ft BIN]
    python3 scripts/gguf_llamacpp_check.py --gguf BASE.gguf --lora-gguf ADAPTER.gguf --model DIR --adapter A
      (an `export-gguf --adapter-only` file applied by llama.cpp at run time over the base's GGUF)

Both sides get the same prompt text: the model's own chat template (tokenizer_config.json),
rendered here with jinja2 as transformers renders it, with the generation prompt; llama.cpp
tokenizes it with its special tokens parsed. `lora-ft chat --temperature 0` decodes greedily in
f32 from the HF folder; llama.cpp greedily (argmax) from the GGUF. Prints one line per prompt
and exits 1 if a reply differs (the first differing position is printed). Needs numpy and jinja2.

    python3 scripts/gguf_llamacpp_check.py --logits --gguf Q.gguf --model DIR [--adapter A] \
        --reference-gguf F32.gguf --calibration-gguf F16.gguf
      (issue 21's logits check: llama.cpp's last-position logits of each prompt against lora-ft's
      own — `cargo build --release --example last_logits`, the same token ids on both sides — for
      the f32 export (the floor: arithmetic only), the calibration file (f16: a rounding of known
      size) and Q; the tolerance for Q is derived, not guessed: logit errors grow linearly with
      the RMS rounding error of the weights (first order), so Q's expected RMS and max |Δlogit|
      are the calibration file's times σ_Q/σ_cal, σ the RMS of (file's weights − f32 weights)
      over every 2-D weight, read from the files. The bound is checked on Q's weights run in f32
      (the f32 export with Q's dequantized weights): what the export wrote, without llama.cpp's
      own rounding of the activations in its quantized matmuls, which the native run of Q (also
      printed) adds. Exit 1 if that run's RMS or max |Δlogit| exceeds the expected value. This mode
      uses llama-cpp-python and gguf-py.)
"""
import argparse
import json
import os
import subprocess
import sys

PROMPTS = [
    "My order arrived damaged. What should I do?",
    "How do I reset my password?",
    "Can I change the delivery address after ordering?",
    "I was charged twice for the same order.",
    "What is your return policy?",
    "The app crashes when I open my cart.",
    "Do you ship to Canada?",
    "How long does a refund take?",
    "I want to cancel my subscription.",
    "Where is my package? It has been a week.",
]


def ours(bin_, model, adapter, prompt, n):
    cmd = [bin_, "chat", "--model", model, "--prompt", prompt, "--quantization", "none",
           "--max-new-tokens", str(n), "--temperature", "0"]
    if adapter:
        cmd += ["--adapter", adapter]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"lora-ft chat failed: {out.stderr[-2000:]}")
    return out.stdout.strip()


def prompt_texts(model):
    import jinja2

    cfg = json.load(open(os.path.join(model, "tokenizer_config.json")))
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(cfg["chat_template"])
    return cfg, [template.render(messages=[{"role": "user", "content": p}], add_generation_prompt=True,
                                 bos_token=cfg.get("bos_token", ""), eos_token=cfg.get("eos_token")) for p in PROMPTS]


def llama_logits(gguf, ids):
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=1024, n_threads=2, verbose=False, logits_all=True, seed=0)
    rows = []
    for tokens in ids:
        llm.reset()
        llm.eval(tokens)
        rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64))
    return np.stack(rows)


def weight_rms_error(gguf, reference):
    """σ: each 2-D weight's relative rounding error, RMS(file − f32) / RMS(f32), as an RMS over the
    weights (each matmul adds noise to its output in proportion to its own relative error)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    ref = {t.name: t for t in GGUFReader(reference).tensors}
    rel = []
    for t in GGUFReader(gguf).tensors:
        if len(t.shape) < 2:
            continue
        ours = dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
        want = np.asarray(ref[t.name].data, dtype=np.float64).ravel()
        rel.append(np.sqrt(np.square(ours - want).mean() / max(np.square(want).mean(), 1e-300)))
    return float(np.sqrt(np.mean(np.square(rel))))


def dequantized_copy(gguf, reference, out):
    """`reference` (f32) with every 2-D weight replaced by `gguf`'s dequantized: llama.cpp then
    runs the same rounded weights in f32, without its own rounding of the activations."""
    import shutil

    from gguf import GGUFReader
    from gguf.quants import dequantize

    shutil.copy(reference, out)
    target = GGUFReader(out, "r+")
    quantized = {t.name: t for t in GGUFReader(gguf).tensors}
    for t in target.tensors:
        if len(t.shape) >= 2:
            q = quantized[t.name]
            t.data[...] = dequantize(q.data, q.tensor_type).reshape(t.data.shape)
    target.data.flush()
    return out


def logits_check(args):
    import numpy as np
    from llama_cpp import Llama

    _, texts = prompt_texts(args.model)
    tok = Llama(model_path=args.reference_gguf, vocab_only=True, verbose=False)
    ids = [tok.tokenize(t.encode(), add_bos=False, special=True) for t in texts]
    ids_file = os.path.join(args.work_dir, "ids.txt")
    with open(ids_file, "w") as f:
        f.writelines(",".join(map(str, row)) + "\n" for row in ids)
    out = os.path.join(args.work_dir, "lora_ft_logits.f32")
    subprocess.run([args.last_logits, args.model, args.adapter or "-", ids_file, out], check=True)
    ours = np.fromfile(out, dtype=np.float32).astype(np.float64).reshape(len(ids), -1)
    report = {}
    as_f32 = dequantized_copy(args.gguf, args.reference_gguf, os.path.join(args.work_dir, "checked_weights_in_f32.gguf"))
    runs = [("reference", args.reference_gguf), ("calibration", args.calibration_gguf), ("checked", args.gguf),
            ("checked_weights_in_f32", as_f32)]
    for label, gguf in runs:
        delta = llama_logits(gguf, ids) - ours
        theirs = delta + ours
        report[label] = {
            "file": os.path.basename(gguf),
            "top1_same": int((theirs.argmax(1) == ours.argmax(1)).sum()),
            "max_abs_dlogit": float(np.abs(delta).max()),
            "rms_dlogit": float(np.sqrt(np.square(delta).mean())),
            "sigma_weights": 0.0 if label == "reference" else weight_rms_error(gguf, args.reference_gguf),
        }
    os.remove(as_f32)
    floor, cal, q = report["reference"], report["calibration"], report["checked"]
    ratio = q["sigma_weights"] / cal["sigma_weights"]
    # the calibration's own rounding part: its RMS error less the floor's (independent noises add
    # in quadrature), scaled to Q's weight rounding, the floor added back
    cal_rounding = max(cal["rms_dlogit"] ** 2 - floor["rms_dlogit"] ** 2, 0.0) ** 0.5
    expected_rms = (floor["rms_dlogit"] ** 2 + (cal_rounding * ratio) ** 2) ** 0.5
    expected_max = floor["max_abs_dlogit"] + cal["max_abs_dlogit"] * ratio
    w = report["checked_weights_in_f32"]
    report["derived"] = {"sigma_ratio": ratio, "expected_rms_dlogit": expected_rms, "expected_max_abs_dlogit": expected_max,
                         "weights_within": w["rms_dlogit"] <= expected_rms and w["max_abs_dlogit"] <= expected_max,
                         "native_within": q["rms_dlogit"] <= expected_rms and q["max_abs_dlogit"] <= expected_max,
                         "max_abs_logit": float(np.abs(ours).max()), "prompts": len(ids)}
    print(json.dumps(report, indent=1))
    # the bound is the weights' (what the export wrote); llama.cpp's native run of a quantized
    # file also rounds the activations (its CPU vec_dot_type), reported beside it
    sys.exit(0 if report["derived"]["weights_within"] else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logits", action="store_true", help="compare last-position logits (see above)")
    ap.add_argument("--reference-gguf", help="--logits: the f32 export of the same model (and adapter)")
    ap.add_argument("--calibration-gguf", help="--logits: the f16 export of the same model (and adapter)")
    ap.add_argument("--last-logits", default="target/release/examples/last_logits")
    ap.add_argument("--work-dir", default="/tmp")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--model", required=True, help="the HF folder the GGUF was exported from")
    ap.add_argument("--adapter", default="", help="the adapter merged into the GGUF, given to lora-ft chat")
    ap.add_argument("--lora-gguf", default=None, help="a LoRA GGUF (export-gguf --adapter-only) for llama.cpp to apply")
    ap.add_argument("--lora-ft", default="target/release/lora-ft")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args()
    if args.logits:
        return logits_check(args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gguf_llamacpp_run as llamacpp

    cfg, texts = prompt_texts(args.model)
    eos = cfg.get("eos_token")
    replies = llamacpp.generate(args.gguf, texts, args.max_new_tokens, args.lora_gguf)
    differing = 0
    for prompt, reply in zip(PROMPTS, replies):
        theirs = reply.decode("utf-8", errors="ignore")
        theirs = (theirs.split(eos)[0] if eos else theirs).strip()
        mine = ours(args.lora_ft, args.model, args.adapter, prompt, args.max_new_tokens)
        same = theirs == mine
        differing += not same
        print(json.dumps({"prompt": prompt, "same": same, "llama.cpp": theirs, "lora-ft": mine}))
        if not same:
            at = next((i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b), min(len(theirs), len(mine)))
            print(f"  first difference at character {at}")
    print(f"{len(PROMPTS) - differing} of {len(PROMPTS)} replies identical")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
