"""Golden values for tool calling with the real chat templates (tests/data_chat_templates.rs).

Tool dialogues in a customer-service setting (tools `lookup_order`, `track_parcel`), written as
rows of a data file: `{"tools": [...], "messages": [...]}` with OpenAI-style tool calls. For every
family of scripts/golden/chat_templates.py this renders them with transformers'
`apply_chat_template(messages, tools=tools, ...)` and records:

- `text`/`prompt_text`, `input_ids` (no added special tokens), as chat_templates.py does;
- `labels`: trained tokens found independently of lora-ft, by string search on the family's turn
  markers: after an assistant header (`START`; Mistral's replies start after `[/INST]` or after
  `[/TOOL_RESULTS]`) through the next end-of-turn (`END`, inclusive), so a tool-call turn is trained
  and tool results (their own turns) are not;
- `error`: transformers' message where the template refuses the dialogue (Llama 3.x: one tool call
  per turn).

A row is given to transformers as lora-ft reads it (see README "Data"): a tool call's `arguments`
given as a JSON string is parsed into the object HF's docs ask for, and a tool-call turn's null or
missing `content` becomes "". The script checks that the latter changes no render where the
template takes null (all but Qwen3, whose `'</think>' in message.content` fails on null).

Gemma 2 and 3 have no tool support: transformers renders the tools nowhere (recorded as
`ignores_tools`); lora-ft refuses such rows.

Usage: python scripts/golden/chat_tools.py > tests/golden/chat_tools.json
"""

import copy
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))
from chat_templates import FAMILIES, tokenizer_dir  # noqa: E402

from transformers import AutoTokenizer  # noqa: E402

LOOKUP_ORDER = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order by its number: status, items, carrier and tracking number.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "The order number, e.g. \"1234\"."}},
            "required": ["order_id"],
        },
    },
}
TRACK_PARCEL = {
    "type": "function",
    "function": {
        "name": "track_parcel",
        "description": "Where a parcel is now and when it should arrive.",
        "parameters": {
            "type": "object",
            "properties": {"tracking_number": {"type": "string", "description": "The carrier's tracking number."}},
            "required": ["tracking_number"],
        },
    },
}
TOOLS = [LOOKUP_ORDER, TRACK_PARCEL]


def call(id_, name, arguments):
    return {"type": "function", "id": id_, "function": {"name": name, "arguments": arguments}}


ROWS = [
    # One call, content null (OpenAI's form), the result, the reply.
    {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Hi, what's the status of order 1234?"},
            {"role": "assistant", "content": None, "tool_calls": [call("a1B2c3D4e", "lookup_order", {"order_id": "1234"})]},
            {
                "role": "tool",
                "tool_call_id": "a1B2c3D4e",
                "name": "lookup_order",
                "content": "{\"order_id\": \"1234\", \"status\": \"shipped\", \"carrier\": \"DHL\", \"tracking_number\": \"JD0142\"}",
            },
            {"role": "assistant", "content": "Order 1234 has shipped with DHL; the tracking number is JD0142."},
        ],
    },
    # A system message, two calls in a row (arguments as a JSON string, content missing), then a
    # second user turn.
    {
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You are a terse support agent for Acme Corp. Use the tools."},
            {"role": "user", "content": "Where is the parcel of order 5521?"},
            {"role": "assistant", "tool_calls": [call("Zx9Yw8Vu7", "lookup_order", "{\"order_id\": \"5521\"}")]},
            {"role": "tool", "tool_call_id": "Zx9Yw8Vu7", "content": "{\"status\": \"shipped\", \"tracking_number\": \"JD0977\"}"},
            {"role": "assistant", "content": "", "tool_calls": [call("Q1w2E3r4T", "track_parcel", {"tracking_number": "JD0977"})]},
            {"role": "tool", "tool_call_id": "Q1w2E3r4T", "content": "{\"location\": \"Leipzig hub\", \"eta\": \"2025-03-07\"}"},
            {"role": "assistant", "content": "It is at the Leipzig hub and should arrive on 7 March."},
            {"role": "user", "content": "Thanks!"},
            {"role": "assistant", "content": "You're welcome."},
        ],
    },
    # Two calls in one turn, with text before them (Llama 3.x takes one call per turn).
    {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Can you check orders 1234 and 1235?"},
            {
                "role": "assistant",
                "content": "Checking both.",
                "tool_calls": [
                    call("k8L7m6N5b", "lookup_order", {"order_id": "1234"}),
                    call("P0o9I8u7Y", "lookup_order", {"order_id": "1235"}),
                ],
            },
            {"role": "tool", "tool_call_id": "k8L7m6N5b", "content": "{\"status\": \"delivered\"}"},
            {"role": "tool", "tool_call_id": "P0o9I8u7Y", "content": "{\"status\": \"processing\"}"},
            {"role": "assistant", "content": "1234 was delivered; 1235 is still being processed."},
        ],
    },
]

