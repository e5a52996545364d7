"""Vocabulary-only GGUF files of real SentencePiece tokenizers (Mistral 7B v0.1 and v0.3, Gemma 2
and Gemma 3), written as llama.cpp's `convert_hf_to_gguf.py --vocab-only` writes them
(`TextModel._set_vocab_sentencepiece`: `tokenizer.ggml.model = "llama"`, `tokenizer.ggml.pre =
"default"`, tokens, scores and token types), with their test pairs: the `.inp` texts are those of
llama.cpp's `ggml-vocab-llama-spm.gguf.inp`, the `.out` ids the reference tokenizer's.

- Mistral: the real `tokenizer.model` files that the PyPI wheel of mistral-common ships
  (`mistral_common/data/tokenizer.model.v1`: Mistral 7B v0.1/v0.2; `..._240323.model.v3`:
  Mistral 7B v0.3, 32768 pieces with the [INST]-style control tokens). Tokens, scores and types
  are read with sentencepiece exactly as `_create_vocab_sentencepiece` reads them; bos 1, eos 2,
  unk 0, add_bos true, add_eos false are what `gguf.SpecialVocab` takes from those models'
  config files. The expected ids are sentencepiece's own (`encode(text)`, no bos).
- Gemma 2/3: no `tokenizer.model` is available here, only the real `tokenizer.json` and
  `tokenizer_config.json` (tests/fixtures/tokenizers/). Tokens are the tokenizer.json vocabulary
  (padded with `[PAD{i}]` to the config's vocab_size: 256000 / 262208); types as
  `_create_vocab_sentencepiece` gives them (`<unk>` UNKNOWN, `<pad>`/`<eos>`/`<bos>` CONTROL,
  `<0xNN>` BYTE, then every entry of `added_tokens_decoder` CONTROL when special or
  special-looking, else USER_DEFINED with `▁` written as a space, score -1000). The scores of the
  other pieces are rebuilt from the order of tokenizer.json's merges, which transformers' converter
  sorted by the SentencePiece score of the merged piece: minus the rank of the first merge that
  makes the piece; pieces no merge makes (single characters, bytes) cannot be formed by
  llama.cpp's bigram merging, so their score does not matter (0). `add_space_prefix = false` as
  `Gemma2Model` / `Gemma3Model.set_vocab` write it. The expected ids are transformers' from the
  real tokenizer.json.

Before writing, each vocabulary is checked: for the Mistral ones, transformers' GGUF loader on
the written file agrees with sentencepiece too.

Usage: pip download --no-deps mistral-common==1.13.1
       python scripts/golden/vocab_gguf_spm.py mistral_common-1.13.1-py3-none-any.whl
(needs sentencepiece and protobuf; rewrites tests/fixtures/vocab-gguf/ggml-vocab-{mistral-v0.1,
mistral-v0.3,gemma-2,gemma-3}.gguf.{gz,inp,out})
"""

import gzip
import json
import os
import shutil
import sys
import tempfile
import zipfile

import gguf
import sentencepiece
from transformers import AutoTokenizer

from vocab_gguf import ROOT, SEP, looks_special, tokenizer_dir

T = gguf.TokenType
LLAMA_SPM = os.path.join(ROOT, "vocab-gguf", "ggml-vocab-llama-spm.gguf")

# name, mistral-common data file, context length
MISTRAL = [
    ("mistral-v0.1", "mistral_common/data/tokenizer.model.v1", 32768),
    ("mistral-v0.3", "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3", 32768),
]
# name, tokenizer fixture, family folder, general.architecture, vocab_size, context length
GEMMA = [
    ("gemma-2", "gemma2", "gemma-2", "gemma2", 256000, 8192),
    ("gemma-3", "gemma3", "gemma-3", "gemma3", 262208, 131072),
]


def test_texts():
    texts = open(LLAMA_SPM + ".inp", encoding="utf-8").read()
    assert texts.endswith(SEP)
    return texts[: -len(SEP)].split(SEP)


