"""Golden values for the real chat templates of the model families (tests/data_chat_templates.rs).

For every family under tests/fixtures/tokenizers/ (see the README there for the sources) this
assembles the tokenizer folder (tokenizer.json from vocab/<vocab>.tokenizer.json.gz, the family's
tokenizer_config.json, and chat_template.jinja where llama.cpp's copy of the template is used),
loads it with transformers' AutoTokenizer, and for several dialogues records:

- `text`/`prompt_text`: `apply_chat_template(messages, tokenize=False[, add_generation_prompt])`,
  with the family's pinned template variables (Llama 3.2 prints `date_string`, which transformers
  otherwise takes from `strftime_now`);
- `input_ids`: the HF tokenizer on that text, without added special tokens;
- `labels`: trained tokens found independently of lora-ft's prefix rendering, by string search on
  the family's own turn markers: from just after the assistant header (`START`) through the next
  end-of-turn marker (`END`, inclusive); a token is trained iff its character offsets lie inside a
  span. The id where trained, -100 elsewhere (the HF convention).

Rows whose system message the template refuses are rendered with `fold_system`: the system text
folded into the first user turn as "{system}\n\n{user}" (lora-ft's `data.system_message = "fold"`).
Mistral's templates (v0.3, Nemo) accept a system message but write it only into the last user turn
of a conversation that ends with one, so a training row that ends with a reply loses it; for
Mistral v0.3 the folded rendering of each row with a system message is recorded as well.
Rows the template refuses record transformers' error message under `error`.

Usage: python scripts/golden/chat_templates.py > tests/golden/chat_templates.json
"""

import gzip
import json
import os
import shutil
import sys
import tempfile

from transformers import AutoTokenizer

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "tokenizers")

LLAMA = ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")
CHATML = ("<|im_start|>assistant\n", "<|im_end|>")
MISTRAL = ("[/INST]", "</s>")
GEMMA = ("<start_of_turn>model\n", "<end_of_turn>")

# family folder, vocabulary, (START, END), template variables, does the template refuse system?
# Families whose golden also holds the folded rendering of every row with a system message.
FOLD_TOO = {"mistral-v0.3"}

FAMILIES = [
    ("llama-3.2", "llama3", LLAMA, {"date_string": "05 Mar 2025"}, False),
    ("llama-3.3", "llama3", LLAMA, {}, False),
    ("qwen2.5", "qwen2.5", CHATML, {}, False),
    ("qwen3", "qwen3", CHATML, {}, False),
    ("mistral-v0.3", "mistral-v0.3", MISTRAL, {}, False),
    ("mistral-nemo", "tekken", MISTRAL, {}, False),
    ("gemma-2", "gemma2", GEMMA, {}, True),
    ("gemma-3", "gemma3", GEMMA, {}, False),
]

SYSTEM = {"role": "system", "content": "You are a terse support agent for Acme Corp."}
DIALOGUES = [
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ],
    [
        SYSTEM,
        {"role": "user", "content": "My order #1234 hasn't arrived."},
        {"role": "assistant", "content": "Sorry! I've re-shipped order #1234; it arrives Friday."},
    ],
    # Multi-turn with a system message: every assistant turn is trained.
    [
        SYSTEM,
        {"role": "user", "content": "Can I get a refund?"},
        {"role": "assistant", "content": "Yes, within 30 days of purchase."},
        {"role": "user", "content": "It's been 45 days."},
        {"role": "assistant", "content": "Then I can offer store credit instead."},
        {"role": "user", "content": "OK, do that."},
        {"role": "assistant", "content": "Done: 25.00 EUR of credit is on your account."},
    ],
    # Multi-turn without system; unicode, emoji, code and JSON; leading/trailing whitespace.
    [
        {"role": "user", "content": "Привет! 👋 ¿Qué tal? 日本語は話せますか？"},
        {"role": "assistant", "content": "Да! 😊 Sí, muy bien. はい、少し話せます。🇫🇷 naïve café"},
        {"role": "user", "content": "List two colors as JSON.\n\n\tPlease."},
        {"role": "assistant", "content": " {\"colors\": [\"red\", \"blue\"],\n  \"note\": \"tab\\there\"}\n"},
    ],
    # A trailing user turn (with a system message) is not trained.
    [
        SYSTEM,
        {"role": "user", "content": "Show me Jinja: {{ x }} and {% if y %}"},
        {"role": "assistant", "content": "Here: `{{ x }}` prints x, `{% if y %}` starts a block."},
        {"role": "user", "content": "Thanks"},
    ],
]

