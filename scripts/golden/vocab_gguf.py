"""Vocabulary-only GGUF files of the real Llama 3, Qwen2.5 and Mistral Nemo (Tekken) tokenizers,
written as llama.cpp's `convert_hf_to_gguf.py --vocab-only` writes its `models/ggml-vocab-*.gguf`
(the binary files are not readable from here; their `.inp`/`.out` test pairs are committed beside
them in tests/fixtures/vocab-gguf/).

For each vocabulary this follows `TextModel.get_vocab_base` + `_set_vocab_gpt2`:
`tokenizer.ggml.model = "gpt2"`, `tokenizer.ggml.pre` as llama.cpp names that pre-tokenizer
(`llama-bpe`, `qwen2`, `tekken`), every id below the model's `vocab_size` (missing ids as
`[PAD{i}]`, UNUSED), token types NORMAL / CONTROL (special added tokens) / USER_DEFINED (other
added tokens, pre-normalized), and `gguf.SpecialVocab(load_merges=True)` for the merges, the
bos/eos ids, the add_bos/add_eos flags and the chat template. Before writing, it checks that
transformers' tokenizer from the same tokenizer.json gives every `.out` id of every `.inp` line
(llama.cpp's own expected output), so the GGUF is built from the tokenizer llama.cpp tested.

SentencePiece ("llama") vocabularies are in scripts/golden/vocab_gguf_spm.py.

Usage: python scripts/golden/vocab_gguf.py   (rewrites the BPE tests/fixtures/vocab-gguf/*.gguf.gz)
"""

import gzip
import os
import shutil
import tempfile

import gguf
from transformers import AutoTokenizer

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
SEP = "\n__ggml_vocab_test__\n"

# llama.cpp name, tokenizer fixture, family folder (config and template), general.architecture,
# the model's config.json vocab_size and context length.
VOCABS = [
    ("llama-bpe", "llama3", "llama-3.3", "llama", 128256, 131072),  # Llama-3.1/3.3
    ("qwen2", "qwen2.5", "qwen2.5", "qwen2", 152064, 32768),  # Qwen2.5-7B-Instruct
    ("tekken", "tekken", "mistral-nemo", "llama", 131072, 1024000),  # Mistral-Nemo-Instruct-2407
]


def tokenizer_dir(vocab, family):
    out = tempfile.mkdtemp(prefix=f"vocab-{vocab}-")
    tok = os.path.join(ROOT, "tokenizers")
    with gzip.open(os.path.join(tok, "vocab", f"{vocab}.tokenizer.json.gz")) as f:
        open(os.path.join(out, "tokenizer.json"), "wb").write(f.read())
    for name in os.listdir(os.path.join(tok, family)):
        src = os.path.join(tok, family, name)
        if name.endswith(".gz"):
            with gzip.open(src) as f:
                open(os.path.join(out, name[:-3]), "wb").write(f.read())
        else:
            shutil.copy(src, out)
    return out


def check_expected_ids(name, tokenizer):
    base = os.path.join(ROOT, "vocab-gguf", f"ggml-vocab-{name}.gguf")
    texts = open(base + ".inp", encoding="utf-8").read()
    assert texts.endswith(SEP)
    texts = texts[: -len(SEP)].split(SEP)
    lines = open(base + ".out", encoding="utf-8").read().split("\n")[:-1]
    assert len(texts) == len(lines), (name, len(texts), len(lines))
    for text, line in zip(texts, lines):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == [int(t) for t in line.split()], (name, text, ids, line)
    return len(texts)


def looks_special(token):
    # convert_hf_to_gguf's does_token_look_special
    seems = token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
    seems = seems or (token.startswith("<|") and token.endswith("|>"))
    seems = seems or (token.startswith("<｜") and token.endswith("｜>"))
    seems = seems or (token.startswith("<unused") and token.endswith(">"))
    return seems


def vocab_tokens(tokenizer, vocab_size):
    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            if not decoder[i].normalized:
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            if decoder[i].special or looks_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def main():
    for name, vocab, family, arch, vocab_size, context in VOCABS:
        folder = tokenizer_dir(vocab, family)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        n = check_expected_ids(name, tokenizer)
        tokens, types = vocab_tokens(tokenizer, vocab_size)
        path = os.path.join(folder, f"ggml-vocab-{name}.gguf")
        writer = gguf.GGUFWriter(path, arch)
        writer.add_name(f"ggml-vocab-{name}")
        writer.add_context_length(context)
        writer.add_vocab_size(vocab_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(name)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        out = os.path.join(ROOT, "vocab-gguf", f"ggml-vocab-{name}.gguf.gz")
        with open(path, "rb") as f, open(out, "wb") as g:
            g.write(gzip.compress(f.read(), 9, mtime=0))
        print(f"{name}: {n} .inp lines give the .out ids; {len(tokens)} tokens -> {out}")
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
