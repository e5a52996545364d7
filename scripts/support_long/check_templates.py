"""Render every row of datasets/support-long through real chat templates with tools.

Usage: /work/venv/bin/python scripts/support_long/check_templates.py
transformers' apply_chat_template(messages, tools=tools, tokenize=False) with the tokenizers of
tests/fixtures/tokenizers (llama-3.2, llama-3.3, mistral-v0.3, qwen2.5). A row passes when the
template renders it without raising and the render contains every message's content and every
tool call's name. Exit 1 on any failure.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokdirs  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "datasets", "support-long")


def main():
    bad = 0
    for family in ("llama-3.2", "llama-3.3", "mistral-v0.3", "qwen2.5"):
        tok = tokdirs.load(family)
        for split in ("train", "eval"):
            rows = [json.loads(x) for x in open(os.path.join(DATA, split + ".jsonl"), encoding="utf-8")]
            fails = 0
            for i, r in enumerate(rows):
                try:
                    text = tokdirs.render(tok, r, family)
                except Exception as e:  # jinja2 TemplateError from raise_exception
                    fails += 1
                    if fails <= 3:
                        print("%s %s row %d: %s" % (family, split, i, e))
                    continue
                for m in r["messages"]:
                    if m["role"] == "system" and family == "mistral-v0.3":
                        continue  # v0.3 writes the system message only before a final user turn
                    for tc in m.get("tool_calls", []):
                        if tc["function"]["name"] not in text:
                            fails += 1
                    if m["role"] != "tool" and m["content"].strip() not in text:
                        fails += 1
                        if fails <= 3:
                            print("%s %s row %d: a %s message is missing from the render" % (family, split, i, m["role"]))
            print("%-13s %-5s %4d rows rendered, %d failures" % (family, split, len(rows), fails))
            bad += fails
    print("OK" if not bad else "FAILED: %d" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
