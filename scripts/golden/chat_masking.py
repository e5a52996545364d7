"""Golden values for lora-ft's chat masking (tests/data_chat_masking.rs).

Renders conversations with transformers' own `apply_chat_template` (Jinja2), tokenizes with the
HF tokenizer, and labels tokens independently of lora-ft's algorithm: for a ChatML template the
trained span of each assistant turn is found by string search, from just after
"<|im_start|>assistant\n" through the next "<|im_end|>" (inclusive); a token is trained iff its
character offsets lie inside a span. Labels follow HF: the token id where trained, -100 elsewhere.

Usage: python scripts/golden/chat_masking.py [TOKENIZER_DIR] > tests/golden/chat_masking.json
TOKENIZER_DIR defaults to $LORA_FT_CACHE/smollm2-hf (or ~/.cache/lora-ft/smollm2-hf).
"""

import json
import os
import sys

from transformers import AutoTokenizer

CONVERSATIONS = [
    # No system message: the SmolLM2 template inserts its default system prompt.
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ],
    [
        {"role": "system", "content": "You are a terse support agent."},
        {"role": "user", "content": "My order #1234 hasn't arrived."},
        {"role": "assistant", "content": "Sorry! I've re-shipped order #1234; it arrives Friday."},
    ],
    # Multi-turn: every assistant turn is trained, user turns are not.
    [
        {"role": "system", "content": "You help with refunds."},
        {"role": "user", "content": "Can I get a refund?"},
        {"role": "assistant", "content": "Yes, within 30 days of purchase."},
        {"role": "user", "content": "It's been 45 days."},
        {"role": "assistant", "content": "Then I can offer store credit instead."},
        {"role": "user", "content": "OK, do that."},
        {"role": "assistant", "content": "Done: 25.00 EUR of credit is on your account."},
    ],
    # Unicode and emoji (multi-byte characters split across byte-level BPE tokens).
    [
        {"role": "user", "content": "Привет! 👋 ¿Qué tal? 日本語は話せますか？"},
        {"role": "assistant", "content": "Да! 😊 Sí, muy bien. はい、少し話せます。🇫🇷 naïve café"},
    ],
    # Template syntax inside content is data, not template; a trailing user turn is not trained.
    [
        {"role": "user", "content": "Show me Jinja: {{ x }} and {% if y %}"},
        {"role": "assistant", "content": " Here: `{{ x }}` prints x, `{% if y %}` starts a block.\n"},
        {"role": "user", "content": "Thanks"},
    ],
    # Whitespace, quotes, code and JSON in replies.
    [
        {"role": "system", "content": "Answer in JSON."},
        {"role": "user", "content": "List two colors.\n\n\tPlease."},
        {"role": "assistant", "content": "{\"colors\": [\"red\", \"blue\"],\n  \"note\": \"tab\\there\"}"},
        {"role": "user", "content": "And in Python?"},
        {"role": "assistant", "content": "```python\ncolors = ['red', 'blue']\nprint(colors)\n```"},
    ],
]

START, END = "<|im_start|>assistant\n", "<|im_end|>"


def assistant_spans(text):
    spans, pos = [], 0
    while (start := text.find(START, pos)) >= 0:
        begin = start + len(START)
        end = text.index(END, begin) + len(END)
        spans.append((begin, end))
        pos = end
    return spans


def main():
    default_dir = os.path.join(
        os.environ.get("LORA_FT_CACHE", os.path.expanduser("~/.cache/lora-ft")), "smollm2-hf"
    )
    tok = AutoTokenizer.from_pretrained(sys.argv[1] if len(sys.argv) > 1 else default_dir)
    cases = []
    for messages in CONVERSATIONS:
        text = tok.apply_chat_template(messages, tokenize=False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = assistant_spans(text)
        n_assistant = sum(m["role"] == "assistant" for m in messages)
        # The trailing user turn of case 5 opens no assistant span.
        assert len(spans) == n_assistant, (len(spans), n_assistant)
        labels = [
            tid if any(s <= a and b <= e for s, e in spans) else -100
            for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])
        ]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        cases.append(
            {
                "messages": messages,
                "text": text,
                "prompt_text": prompt,
                "input_ids": enc["input_ids"],
                "labels": labels,
            }
        )
    json.dump({"tokenizer_dir": "smollm2-hf", "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
