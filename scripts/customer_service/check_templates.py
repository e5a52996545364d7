"""Render every row of datasets/customer-service through the real chat templates of
tests/fixtures/tokenizers/ with transformers' apply_chat_template(messages, tools=tools), and
measure token lengths. Not part of the generator (it needs transformers):

    /work/venv/bin/python scripts/customer_service/check_templates.py [--smollm2 DIR]

Exits 1 if any template refuses any row. Token lengths are measured with the SmolLM2 tokenizer
(DIR, default ~/.cache/lora-ft/smollm2-hf) on the text the Qwen2.5 template renders (Hermes-style
tool block), and with the Qwen2.5 tokenizer on the same text.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent.parent
DATA = ROOT / "datasets" / "customer-service"
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizers"
# template folder: its vocabulary in tests/fixtures/tokenizers/vocab/
TEMPLATES = {"qwen2.5": "qwen2.5", "qwen3": "qwen3", "llama-3.2": "llama3", "llama-3.3": "llama3",
             "mistral-v0.3": "mistral-v0.3", "mistral-nemo": "tekken"}
FILES = ["train.jsonl", "eval.jsonl", "eval_prompts.jsonl"]


def percentile(values: list[int], q: float) -> int:
    values = sorted(values)
    rank = max(1, -(-len(values) * q // 100))
    return values[int(rank) - 1]


def load(family: str):
    """The fixture folder with its tokenizer.json and unzipped files (scripts/golden/chat_templates.py
    assembles them the same way)."""
    out = Path(tempfile.mkdtemp(prefix=f"cs-{family}-"))
    with gzip.open(FIXTURES / "vocab" / f"{TEMPLATES[family]}.tokenizer.json.gz") as f:
        (out / "tokenizer.json").write_bytes(f.read())
    for src in (FIXTURES / family).iterdir():
        if src.name.endswith(".gz"):
            with gzip.open(src) as f:
                (out / src.name[:-3]).write_bytes(f.read())
        else:
            shutil.copy(src, out)
    return AutoTokenizer.from_pretrained(out)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smollm2", default=str(Path.home() / ".cache/lora-ft/smollm2-hf"))
    args = parser.parse_args()
    rows = {f: [json.loads(x) for x in (DATA / f).read_text(encoding="utf-8").splitlines()] for f in FILES}
    failures = 0
    for name in TEMPLATES:
        tok = load(name)
        lengths = []
        for f, items in rows.items():
            bad = 0
            for i, row in enumerate(items):
                prompt_only = row["messages"][-1]["role"] == "user"
                try:
                    text = tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False,
                                                   add_generation_prompt=prompt_only)
                    for call in (c for m in row["messages"] for c in m.get("tool_calls") or []):
                        assert call["function"]["name"] in text, "a tool call was not rendered"
                    if f == "train.jsonl":
                        lengths.append(len(tok(text, add_special_tokens=False)["input_ids"]))
                except Exception as e:  # noqa: BLE001 - report every refusal
                    bad += 1
                    if bad <= 3:
                        print(f"  {name} {f}:{i + 1}: {type(e).__name__}: {e}")
            failures += bad
            print(f"{name:13} {f:19} {len(items) - bad}/{len(items)} rendered")
        if lengths:
            print(f"{name:13} train.jsonl tokens with its own tokenizer: min {min(lengths)} / median "
                  f"{percentile(lengths, 50)} / p90 {percentile(lengths, 90)} / max {max(lengths)}")
    qwen = load("qwen2.5")
    smol = AutoTokenizer.from_pretrained(args.smollm2) if Path(args.smollm2).exists() else None
    for f, items in rows.items():
        texts = [qwen.apply_chat_template(r["messages"], tools=r["tools"], tokenize=False) for r in items]
        for label, tok in (("SmolLM2", smol), ("Qwen2.5", qwen)):
            if tok is None:
                continue
            n = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
            print(f"tokens {label:8} tokenizer, Qwen2.5 template, {f:19} min {min(n)} / median "
                  f"{percentile(n, 50)} / p90 {percentile(n, 90)} / max {max(n)}; "
                  f"over 512: {sum(x > 512 for x in n)}, over 1024: {sum(x > 1024 for x in n)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
