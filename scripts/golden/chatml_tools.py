"""Golden renders of configs/templates/chatml-tools.jinja (tests/chat_template_override.rs).

The tool rows of chat_tools.py (normalized as lora-ft reads them) and a row without tools,
rendered by transformers' `apply_chat_template(messages, tools=tools, chat_template=FILE)` with
the tokenizer of tests/fixtures/tiny-chat (SmolLM2's special tokens): the whole dialogue, and
every prefix ending before an assistant turn with `add_generation_prompt=True` (what generation
is given), with the token ids of the whole text. `line` is the row as a line of a data file (its
keys in order: the template prints the tools' parameters with `tojson`).

Usage: python scripts/golden/chatml_tools.py > tests/golden/chatml_tools.json
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from chat_tools import ROWS, normalized  # noqa: E402

from transformers import AutoTokenizer  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TEMPLATE = "configs/templates/chatml-tools.jinja"


def main():
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tests/fixtures/tiny-chat"))
    template = open(os.path.join(ROOT, TEMPLATE)).read()
    plain = {"messages": [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}]}
    cases = []
    for row in ROWS + [plain]:
        messages = normalized(row["messages"])
        tools = row.get("tools")
        render = lambda m, **kw: tok.apply_chat_template(m, tools=tools, chat_template=template, tokenize=False, **kw)
        text = render(messages)
        prompts = [render(messages[:i], add_generation_prompt=True) for i, m in enumerate(messages) if m["role"] == "assistant"]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        cases.append({"row": row, "line": json.dumps(row, ensure_ascii=False), "text": text, "prompts": prompts, "input_ids": ids})
    json.dump({"template": TEMPLATE, "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
