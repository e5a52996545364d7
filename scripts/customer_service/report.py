"""The README's generated blocks: an example row and the statistics."""

from __future__ import annotations

import json
import re

from .build import INTENTS, MAX_CHARS, Split
from .pools import SEED, SPLITS
from .tools import TOOLS


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def calls(row: dict) -> list[str]:
    return [c["function"]["name"] for m in row["messages"] for c in m.get("tool_calls") or []]


def stats_markdown(splits: dict[str, Split], prompts: list[str]) -> str:
    names = [name for name, _ in SPLITS]
    rows = {name: [json.loads(line) for line in splits[name].lines] for name in names}

    def line(label: str, f) -> str:
        return f"| {label} | " + " | ".join(str(f(n)) for n in names) + " |"

    def count(pred) -> "callable":
        return lambda n: sum(1 for r in rows[n] if pred(r))

    def users(r: dict) -> int:
        return sum(m["role"] == "user" for m in r["messages"])

    out = [f"Seed `{SEED}`. Numbers below are computed by the generator from the files it writes.", ""]
    out += ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    out.append(line("rows", lambda n: len(rows[n])))
    out.append(line("rows with a system message", count(lambda r: r["messages"][0]["role"] == "system")))
    for k in range(1, 5):
        out.append(line(f"rows with {k} user turn{'s' if k > 1 else ''}", count(lambda r, k=k: users(r) == k)))
    for k in range(0, 4):
        out.append(line(f"rows with {k} tool call{'s' if k != 1 else ''}", count(lambda r, k=k: len(calls(r)) == k)))
    out.append(line("rows where a lookup fails (unknown order number)",
                    count(lambda r: any(m["role"] == "tool" and "order not found" in m["content"]
                                        for m in r["messages"]))))
    out.append(line("tools offered per row: 2 / 3 / 4 / 5",
                    lambda n: " / ".join(str(sum(1 for r in rows[n] if len(r["tools"]) == k)) for k in (2, 3, 4, 5))))
    out.append(line("rows with non-ASCII text (é, €, £, emoji, ...)",
                    lambda n: sum(1 for x in splits[n].lines if not x.isascii())))
    out.append(line("generated candidates discarded (duplicate, or over "
                    f"{MAX_CHARS} characters)", lambda n: splits[n].discarded))
    train_openings = {next(m["content"] for m in r["messages"] if m["role"] == "user") for r in rows["train"]}
    out.append("| eval rows whose first user message also occurs in train | - | " + str(sum(
        1 for r in rows["eval"] if next(m["content"] for m in r["messages"] if m["role"] == "user")
        in train_openings)) + " |")
    out.append(line("user phrasings drawn from a list of 3+ (split between train and eval) / all user phrasings",
                    lambda n: f"{sum(k >= 3 for row in splits[n].phrasings for _, _, k in row)} / "
                              f"{sum(len(row) for row in splits[n].phrasings)}"))
    out.append("")

    out += ["Characters per row (the JSON line, tool list included):", "",
            "| split | min | p10 | p50 | p90 | max |", "|---|---:|---:|---:|---:|---:|"]
    for n in names:
        w = sorted(len(x) for x in splits[n].lines)
        out.append(f"| {n} | {w[0]} | {percentile(w, 10)} | {percentile(w, 50)} | {percentile(w, 90)} | {w[-1]} |")
    out.append("")

    out += ["Tool calls per tool (`offered`: rows whose tool list holds it, needed or as a distractor):", "",
            "| tool | calls in train | calls in eval | offered in train | offered in eval |",
            "|---|---:|---:|---:|---:|"]
    for tool in TOOLS:
        c = {n: sum(calls(r).count(tool) for r in rows[n]) for n in names}
        o = {n: sum(1 for r in rows[n] if any(t["function"]["name"] == tool for t in r["tools"])) for n in names}
        out.append(f"| `{tool}` | {c['train']} | {c['eval']} | {o['train']} | {o['eval']} |")
    out.append("")

    out += ["Intents (not stored in the rows; listed here for reference) and the tool calls their rows make:", "",
            "| category | intent | rows train | rows eval | calls train | calls eval | tools it may call |",
            "|---|---|---:|---:|---:|---:|---|"]
    for intent, (category, _, _, tools) in INTENTS.items():
        idx = {n: [i for i, x in enumerate(splits[n].intents) if x == intent] for n in names}
        ncalls = {n: sum(len(calls(rows[n][i])) for i in idx[n]) for n in names}
        out.append(f"| {category} | `{intent}` | {len(idx['train'])} | {len(idx['eval'])} | {ncalls['train']} | "
                   f"{ncalls['eval']} | " + ", ".join(f"`{t}`" for t in tools) + " |")
    out.append("")
    out.append(f"`eval_prompts.jsonl`: {len(prompts)} prompts.")
    return "\n".join(out)


def example_markdown(splits: dict[str, Split]) -> str:
    """The first short eval row with a system message and two tool calls, pretty-printed."""
    for line in splits["eval"].lines:
        row = json.loads(line)
        if row["messages"][0]["role"] == "system" and len(calls(row)) == 2 and len(line) < 2600:
            return "```json\n" + json.dumps(row, ensure_ascii=False, indent=2) + "\n```"
    raise AssertionError("no example row found in eval")


def readme_text(current: str, splits: dict[str, Split], prompts: list[str]) -> str:
    """The README with its generated sections replaced."""
    content = {"example": example_markdown(splits), "stats": stats_markdown(splits, prompts)}
    for name, text in content.items():
        begin = f"<!-- {name}:begin (generated by scripts/make_customer_service_data.py) -->"
        end = f"<!-- {name}:end -->"
        start, stop = current.index(begin) + len(begin), current.index(end)
        current = current[:start] + "\n" + text + "\n" + current[stop:]
    return current