def write(name, arch, context, tokens, scores, types, extra):
    folder = tempfile.mkdtemp(prefix=f"vocab-{name}-")
    path = os.path.join(folder, "vocab.gguf")
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"ggml-vocab-{name}")
    writer.add_context_length(context)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    extra(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    out = os.path.join(ROOT, "vocab-gguf", f"ggml-vocab-{name}.gguf.gz")
    with open(path, "rb") as f, open(out, "wb") as g:
        g.write(gzip.compress(f.read(), 9, mtime=0))
    return folder, path


def write_pair(name, ids):
    base = os.path.join(ROOT, "vocab-gguf", f"ggml-vocab-{name}.gguf")
    shutil.copy(LLAMA_SPM + ".inp", base + ".inp")
    with open(base + ".out", "w", encoding="utf-8") as f:
        for line in ids:
            f.write("".join(f" {i}" for i in line) + "\n")


def mistral(wheel, name, member, context):
    folder = tempfile.mkdtemp(prefix=f"spm-{name}-")
    model = os.path.join(folder, "tokenizer.model")
    with zipfile.ZipFile(wheel) as z, open(model, "wb") as f:
        f.write(z.read(member))
    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromFile(model)
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        kind = T.NORMAL
        if sp.IsUnknown(i):
            kind = T.UNKNOWN
        elif sp.IsControl(i):
            kind = T.CONTROL
        elif sp.IsUnused(i):
            kind = T.UNUSED
        elif sp.IsByte(i):
            kind = T.BYTE
        tokens.append(sp.IdToPiece(i))
        scores.append(sp.GetScore(i))
        types.append(kind)
    ids = [sp.encode(text) for text in test_texts()]

    def specials(writer):
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)

    out, path = write(name, "llama", context, tokens, scores, types, specials)
    loaded = AutoTokenizer.from_pretrained(out, gguf_file=os.path.basename(path))
    for text, want in zip(test_texts(), ids):
        got = loaded.encode(text, add_special_tokens=False)
        assert got == want, (name, text, got, want)
    write_pair(name, ids)
    shutil.rmtree(out)
    shutil.rmtree(folder)
    return len(tokens)


def gemma(name, vocab, family, arch, vocab_size, context):
    folder = tokenizer_dir(vocab, family)
    tok = AutoTokenizer.from_pretrained(folder)
    spec = json.load(open(os.path.join(folder, "tokenizer.json"), encoding="utf-8"))
    config = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8"))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
    rank = {}
    for i, (left, right) in enumerate(merges):
        rank.setdefault(left + right, i)
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [-1000.0] * vocab_size
    types = [T.UNUSED] * vocab_size
    for piece, i in spec["model"]["vocab"].items():
        kind = T.NORMAL
        if piece == "<unk>":
            kind = T.UNKNOWN
        elif piece in ("<pad>", "<eos>", "<bos>"):
            kind = T.CONTROL
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            kind = T.BYTE
        tokens[i], types[i] = piece, kind
        scores[i] = -float(rank[piece]) if kind == T.NORMAL and piece in rank else 0.0
    for i, data in config["added_tokens_decoder"].items():
        i, token = int(i), data["content"]
        if i >= vocab_size:
            continue
        if data.get("special") or looks_special(token):
            types[i] = T.CONTROL
        else:
            token = token.replace("\u2581", " ")
            types[i] = T.USER_DEFINED
        tokens[i], scores[i] = token, -1000.0
    ids = [tok.encode(text, add_special_tokens=False) for text in test_texts()]

    def specials(writer):
        gguf.SpecialVocab(folder, n_vocab=vocab_size).add_to_gguf(writer)
        writer.add_add_space_prefix(False)

    out, _ = write(name, arch, context, tokens, scores, types, specials)
    write_pair(name, ids)
    shutil.rmtree(out)
    shutil.rmtree(folder)
    return vocab_size


def main():
    wheel = sys.argv[1]
    for name, member, context in MISTRAL:
        n = mistral(wheel, name, member, context)
        print(f"{name}: {n} tokens, {len(test_texts())} test texts")
    for args in GEMMA:
        n = gemma(*args)
        print(f"{args[0]}: {n} tokens, {len(test_texts())} test texts")


if __name__ == "__main__":
    main()
