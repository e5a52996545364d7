"""Building the splits and the eval prompts, and the checks they must pass."""

from __future__ import annotations

import json
import random
import re
from typing import NamedTuple

from . import flows_account as acc
from . import flows_orders as ords
from . import flows_returns as ret
from .convo import Convo
from .pools import COMPANY, MONTHS, SEED, SPLITS, Pools
from .tools import TOOLS, row_tools

INTENTS = {
    # name: (category, flow, weight out of 600 training rows, the tools the flow may call; the first
    # is offered on the rows that call none)
    "order_status": ("orders", ords.flow_order_status, 50, ("lookup_order",)),
    "cancel_order": ("orders", ords.flow_cancel_order, 34, ("cancel_order",)),
    "address_change": ("orders", ords.flow_address_change, 28, ("update_address",)),
    "late_delivery": ("delivery", ords.flow_late_delivery, 38, ("lookup_order", "track_parcel", "open_claim")),
    "lost_package": ("delivery", ords.flow_lost_package, 32, ("open_claim",)),
    "wrong_item": ("delivery", ords.flow_wrong_item, 32, ("lookup_order", "open_claim")),
    "damaged_item": ("delivery", ords.flow_damaged_item, 32, ("open_claim",)),
    "return_request": ("returns & refunds", ret.flow_return_request, 48, ("lookup_order", "start_return")),
    "refund_status": ("returns & refunds", ret.flow_refund_status, 32, ("check_refund",)),
    "warranty_claim": ("returns & refunds", ret.flow_warranty_claim, 28, ("lookup_order", "open_claim")),
    "password_reset": ("accounts", acc.flow_password_reset, 30, ("send_password_reset",)),
    "two_factor": ("accounts", acc.flow_two_factor, 24, ("lookup_account", "account_request")),
    "email_change": ("accounts", acc.flow_email_change, 22, ("account_request",)),
    "account_deletion": ("accounts", acc.flow_account_deletion, 24, ("account_request",)),
    "double_charge": ("billing", ret.flow_double_charge, 28, ("lookup_order", "open_claim")),
    "promo_code": ("billing", ret.flow_promo_code, 30, ("check_promo_code",)),
    "subscription_cancel": ("billing", acc.flow_subscription_cancel, 24, ("lookup_account", "account_request")),
    "escalation_human": ("escalation", ret.flow_escalation_human, 26, ("escalate_to_human",)),
    "escalation_legal": ("escalation", ret.flow_escalation_legal, 20, ("escalate_to_human",)),
    "escalation_repeated": ("escalation", ret.flow_escalation_repeated, 18, ("escalate_to_human",)),
}

SYSTEM_SHARE = 0.85  # the rest of the rows have no system message
MAX_CHARS = 3000  # serialized row, tools included: a stand-in for the token budget (~1000 tokens)
EVAL_STREAM = 1_000_003


def quotas(n: int) -> dict[str, int]:
    """Split n rows over the intents in proportion to their weights (largest remainder)."""
    total = sum(w for _, _, w, _ in INTENTS.values())
    exact = {name: n * w / total for name, (_, _, w, _) in INTENTS.items()}
    counts = {name: int(x) for name, x in exact.items()}
    by_remainder = sorted(exact, key=lambda name: (-(exact[name] - counts[name]), name))
    for name in by_remainder[: n - sum(counts.values())]:
        counts[name] += 1
    return counts


def serialize(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False)


def one_conversation(rng: random.Random, pools: Pools, used_ids: set, split: str, intent: str) -> tuple[dict, Convo]:
    c = Convo(rng, pools, used_ids, split)
    c.greeted = c.maybe(0.05)
    if c.greeted:
        c.user(c.say(["hi", "Hello?", "Hi there 👋", "hey", "Good afternoon"]))
        c.bot(c.pick([f"Hi! Thanks for contacting {COMPANY}. How can I help you today?",
                      "Hello! What can I help you with today?"]))
    INTENTS[intent][1](c)
    messages = c.to_row(with_system=c.maybe(SYSTEM_SHARE))
    # the tools the dialogue calls (or, where it calls none, the intent's main tool) + distractors
    called = [t["function"]["name"] for m in messages for t in m.get("tool_calls") or []]
    needed = tuple(dict.fromkeys(called)) or INTENTS[intent][3][:1]
    return {"messages": messages, "tools": row_tools(rng, needed)}, c