# Refused by templates that demand alternation (Mistral, Gemma).
NOT_ALTERNATING = [
    {"role": "user", "content": "Hi"},
    {"role": "user", "content": "Anyone there?"},
    {"role": "assistant", "content": "Yes."},
]


def fold_system(messages):
    if messages[0]["role"] != "system":
        return messages
    system, first, rest = messages[0], messages[1], messages[2:]
    folded = {"role": first["role"], "content": system["content"] + "\n\n" + first["content"]}
    return [folded] + rest


def spans(text, start_marker, end_marker):
    """Assistant replies: after each START through the next END, if it comes before the next START."""
    out, pos = [], 0
    while (start := text.find(start_marker, pos)) >= 0:
        begin = start + len(start_marker)
        end = text.find(end_marker, begin)
        following = text.find(start_marker, begin)
        if end < 0 or (0 <= following < end):
            pos = begin
            continue
        out.append((begin, end + len(end_marker)))
        pos = end + len(end_marker)
    return out


def tokenizer_dir(family, vocab):
    out = tempfile.mkdtemp(prefix=f"golden-{family}-")
    with gzip.open(os.path.join(ROOT, "vocab", f"{vocab}.tokenizer.json.gz")) as f:
        open(os.path.join(out, "tokenizer.json"), "wb").write(f.read())
    for name in os.listdir(os.path.join(ROOT, family)):
        src = os.path.join(ROOT, family, name)
        if name.endswith(".gz"):
            with gzip.open(src) as f:
                open(os.path.join(out, name[:-3]), "wb").write(f.read())
        else:
            shutil.copy(src, out)
    return out


def main():
    families = []
    for family, vocab, (start, end), variables, refuses_system in FAMILIES:
        folder = tokenizer_dir(family, vocab)
        tok = AutoTokenizer.from_pretrained(folder)
        cases = []
        runs = [(m, refuses_system and m[0]["role"] == "system") for m in DIALOGUES]
        if family in FOLD_TOO:
            runs += [(m, True) for m in DIALOGUES if m[0]["role"] == "system"]
        for messages, fold in runs:
            if fold and refuses_system:
                try:
                    tok.apply_chat_template(messages, tokenize=False, **variables)
                    raise AssertionError(f"{family}: expected the template to refuse a system message")
                except Exception as e:  # jinja2's TemplateError from raise_exception
                    cases.append({"messages": messages, "error": str(e)})
            rendered = fold_system(messages) if fold else messages
            text = tok.apply_chat_template(rendered, tokenize=False, **variables)
            prompt = tok.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True, **variables)
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
            found = spans(text, start, end)
            n_assistant = sum(m["role"] == "assistant" for m in messages)
            assert len(found) == n_assistant, (family, len(found), n_assistant, text)
            labels = [
                tid if any(s <= a and b <= e and a < b for s, e in found) else -100
                for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])
            ]
            cases.append(
                {
                    "messages": messages,
                    "fold_system": fold,
                    "text": text,
                    "prompt_text": prompt,
                    "input_ids": enc["input_ids"],
                    "labels": labels,
                }
            )
        if family.startswith(("mistral", "gemma")):
            try:
                tok.apply_chat_template(NOT_ALTERNATING, tokenize=False, **variables)
                raise AssertionError(f"{family}: expected the template to refuse non-alternating roles")
            except Exception as e:
                cases.append({"messages": NOT_ALTERNATING, "error": str(e)})
        families.append({"family": family, "vocab": vocab, "variables": variables, "cases": cases})
        shutil.rmtree(folder)
    json.dump({"families": families}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
