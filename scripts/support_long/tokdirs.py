"""Tokenizer folders from tests/fixtures/tokenizers (as scripts/golden/chat_templates.py builds them).
Needs transformers; not used by the generator."""

import gzip
import os
import shutil
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "tokenizers")
FAMILIES = {"llama-3.3": "llama3", "llama-3.2": "llama3", "mistral-v0.3": "mistral-v0.3", "qwen2.5": "qwen2.5"}


def tokenizer_dir(family):
    out = tempfile.mkdtemp(prefix="support-long-%s-" % family)
    with gzip.open(os.path.join(ROOT, "vocab", "%s.tokenizer.json.gz" % FAMILIES[family])) as f:
        open(os.path.join(out, "tokenizer.json"), "wb").write(f.read())
    for name in os.listdir(os.path.join(ROOT, family)):
        src = os.path.join(ROOT, family, name)
        if name.endswith(".gz"):
            with gzip.open(src) as f:
                open(os.path.join(out, name[:-3]), "wb").write(f.read())
        else:
            shutil.copy(src, out)
    return out


def load(family):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(family))


def render(tok, row, family):
    kw = {"date_string": "26 Jul 2024"} if family.startswith("llama") else {}
    return tok.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=False, **kw)
