"""The support assistant's tools (OpenAI / Hugging Face function schemas) and the fake backend
that answers them: every result is built from the conversation's own made-up order or account,
so whatever the assistant says afterwards can be traced back to a tool result."""

from __future__ import annotations

import datetime as dt
import json
import random

S = {"type": "string"}


def _fn(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


ISSUES = ["lost", "damaged", "wrong_item", "defect", "double_charge"]
REQUESTS = ["deletion", "data_export", "recovery", "cancel_membership"]

# Terse descriptions and minimal schemas: every row carries a few of these, and the quickstart
# trains a 135M model on the CPU, so each token counts.
TOOLS = {
    "lookup_order": _fn("lookup_order", "Look up an order.",
                        {"order_id": {"type": "string", "description": "FH- and 7 digits"}}, ["order_id"]),
    "track_parcel": _fn("track_parcel", "Get a parcel's latest carrier scan.",
                        {"tracking_number": S}, ["tracking_number"]),
    "cancel_order": _fn("cancel_order", "Cancel an order that has not shipped.", {"order_id": S}, ["order_id"]),
    "update_address": _fn("update_address", "Change an unshipped order's address.",
                          {"order_id": S, "address": S}, ["order_id", "address"]),
    "start_return": _fn("start_return", "Start a return; emails a prepaid label.",
                        {"order_id": S, "items": {"type": "array", "items": S}, "reason": S},
                        ["order_id", "items", "reason"]),
    "check_refund": _fn("check_refund", "Get the refund status of an order.", {"order_id": S}, ["order_id"]),
    "open_claim": _fn("open_claim", "Claim for a lost, damaged or wrong item, a defect or a double charge.",
                      {"order_id": S, "issue": S,
                       "resolution": {"type": "string", "enum": ["replacement", "refund", "review"]}},
                      ["order_id", "issue", "resolution"]),
    "check_promo_code": _fn("check_promo_code", "Check a promo code's terms.", {"code": S}, ["code"]),
    "send_password_reset": _fn("send_password_reset", "Email a password reset link.", {"email": S}, ["email"]),
    "lookup_account": _fn("lookup_account", "Get an account's membership and 2FA phone.",
                          {"email": S}, ["email"]),
    "account_request": _fn("account_request", "Request for the security or privacy team.",
                           {"email": S, "type": {"type": "string", "enum": REQUESTS}}, ["email", "type"]),
    "escalate_to_human": _fn("escalate_to_human", "Hand the conversation to a human agent.",
                             {"summary": S, "reason": S}, ["summary"]),
}


def all_tools() -> list[dict]:
    """The full list, for `lora-ft chat --tools` (datasets/customer-service/tools.json)."""
    return list(TOOLS.values())


def row_tools(rng: random.Random, needed: tuple[str, ...]) -> list[dict]:
    """The tools a flow needs plus 1-2 distractors, shuffled."""
    others = [name for name in TOOLS if name not in needed]
    names = list(needed) + rng.sample(others, 1 if rng.random() < 0.85 else 2)
    rng.shuffle(names)
    return [TOOLS[name] for name in names]


def compact(result: dict) -> str:
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


def iso(d: dt.date | None) -> str | None:
    return d.isoformat() if d else None


def order_record(c, o) -> dict:
    """lookup_order's answer for order `o` (fields that do not apply are left out)."""
    rec = {"order_id": o.number, "status": o.status, "placed": iso(o.placed),
           "items": [{"name": name, "variant": var, "price": price} for name, _, price, var in o.items],
           "total": round(o.total, 2), "currency": c.currency_code()}
    if o.shipped:
        rec.update(carrier=o.carrier, tracking=o.tracking, shipped=iso(o.shipped))
    if o.eta and not o.delivered:
        rec["eta"] = iso(o.eta)
    if o.delivered:
        rec["delivered"] = iso(o.delivered)
        rec["return_by"] = iso(o.delivered + dt.timedelta(days=30))
    rec.update(o.extra)
    return rec


NOT_FOUND = {"error": "order not found"}
