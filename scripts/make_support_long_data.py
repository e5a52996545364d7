#!/usr/bin/env python3
"""Generate datasets/support-long: synthetic, long-tailed technical-support dialogues.

Usage:
    python3 scripts/make_support_long_data.py          # write train.jsonl, eval.jsonl, README blocks
    python3 scripts/make_support_long_data.py --check  # regenerate in memory, exit 1 on any difference

Python standard library only, seeded: byte-identical on every run (independent of PYTHONHASHSEED).
The help-desk content is in scripts/support_long/ (intents, evidence, dialogue assembly). The token
statistics in the README are measured separately by scripts/support_long/measure.py.
"""

import argparse
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from support_long import dialogues, pools  # noqa: E402
from support_long.intents import INTENTS  # noqa: E402

SEED = 20261125
N_TRAIN, N_EVAL = 800, 100
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "datasets", "support-long")
MAX_CHARS = 15000  # about 6000 Llama-3 tokens of this text


def draw_shape(rng, u):
    """(size, follow-ups, with_tools, noise style): the heavy-tailed part of the mix.
    size is the evidence size (log lines, config rules, trace count, payments...). u is a
    stratified uniform (see generate), so that the few tail rows follow the Pareto quantiles
    instead of depending on luck: 45% short rows without evidence, 49% a log-normal body,
    6% a Pareto tail (x_m 12, alpha 0.8), capped at 120."""
    if u < 0.45:
        size = 0
    elif u < 0.94:
        size = 1 + int(rng.lognormvariate(0.3, 0.8))
    else:
        size = int(12 * (1 - (u - 0.94) / 0.06) ** (-1 / 0.8))
    size = min(size, 120)
    n_follow = dialogues.geometric(rng, 0.8, 5)
    with_tools = rng.random() < 0.39
    style = rng.choices([0, 1, 2], [0.5, 0.3, 0.2])[0]
    return size, n_follow, with_tools, style


def generate(split, n, seed, seen):
    rng = random.Random(seed)
    pl = pools.pools(split)
    rows, meta, discarded = [], [], 0
    us = [(i + rng.random()) / n for i in range(n)]
    rng.shuffle(us)
    while len(rows) < n:
        size, n_follow, with_tools, style = draw_shape(rng, us[len(rows)])
        row, key = dialogues.build(rng, split, pl, size, n_follow, with_tools, style)
        c = dialogues.canonical(row)
        if c in seen or len(c) > MAX_CHARS:
            discarded += 1
            continue
        seen.add(c)
        rows.append(row)
        meta.append((key, size))
    return rows, meta, discarded


