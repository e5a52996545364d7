"""llama.cpp for the checks of scripts/gguf_llamacpp_*.py: scripts/gguf_llamacpp_run.c compiled
against the prebuilt llama.cpp that scripts/gguf_llamacpp_install.sh installs (npm's
node-llama-cpp packages), found at $LORA_FT_LLAMACPP or $LORA_FT_CACHE/llamacpp
(default ~/.cache/lora-ft/llamacpp). Every failure says how to install it."""
import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
INSTALL = "bash scripts/gguf_llamacpp_install.sh"


def home():
    cache = os.environ.get("LORA_FT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lora-ft")
    return os.environ.get("LORA_FT_LLAMACPP") or os.path.join(cache, "llamacpp")


def binary():
    """The helper, checked to be compiled from the current scripts/gguf_llamacpp_run.c."""
    exe = os.path.join(home(), "bin", "gguf_llamacpp_run")
    if not os.access(exe, os.X_OK):
        sys.exit(f"llama.cpp is not installed at {home()}: run `{INSTALL}` (.ci/run does)")
    source = hashlib.sha256(open(os.path.join(HERE, "gguf_llamacpp_run.c"), "rb").read()).hexdigest()
    stamp = exe + ".source-sha256"
    built = open(stamp).read().strip() if os.path.exists(stamp) else None
    if built != source:
        sys.exit(f"{exe} was compiled from another scripts/gguf_llamacpp_run.c: rerun `{INSTALL}`")
    return exe


def run(args):
    out = subprocess.run([binary(), args[0], os.path.join(home(), "lib"), *args[1:]], capture_output=True)
    if out.returncode:
        sys.exit(f"llama.cpp failed ({' '.join(args)}): {out.stderr.decode(errors='replace')[-2000:]}")
    return out.stdout


def logits(gguf, seqs, lora=None):
    """llama.cpp's logits at every position of each sequence (token ids), each from an empty cache:
    a list of float64 arrays, positions x vocabulary."""
    with tempfile.TemporaryDirectory() as tmp:
        ids, out = os.path.join(tmp, "ids.txt"), os.path.join(tmp, "logits.f32")
        with open(ids, "w") as f:
            f.writelines(",".join(map(str, s)) + "\n" for s in seqs)
        run(["logits", gguf, lora or "-", ids, out])
        flat = np.fromfile(out, dtype=np.float32).astype(np.float64)
    total = sum(len(s) for s in seqs)
    if total == 0 or flat.size % total:
        sys.exit(f"llama.cpp wrote {flat.size} logits for {total} positions")
    rows = flat.reshape(total, -1)
    starts = np.cumsum([0] + [len(s) for s in seqs])
    return [rows[a:b] for a, b in zip(starts[:-1], starts[1:])]


def generate(gguf, prompts, max_new_tokens, lora=None):
    """Greedy replies to each prompt text (special tokens parsed, BOS where the vocabulary adds
    one), as bytes: the pieces of the chosen tokens up to an end-of-generation token."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "prompts.hex")
        with open(path, "w") as f:
            f.writelines(p.encode("utf-8").hex() + "\n" for p in prompts)
        lines = run(["generate", gguf, lora or "-", path, str(max_new_tokens)]).decode().splitlines()
    if len(lines) != len(prompts):
        sys.exit(f"llama.cpp answered {len(lines)} of {len(prompts)} prompts")
    return [bytes.fromhex(line.split("\t")[1]) for line in lines]