class Split(NamedTuple):
    lines: list[str]  # serialized rows
    intents: list[str]  # the intent of each row
    phrasings: list[list[tuple[str, int, int]]]  # the user phrasings of each row
    discarded: int  # candidates thrown away: duplicate, or longer than MAX_CHARS


def generate_split(split: str, n: int, used_ids: set, seen: set) -> Split:
    """`seen` holds every row of earlier splits, so no row is repeated within or across splits."""
    rng = random.Random(SEED + (0 if split == "train" else EVAL_STREAM))
    pools = Pools(split)
    schedule = [name for name, q in quotas(n).items() for _ in range(q)]
    rng.shuffle(schedule)
    out = Split([], [], [], 0)
    discarded = 0
    for intent in schedule:
        for _ in range(100):
            row, c = one_conversation(rng, pools, used_ids, split, intent)
            line = serialize(row)
            if line not in seen and len(line) <= MAX_CHARS:
                break
            discarded += 1
        else:
            raise RuntimeError(f"could not generate a valid {intent} conversation for {split}")
        seen.add(line)
        out.lines.append(line)
        out.intents.append(intent)
        out.phrasings.append(c.phrasings)
    return out._replace(discarded=discarded)


# (intent, what the assistant's next move must be) for datasets/customer-service/eval_prompts.jsonl
PROMPT_SPECS = [
    ("order_status", "call"), ("order_status", "call"), ("late_delivery", "call"), ("wrong_item", "call"),
    ("return_request", "call"), ("cancel_order", "call"), ("double_charge", "call"), ("promo_code", "call"),
    ("refund_status", "ask"), ("order_status", "ask"), ("warranty_claim", "ask"), ("email_change", "policy"),
]


