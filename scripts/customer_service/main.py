"""Write (or, with --check, compare) the dataset files and the README's generated blocks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .build import build
from .pools import EVAL_PROMPTS, OUT_DIR, README, ROOT, SPLITS, TOOLS_FILE
from .report import readme_text
from .tools import all_tools


def outputs() -> dict[Path, str]:
    splits, prompts = build()
    files = {OUT_DIR / f"{name}.jsonl": "".join(line + "\n" for line in splits[name].lines) for name, _ in SPLITS}
    files[EVAL_PROMPTS] = "".join(line + "\n" for line in prompts)
    files[TOOLS_FILE] = json.dumps(all_tools(), ensure_ascii=False, indent=2) + "\n"
    files[README] = readme_text(README.read_text(encoding="utf-8"), splits, prompts)
    return files


def main(doc: str) -> int:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate in memory and exit 1 if the committed files differ")
    args = parser.parse_args()
    files = outputs()
    if args.check:
        stale = [p for p, text in files.items() if not p.exists() or p.read_bytes() != text.encode("utf-8")]
        for p in stale:
            print(f"differs from a fresh generation: {p.relative_to(ROOT)}", file=sys.stderr)
        if not stale:
            print("ok: dataset files match a fresh generation")
        return 1 if stale else 0
    for p, text in files.items():
        p.write_bytes(text.encode("utf-8"))
        print(f"wrote {p.relative_to(ROOT)}")
    return 0