LLAMA = (("<|start_header_id|>assistant<|end_header_id|>\n\n",), "<|eot_id|>")
CHATML = (("<|im_start|>assistant\n",), "<|im_end|>")
MISTRAL = (("[/INST]", "[/TOOL_RESULTS]"), "</s>")
MARKERS = {"llama-3.2": LLAMA, "llama-3.3": LLAMA, "qwen2.5": CHATML, "qwen3": CHATML, "mistral-v0.3": MISTRAL,
           "mistral-nemo": MISTRAL}


def normalized(messages):
    """The conversation as lora-ft hands it to the template."""
    out = copy.deepcopy(messages)
    for m in out:
        if "tool_calls" in m:
            if m.get("content") is None:
                m["content"] = ""
            for c in m["tool_calls"]:
                if isinstance(c["function"]["arguments"], str):
                    c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def with_null_content(messages):
    out = copy.deepcopy(messages)
    for m in out:
        if "tool_calls" in m and m["content"] == "":
            m["content"] = None
    return out


def spans(text, starts, end_marker):
    """After each START through the next END, if no other START comes before that END."""
    found = sorted((i + len(s), s) for s in starts for i in _all(text, s))
    out = []
    for n, (begin, _) in enumerate(found):
        end = text.find(end_marker, begin)
        following = found[n + 1][0] if n + 1 < len(found) else len(text) + 1
        if end >= 0 and end < following and (not out or begin >= out[-1][1]):
            out.append((begin, end + len(end_marker)))
    return out


def _all(text, s):
    pos = 0
    while (i := text.find(s, pos)) >= 0:
        yield i
        pos = i + 1


def main():
    families = []
    for family, vocab, _, variables, _ in FAMILIES:
        folder = tokenizer_dir(family, vocab)
        tok = AutoTokenizer.from_pretrained(folder)
        cases = []
        for row in ROWS:
            messages = normalized(row["messages"])
            render = lambda m, **kw: tok.apply_chat_template(m, tools=row["tools"], tokenize=False, **variables, **kw)
            if family not in MARKERS:
                plain = tok.apply_chat_template([m for m in messages if m["role"] in ("user", "assistant")][:2], tokenize=False)
                with_tools = tok.apply_chat_template(
                    [m for m in messages if m["role"] in ("user", "assistant")][:2], tools=row["tools"], tokenize=False
                )
                cases.append({"row": row, "ignores_tools": plain == with_tools})
                continue
            try:
                text = render(messages)
            except Exception as e:  # jinja2's TemplateError from raise_exception
                cases.append({"row": row, "error": str(e)})
                continue
            if family != "qwen3":
                assert render(with_null_content(messages)) == text, (family, "null content renders differently")
            prompt = render(messages, add_generation_prompt=True)
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            found = spans(text, *MARKERS[family])
            n_assistant = sum(m["role"] == "assistant" for m in messages)
            assert len(found) == n_assistant, (family, found, n_assistant, text)
            labels = [
                tid if any(s <= a and b <= e and a < b for s, e in found) else -100
                for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])
            ]
            cases.append(
                {
                    "row": row,
                    "text": text,
                    "prompt_text": prompt,
                    "input_ids": enc["input_ids"],
                    "labels": labels,
                    "trained": [text[s:e] for s, e in found],
                }
            )
        families.append({"family": family, "vocab": vocab, "variables": variables, "cases": cases})
        shutil.rmtree(folder)
    json.dump({"families": families}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
