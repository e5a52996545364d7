"""Token-length statistics of datasets/support-long with real tokenizers and chat templates.

Usage: /work/venv/bin/python scripts/support_long/measure.py [--write]
Renders every row with transformers' apply_chat_template(messages, tools=tools, tokenize=False)
(Llama 3.3 = the Llama 3.1 template, date_string "26 Jul 2024"; Mistral v0.3) and counts the
tokens of the rendered text (no added special tokens: the templates write BOS themselves).
--write puts the table into the `tokens` block of datasets/support-long/README.md.
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokdirs  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "datasets", "support-long")
QS = (0, 10, 25, 50, 75, 90, 95, 99, 100)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def lengths(tok, family, rows):
    return [len(tok(tokdirs.render(tok, r, family), add_special_tokens=False)["input_ids"]) for r in rows]


def main():
    rows = {s: [json.loads(x) for x in open(os.path.join(DATA, s + ".jsonl"), encoding="utf-8")] for s in ("train", "eval")}
    out = ["| tokenizer + template | split | rows | min | p10 | p25 | p50 | p75 | p90 | p95 | p99 | max | mean | total | > 2048 |",
           "|---|---|---:|" + "---:|" * 12]
    for family, label in [("llama-3.3", "Llama 3.x (3.1/3.3 template)"), ("mistral-v0.3", "Mistral v0.3")]:
        tok = tokdirs.load(family)
        for split in ("train", "eval"):
            n = lengths(tok, family, rows[split])
            out.append("| %s | %s | %d | %s | %.0f | %d | %d |" % (
                label, split, len(n), " | ".join(str(pct(n, q)) for q in QS), sum(n) / len(n), sum(n), sum(x > 2048 for x in n)))
    table = "\n".join(out)
    print(table)
    if "--write" in sys.argv:
        path = os.path.join(DATA, "README.md")
        text = open(path, encoding="utf-8").read()
        pat = re.compile(r"(<!-- tokens:begin[^>]*-->\n).*?(<!-- tokens:end -->)", re.S)
        assert pat.search(text), "README.md lacks the tokens block"
        text = pat.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)
        open(path, "w", encoding="utf-8", newline="\n").write(text)


if __name__ == "__main__":
    main()