def next_move(messages: list[dict]) -> str:
    """What the assistant does right after the first user message of a generated dialogue."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "user")
    reply = messages[first + 1]
    if reply.get("tool_calls"):
        return "call"
    if "order number" in reply["content"] or "FH-" in reply["content"]:
        return "ask"
    return "policy" if not any(m.get("tool_calls") for m in messages) else "other"


def eval_prompts(used_ids: set) -> list[str]:
    """First user turns of eval-side dialogues (eval pools, held-out phrasings, their own random
    stream): 9 where the right move is a tool call or asking for the order number, 1 policy question."""
    rng = random.Random(SEED + 2 * EVAL_STREAM)
    pools = Pools("eval")
    lines = []
    for intent, want in PROMPT_SPECS:
        for _ in range(200):
            row, c = one_conversation(rng, pools, used_ids, "eval", intent)
            msgs = row["messages"]
            if not c.greeted and next_move(msgs) == want:
                head = msgs[:2] if msgs[0]["role"] == "system" else msgs[:1]
                lines.append(serialize({"messages": head, "tools": row["tools"]}))
                break
        else:
            raise RuntimeError(f"no eval prompt for {intent} / {want}")
    return lines


def build() -> tuple[dict[str, Split], list[str]]:
    used_ids: set = set()
    seen: set = set()
    splits = {name: generate_split(name, n, used_ids, seen) for name, n in SPLITS}
    prompts = eval_prompts(used_ids)
    verify(splits, prompts)
    return splits, prompts


# ---------------------------------------------------------------------------------------------
# Checks.
# ---------------------------------------------------------------------------------------------

CALL_ID = re.compile(r"^[A-Za-z0-9]{9}$")
FACTS = re.compile(r"\b(?:FH|CS|RF|RT|WR)-\d+\b|\b(?:SWL|MP|CBX)\d{8,9}\b|\b\w\*{4}@example\.\w+"
                   r"|ending in \d+|\b(?:" + "|".join(MONTHS) + r") \d{1,2}\b")
MONEY = re.compile(r"[$£€]([\d,]+(?:\.\d\d)?)")


def grounded(fact: str, source: str) -> bool:
    """Whether a fact the assistant states appears in what it was told (user text, tool results)."""
    month = re.fullmatch(r"(" + "|".join(MONTHS) + r") (\d{1,2})", fact)
    if fact.startswith("ending in "):
        return fact[len("ending in "):] in source
    if month:
        iso = f"-{MONTHS.index(month[1]) + 1:02d}-{int(month[2]):02d}"
        return iso in source or fact in source
    return fact in source


def check_row(row: dict) -> None:
    """Schema, tool-call shape, and that every fact the assistant states was given to it."""
    assert list(row) == ["messages", "tools"], list(row)
    names = {t["function"]["name"] for t in row["tools"]}
    assert names <= set(TOOLS) and len(names) == len(row["tools"])
    msgs = row["messages"]
    body = msgs[1:] if msgs[0]["role"] == "system" else msgs
    assert body[0]["role"] == "user" and body[-1]["role"] == "assistant" and not body[-1].get("tool_calls")
    source, user_text, pending = (msgs[0]["content"] if msgs[0]["role"] == "system" else ""), "", {}
    for prev, m in zip([None] + body[:-1], body):
        role = m["role"]
        if role == "user":
            assert prev is None or prev["role"] == "assistant" and not prev.get("tool_calls"), "user after call"
            assert m["content"].strip()
            source += "\n" + m["content"]
            user_text += "\n" + m["content"]
        elif role == "tool":
            assert m["tool_call_id"] in pending and pending.pop(m["tool_call_id"]) == m["name"]
            source += "\n" + m["content"]
        elif m.get("tool_calls"):
            assert m["content"] == "" and prev["role"] in ("user", "tool") and not pending
            for call in m["tool_calls"]:
                fn = call["function"]
                assert CALL_ID.match(call["id"]) and fn["name"] in names, call
                for key in ("order_id", "email", "code", "address"):
                    if key in fn["arguments"]:
                        assert fn["arguments"][key] in user_text, f"{fn} not given by the customer"
                if "tracking_number" in fn["arguments"]:
                    assert fn["arguments"]["tracking_number"] in source
                pending[call["id"]] = fn["name"]
        else:
            assert role == "assistant" and m["content"].strip() and not pending
            assert prev["role"] in ("user", "tool"), "two assistant texts in a row"
            for fact in FACTS.findall(m["content"]):
                assert grounded(fact, source), f"ungrounded {fact!r} in: {m['content']}"
            numbers = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", source.replace(",", ""))}
            for amount in MONEY.findall(m["content"]):
                assert float(amount.replace(",", "")) in numbers, f"ungrounded amount {amount} in: {m['content']}"
    assert not pending


def verify(splits: dict[str, Split], prompts: list[str]) -> None:
    """Fail loudly if the splits overlap or a row breaks the schema or states an ungrounded fact."""
    train, held_out = Pools("train"), Pools("eval")
    for attr in ("first", "last", "products", "promos", "streets"):
        shared = [x for x in getattr(held_out, attr) if x in getattr(train, attr)]
        if shared:
            raise AssertionError(f"eval pool {attr} overlaps train: {shared}")
    all_lines = [line for split in splits.values() for line in split.lines]
    if len(set(all_lines)) != len(all_lines):
        raise AssertionError("duplicate rows within or across splits")
    train_text = "\n".join(splits["train"].lines)
    for line in splits["eval"].lines + prompts:
        for ident in re.findall(r"\b(?:FH|CS|RF|RT|WR)-\d+\b", line):
            if ident in train_text:
                raise AssertionError(f"eval identifier {ident} also appears in train")
    # held-out phrasings: no phrasing (a list's alternative, by the flow line that wrote it) of
    # an eval row occurs in train, where the list had 3 or more
    train_used = {(site, i) for row in splits["train"].phrasings for site, i, n in row if n >= 3}
    for row in splits["eval"].phrasings:
        for site, i, n in row:
            if n >= 3 and (site, i) in train_used:
                raise AssertionError(f"eval phrasing {site} #{i} also used in train")
    for split in splits.values():
        for line in split.lines:
            try:
                check_row(json.loads(line))
            except AssertionError as e:
                raise AssertionError(f"{e}\nrow: {line[:300]}") from None
    for line in prompts:
        row = json.loads(line)
        assert row["messages"][-1]["role"] == "user" and list(row) == ["messages", "tools"]
