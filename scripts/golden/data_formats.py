"""Fixtures of lora-ft's dataset formats (tests/data_formats.rs): the same rows as JSON Lines and
as Parquet, and the `messages` JSON Lines each format's rows must read as.

For every format F, tests/fixtures/formats/ gets
  F.jsonl           the rows, one JSON object per line
  F.parquet         the same rows written by pyarrow (row groups of 2 rows, so the last row is
                    in a second group; each file another codec: snappy, zstd, gzip, lz4)
  F.expected.jsonl  the conversations as `messages` rows, written by hand below (not derived)
and bad/*.parquet holds one malformed row each (the test checks file:row_group:row and field).

Usage: python scripts/golden/data_formats.py   (pyarrow; written with pyarrow 26.0.1)
"""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "formats")


def msg(role, content):
    return {"role": role, "content": content}


def turn(frm, value):
    return {"from": frm, "value": value}


# (format, codec, [(row, messages)]): each row with the conversation it must become.
CASES = [
    ("messages", "zstd", [
        ({"messages": [msg("user", "Where is my order #1234?"), msg("assistant", "It ships on Friday.")]},
         [msg("user", "Where is my order #1234?"), msg("assistant", "It ships on Friday.")]),
        ({"messages": [msg("system", "You are a terse support agent."), msg("user", "Can I get a refund?"),
                       msg("assistant", "Yes: within 30 days."), msg("user", "And for sale items?"),
                       msg("assistant", "Those too — café vouchers excepted. 🎉")]},
         [msg("system", "You are a terse support agent."), msg("user", "Can I get a refund?"),
          msg("assistant", "Yes: within 30 days."), msg("user", "And for sale items?"),
          msg("assistant", "Those too — café vouchers excepted. 🎉")]),
        ({"messages": [msg("user", "Hi"), msg("assistant", "Hello!")]},
         [msg("user", "Hi"), msg("assistant", "Hello!")]),
    ]),
    ("sharegpt", "snappy", [
        ({"conversations": [turn("human", "Where is my order #1234?"), turn("gpt", "It ships on Friday.")]},
         [msg("user", "Where is my order #1234?"), msg("assistant", "It ships on Friday.")]),
        ({"conversations": [turn("system", "You are a terse support agent."), turn("human", "Can I get a refund?"),
                            turn("gpt", "Yes: within 30 days."), turn("user", "And for sale items?"),
                            turn("assistant", "Those too — café vouchers excepted. 🎉")]},
         [msg("system", "You are a terse support agent."), msg("user", "Can I get a refund?"),
          msg("assistant", "Yes: within 30 days."), msg("user", "And for sale items?"),
          msg("assistant", "Those too — café vouchers excepted. 🎉")]),
        ({"system": "Answer in French.", "conversations": [turn("human", "Hello"), turn("gpt", "Bonjour !")]},
         [msg("system", "Answer in French."), msg("user", "Hello"), msg("assistant", "Bonjour !")]),
    ]),
    ("alpaca", "gzip", [
        ({"instruction": "Summarize the refund policy.", "input": "", "output": "Refunds within 30 days."},
         [msg("user", "Summarize the refund policy."), msg("assistant", "Refunds within 30 days.")]),
        ({"instruction": "Translate to German.", "input": "Where is my parcel?", "output": "Wo ist mein Paket?"},
         [msg("user", "Translate to German.\n\nWhere is my parcel?"), msg("assistant", "Wo ist mein Paket?")]),
        ({"instruction": "Greet the customer.", "output": "Hello! How can I help?", "system": "You are polite."},
         [msg("system", "You are polite."), msg("user", "Greet the customer."),
          msg("assistant", "Hello! How can I help?")]),
    ]),
    ("prompt_completion", "lz4", [
        ({"prompt": "Customer: my card was charged twice.", "completion": "Agent: I refunded the duplicate."},
         [msg("user", "Customer: my card was charged twice."), msg("assistant", "Agent: I refunded the duplicate.")]),
        ({"prompt": "Ünïcode question?", "completion": " Yes — ✓"},
         [msg("user", "Ünïcode question?"), msg("assistant", " Yes — ✓")]),
        ({"prompt": "", "completion": "An empty prompt."},
         [msg("user", ""), msg("assistant", "An empty prompt.")]),
    ]),
    ("prompt_completion_chat", "snappy", [
        ({"prompt": [msg("system", "You are a terse support agent."), msg("user", "Can I get a refund?")],
          "completion": [msg("assistant", "Yes: within 30 days.")]},
         [msg("system", "You are a terse support agent."), msg("user", "Can I get a refund?"),
          msg("assistant", "Yes: within 30 days.")]),
        ({"prompt": [msg("user", "Where is my order #1234?")], "completion": [msg("assistant", "It ships on Friday.")]},
         [msg("user", "Where is my order #1234?"), msg("assistant", "It ships on Friday.")]),
        ({"prompt": [msg("user", "Two replies?")],
          "completion": [msg("assistant", "One."), msg("assistant", "Two.")]},
         [msg("user", "Two replies?"), msg("assistant", "One."), msg("assistant", "Two.")]),
    ]),
]

# One malformed row each: (file name, rows, pyarrow schema or None to infer).
CONV = pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))
GOOD_SHAREGPT = {"conversations": [turn("human", "Q"), turn("gpt", "A")]}
BAD = [
    # the third row: row group 1, row 0
    ("sharegpt_unknown_from", [GOOD_SHAREGPT, GOOD_SHAREGPT,
                               {"conversations": [turn("human", "Q"), turn("bot", "A")]}], None),
    ("sharegpt_empty", [GOOD_SHAREGPT, {"conversations": []}], pa.schema([("conversations", CONV)])),
    # a struct field that some row sets: null elsewhere is no key, a value is refused
    ("sharegpt_weight", [{"conversations": [{"from": "human", "value": "Q", "weight": None},
                                            {"from": "gpt", "value": "A", "weight": None}]},
                         {"conversations": [{"from": "human", "value": "Q", "weight": 0},
                                            {"from": "gpt", "value": "A", "weight": 1}]}], None),
    ("alpaca_missing_output", [{"instruction": "I", "input": "", "output": "O"},
                               {"instruction": "I", "input": "", "output": None}], None),
    ("messages_unknown_role", [{"messages": [msg("user", "Q"), msg("bot", "A")]}], None),
    ("messages_content_type", [{"messages": [{"role": "assistant", "content": 7}]}], None),
    ("prompt_completion_mixed", [{"prompt": "Q", "completion": [msg("assistant", "A")]}], None),
]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def table_of(rows, schema=None):
    """Every key of any row is a column (from_pylist would take only the first row's keys)."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    return pa.Table.from_pylist([{k: row.get(k) for k in keys} for row in rows], schema=schema)


def main():
    os.makedirs(os.path.join(OUT, "bad"), exist_ok=True)
    for name, codec, pairs in CASES:
        rows = [row for row, _ in pairs]
        write_jsonl(os.path.join(OUT, f"{name}.jsonl"), rows)
        write_jsonl(os.path.join(OUT, f"{name}.expected.jsonl"), [{"messages": m} for _, m in pairs])
        table = table_of(rows)
        pq.write_table(table, os.path.join(OUT, f"{name}.parquet"), row_group_size=2, compression=codec)
    for name, rows, schema in BAD:
        table = table_of(rows, schema)
        pq.write_table(table, os.path.join(OUT, "bad", f"{name}.parquet"), row_group_size=2)


if __name__ == "__main__":
    main()
