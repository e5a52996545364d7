"""Tokenizer folders from tests/fixtures/tokenizers (as scripts/golden/chat_templates.py builds them).
Needs transformers; not used by the generator."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
import chat_templates  # noqa: E402  (its tokenizer_dir builds the folders)

FAMILIES = {"llama-3.3": "llama3", "llama-3.2": "llama3", "mistral-v0.3": "mistral-v0.3", "qwen2.5": "qwen2.5"}


def tokenizer_dir(family):
    return chat_templates.tokenizer_dir(family, FAMILIES[family])


def load(family):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(family))


def render(tok, row, family):
    kw = {"date_string": "26 Jul 2024"} if family.startswith("llama") else {}
    return tok.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=False, **kw)