def jsonl(rows):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def stats_block(splits):
    L = ["Seed `%d`. Computed by the generator from the rows it writes (characters, not tokens; tokens: see above)." % SEED, "",
         "| | train | eval |", "|---|---:|---:|"]

    def line(label, f):
        L.append("| %s | %s | %s |" % (label, f(splits["train"]), f(splits["eval"])))

    line("rows", lambda s: len(s["rows"]))
    line("rows with `tools` (and at least one tool call)", lambda s: sum("tools" in r for r in s["rows"]))
    line("tool calls", lambda s: sum(len(m.get("tool_calls", [])) for r in s["rows"] for m in r["messages"]))
    line("rows with a system message", lambda s: sum(r["messages"][0]["role"] == "system" for r in s["rows"]))
    line("rows without evidence (short: a checklist, or one article)", lambda s: sum(sz == 0 for _, sz in s["meta"]))
    line("rows with non-ASCII text", lambda s: sum(any(ord(ch) > 127 for ch in json.dumps(r, ensure_ascii=False)) for r in s["rows"]))
    line("candidates discarded (duplicate, or over %d characters)" % MAX_CHARS, lambda s: s["discarded"])
    for lo, hi in [(1, 1), (2, 2), (3, 3), (4, 5), (6, 99)]:
        lab = "%d" % lo if lo == hi else ("%d-%d" % (lo, hi) if hi < 99 else "%d+" % lo)
        line("rows with %s user turn(s)" % lab, lambda s, lo=lo, hi=hi: sum(lo <= sum(m["role"] == "user" for m in r["messages"]) <= hi for r in s["rows"]))
    L += ["", "Characters per row (all message contents and tool-call arguments; tool schemas not counted):", "",
          "| split | min | p10 | p50 | p90 | p99 | max | mean | total |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in splits.items():
        ch = [chars(r) for r in s["rows"]]
        L.append("| %s | %s | %.0f | %d |" % (name, " | ".join(str(pct(ch, q)) for q in (0, 10, 50, 90, 99, 100)), sum(ch) / len(ch), sum(ch)))
    L += ["", "Intents (not stored in the rows; listed for reference):", "", "| category | intent | evidence | train | eval |", "|---|---|---|---:|---:|"]
    for it in INTENTS:
        L.append("| %s | `%s` | %s | %d | %d |" % (it["category"], it["key"], it["evidence"],
                                                 sum(k == it["key"] for k, _ in splits["train"]["meta"]),
                                                 sum(k == it["key"] for k, _ in splits["eval"]["meta"])))
    return "\n".join(L)


def chars(r):
    n = 0
    for m in r["messages"]:
        n += len(m["content"])
        for tc in m.get("tool_calls", []):
            n += len(json.dumps(tc["function"]["arguments"], ensure_ascii=False))
    return n


def example_block(rows):
    cands = [r for r in rows if "tools" in r and 1500 < chars(r) < 2600]
    ex = cands[0] if cands else rows[0]
    return "```json\n%s\n```" % json.dumps(ex, ensure_ascii=False, indent=2)


def replace_block(text, name, body):
    pat = re.compile(r"(<!-- %s:begin[^>]*-->\n).*?(<!-- %s:end -->)" % (name, name), re.S)
    if not pat.search(text):
        raise SystemExit("README.md lacks the %s block" % name)
    return pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def build_all():
    pools.check_disjoint()
    seen = set()
    splits = {}
    for split, n, seed in [("train", N_TRAIN, SEED), ("eval", N_EVAL, SEED + 7919)]:
        rows, meta, disc = generate(split, n, seed, seen)
        splits[split] = {"rows": rows, "meta": meta, "discarded": disc}
    check_rows(splits)
    files = {"train.jsonl": jsonl(splits["train"]["rows"]), "eval.jsonl": jsonl(splits["eval"]["rows"])}
    readme = open(os.path.join(OUT, "README.md"), encoding="utf-8").read()
    readme = replace_block(readme, "example", example_block(splits["eval"]["rows"]))
    readme = replace_block(readme, "stats", stats_block(splits))
    files["README.md"] = readme
    return files


ID_RE = re.compile(r"^[A-Za-z0-9]{9}$")


def check_rows(splits):
    """Structure (what Mistral v0.3's and Llama 3.x's templates demand) and split hygiene."""
    for name, s in splits.items():
        for i, r in enumerate(s["rows"]):
            where = "%s row %d" % (name, i)
            msgs = r["messages"]
            body = msgs[1:] if msgs[0]["role"] == "system" else msgs
            assert body[0]["role"] == "user" and body[-1]["role"] == "assistant" and "tool_calls" not in body[-1], where
            turn = 0  # alternation of user / plain assistant turns, tool turns skipped (Mistral v0.3)
            for j, m in enumerate(body):
                if m["role"] == "tool":
                    prev = body[j - 1]
                    assert prev.get("tool_calls") and prev["tool_calls"][0]["id"] == m["tool_call_id"], where
                    continue
                if "tool_calls" in m:
                    assert len(m["tool_calls"]) == 1 and ID_RE.match(m["tool_calls"][0]["id"]), where
                    assert body[j + 1]["role"] == "tool", where
                    continue
                assert (m["role"] == "user") == (turn % 2 == 0) and m["content"].strip(), where
                turn += 1
            names = {t["function"]["name"] for t in r.get("tools", [])}
            used = {m["tool_calls"][0]["function"]["name"] for m in msgs if "tool_calls" in m}
            assert used <= names and (bool(used) == bool(names)), where
    tr_text, ev_text = jsonl(splits["train"]["rows"]), jsonl(splits["eval"]["rows"])
    ids = re.compile(r"LK-\d{6}|\b(?:HX\d)-[0-9A-F]{8}\b")
    shared = set(ids.findall(tr_text)) & set(ids.findall(ev_text)) - {"HX5-0A1B2C3D", "LK-123456"}  # the schemas' examples
    assert not shared, "customer ids / serials in both splits: %s" % sorted(shared)[:5]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate in memory; exit 1 if a committed file differs")
    args = ap.parse_args()
    files = build_all()
    stale = []
    for name, text in files.items():
        path = os.path.join(OUT, name)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old != text:
            stale.append(name)
            if not args.check:
                with open(path, "w", encoding="utf-8", newline="\n") as f:
                    f.write(text)
    if args.check:
        if stale:
            print("stale: %s (run scripts/make_support_long_data.py)" % ", ".join(stale))
            return 1
        print("datasets/support-long is up to date")
        return 0
    print("wrote %s" % (", ".join(stale) or "nothing (up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
