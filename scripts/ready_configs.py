#!/usr/bin/env python3
"""Writes issue 18's ready configs (configs/NAME.toml for 24 GB, configs/NAME-48g.toml for 48 GB)
with `lora-ft init` itself, offline: each model's published config.json (bench_models.py) is put
in a throwaway Hugging Face cache under its Hub repo id, so init reads it as it would after a
download, and each config names the Hub id. A line for the peak measured on the GPU
(scripts/device/measure_configs.sh, its output kept in benches/issue18/configs_NAME.jsonl) goes
under the predicted one.

    python3 scripts/ready_configs.py [--lora-ft target/release/lora-ft] [--force]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "bench"))
import bench_models  # noqa: E402

# (bench_models name = config file name, Hub repo id, config.json changes of that repo)
READY = [
    # -Instruct: the base model's keys with the chat turn's end among the eos ids
    ("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", {"eos_token_id": [128001, 128008, 128009]}),
    ("qwen3-8b", "Qwen/Qwen3-8B", {}),
    ("qwen3-14b", "Qwen/Qwen3-14B", {}),
    ("gemma2-9b", "google/gemma-2-9b-it", {}),
]
# Gemma 2's template takes no tools: its configs train the tool-free dialogues
DATA = {"gemma2-9b": "datasets/customer-service-v1"}
CARDS = [(24, ""), (48, "-48g")]



def measured_line(name, path):
    """The peak `bench train` measured at the config's own shape, or a note that none was."""
    with open(path) as f:
        text = f.read()
    seq = int(text.split("max_seq_len = ")[1].split()[0])
    batch = int(text.split("batch_size = ")[1].split()[0])
    # measured with the MLP in row tiles (the default since issue 20; issue 18's were without)
    runs = f"benches/issue20/configs_{name}.jsonl"
    try:
        with open(runs) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
    except FileNotFoundError:
        rows = []
    hit = [r for r in rows if r.get("seq") == seq and r.get("bs") == batch and r.get("peak_alloc_gib")]
    if not hit:
        return "# measured peak: (to be measured: bash scripts/device/measure_configs.sh %s)\n" % name
    return (
        "# measured peak: %.2f GiB allocated, %.2f GiB reserved by the allocator, on an H100 (`lora-ft\n"
        "# bench train`, random weights, %d x %d, dropout 0.05; without grad_accum's kept gradients), %s.\n"
        % (hit[0]["peak_alloc_gib"], hit[0]["peak_reserved_gib"], batch, seq, runs)
    )


def cache_with(root, repo, config):
    """refs/main and snapshots/<commit>/config.json, as hf-hub lays a cached repo out."""
    folder = os.path.join(root, "models--" + repo.replace("/", "--"))
    commit = "0" * 40
    os.makedirs(os.path.join(folder, "refs"), exist_ok=True)
    os.makedirs(os.path.join(folder, "snapshots", commit), exist_ok=True)
    with open(os.path.join(folder, "refs", "main"), "w") as f:
        f.write(commit)
    with open(os.path.join(folder, "snapshots", commit, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lora-ft", default="target/release/lora-ft")
    ap.add_argument("--force", action="store_true", help="replace existing configs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
        for name, repo, changes in READY:
            cache_with(cache, repo, dict(bench_models.config(name), **changes))
            for gib, suffix in CARDS:
                out = f"configs/{name}{suffix}.toml"
                cmd = [args.lora_ft, "init", repo, "--gpu-mem", f"{gib}GiB", "--out", out]
                cmd += ["--data", DATA[name]] if name in DATA else []
                subprocess.run(cmd + (["--force"] if args.force else []), env=env, check=True)
                with open(out) as f:
                    lines = f.readlines()
                at = next(i for i, line in enumerate(lines) if not line.startswith("#"))
                measured = measured_line(name, out)
                with open(out, "w") as f:
                    f.writelines(lines[:at] + [measured] + lines[at:])


if __name__ == "__main__":
    main()
