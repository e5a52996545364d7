"""Mistral-7B-Instruct-v0.3's tokenizer files for tests/fixtures/tokenizers/ (the Hub is not
reachable here; see the README there for every source).

- `vocab/mistral-v0.3.tokenizer.json.gz`: the real v3 SentencePiece model that the PyPI wheel of
  mistral-common ships (`mistral_common/data/mistral_instruct_tokenizer_240323.model.v3`, 32768
  BPE pieces) converted as the Hub's own tokenizer.json is: transformers' `LlamaConverter` with
  `legacy = True` (normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, byte fallback,
  merges from the piece scores as `generate_merges` makes them, control and user-defined pieces
  left out of the merges), the BOS post-processor of `LlamaTokenizerFast`, and ids 0..770 as
  special added tokens. The wheel names 24 of the unused control ids differently from the Hub's
  `tokenizer.model.v3` (`[IMG]`, `[PREFIX]`, `[MIDDLE]`, `[SUFFIX]` at 10..13 and user-defined
  `[REFERENCE_DOC_19]`..`[REFERENCE_DOC_0]` at 751..770); they are written under the Hub's names,
  `[control_{id - 2}]`, special like the others.
- `mistral-v0.3/tokenizer_config.json.gz` (140 kB unpacked): bos `<s>`, eos `</s>`, unk `<unk>`, the added tokens, and
  the chat template of the Hub's tokenizer_config.json (its source is in the README; given as a
  file, see Usage). `tokenizer_class` is `PreTrainedTokenizerFast`, not the Hub's `LlamaTokenizer`:
  transformers 5's `LlamaTokenizer` throws tokenizer.json's normalizer away and rebuilds a
  Metaspace(prepend_scheme="first") pipeline, which is not SentencePiece's (see `main`).

Verified before writing: transformers' AutoTokenizer on the written folder gives sentencepiece's
ids on every test text of llama.cpp's `ggml-vocab-llama-spm.gguf.inp`, and on every dialogue of
scripts/golden/chat_templates.py as the chat template renders it, split at the special tokens
with each piece of text encoded by sentencepiece (which adds its dummy prefix to each piece, as
llama.cpp's SPM tokenizer does after a special token).

Usage: pip download --no-deps mistral-common==1.13.1
       python scripts/golden/mistral_v03_tokenizer.py mistral_common-1.13.1-py3-none-any.whl [TEMPLATE]
(TEMPLATE: a file with the chat template; without it, the one of the present fixture is kept)
"""

import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile

import sentencepiece
from sentencepiece import sentencepiece_model_pb2 as model_pb2
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
from tokenizers.models import BPE
from transformers import AutoTokenizer, LlamaTokenizer
from transformers.tokenization_utils_base import generate_merges

from chat_templates import DIALOGUES, NOT_ALTERNATING, SYSTEM
from vocab_gguf_spm import test_texts

HERE = os.path.dirname(__file__)
TOKENIZERS = os.path.join(HERE, "..", "..", "tests", "fixtures", "tokenizers")
MEMBER = "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3"
FAMILY = "mistral-v0.3"
N_SPECIAL = 771  # ids 0..770: <unk>, <s>, </s>, [INST], ..., [control_768]


def hub_name(i, piece):
    return piece if i < 10 else f"[control_{i - 2}]"


def build(model_path):
    proto = model_pb2.ModelProto()
    proto.ParseFromString(open(model_path, "rb").read())
    assert proto.trainer_spec.model_type == 2 and proto.trainer_spec.byte_fallback  # BPE
    assert proto.normalizer_spec.add_dummy_prefix and not proto.normalizer_spec.remove_extra_whitespaces
    pieces = [(hub_name(i, p.piece) if i < N_SPECIAL else p.piece, p.score, p.type) for i, p in enumerate(proto.pieces)]
    # unk, control and user-defined pieces are exactly ids 0..770
    assert [i for i, (_, _, t) in enumerate(pieces) if t in (2, 3, 4)] == list(range(N_SPECIAL))
    vocab = {piece: i for i, (piece, _, _) in enumerate(pieces)}
    assert len(vocab) == len(pieces) == 32768
    specials = [piece for piece, _, _ in pieces[:N_SPECIAL]]
    scores = {piece: score for piece, score, _ in pieces}
    merges = generate_merges(vocab, scores, skip_tokens=specials)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)]
    )
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    assert [tok.token_to_id(t) for t in specials] == list(range(N_SPECIAL))
    return tok, specials


def config(specials, template):
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(specials)
    }
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": "<s>",
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": True,
        "model_max_length": 32768,
        "pad_token": None,
        "spaces_between_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    }


def chat_template():
    """The template file given as the second argument, else the one the fixture already holds."""
    if len(sys.argv) > 2:
        return open(sys.argv[2], encoding="utf-8").read()
    with gzip.open(os.path.join(TOKENIZERS, FAMILY, "tokenizer_config.json.gz")) as f:
        return json.load(f)["chat_template"]


def spm_ids(sp, text, specials):
    """sentencepiece on each piece of text between special tokens, the special tokens' own ids."""
    pattern = "(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")"
    ids = []
    for part in re.split(pattern, text):
        if part in specials:
            ids.append(specials.index(part))
        elif part:
            ids.extend(sp.encode(part))
    return ids


def main():
    wheel = sys.argv[1]
    work = tempfile.mkdtemp(prefix="mistral-v0.3-")
    model = os.path.join(work, "tokenizer.model")
    with zipfile.ZipFile(wheel) as z, open(model, "wb") as f:
        f.write(z.read(MEMBER))
    sp = sentencepiece.SentencePieceProcessor(model_file=model)
    tok, specials = build(model)
    folder = os.path.join(work, "folder")
    os.makedirs(folder)
    tok.save(os.path.join(folder, "tokenizer.json"))
    cfg = config(specials, chat_template())
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")

    hf = AutoTokenizer.from_pretrained(folder)
    texts = test_texts()
    for text in texts:
        got, want = hf.encode(text, add_special_tokens=False), sp.encode(text)
        assert got == want, (text, got, want)
    dialogues = [
        hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        for messages in DIALOGUES + [[SYSTEM] + NOT_ALTERNATING[1:]]
        for gen in (False, True)
    ]
    for text in dialogues:
        got, want = hf.encode(text, add_special_tokens=False), spm_ids(sp, text, specials)
        assert got == want, (text, got, want)
    # What the Hub's own tokenizer_config (LlamaTokenizer, legacy false) gives under transformers 5.
    llama = LlamaTokenizer.from_pretrained(folder, legacy=False)
    assert type(llama.backend_tokenizer.pre_tokenizer).__name__ == "Metaspace"
    texts_differ = sum(llama.encode(t, add_special_tokens=False) != sp.encode(t) for t in texts)
    dialogues_differ = sum(
        llama.encode(t, add_special_tokens=False) != spm_ids(sp, t, specials) for t in dialogues
    )
    print(
        f"{FAMILY}: {len(texts)} test texts and {len(dialogues)} rendered dialogues "
        f"({sum(len(hf.encode(t, add_special_tokens=False)) for t in dialogues)} tokens) give sentencepiece's "
        f"ids; LlamaTokenizer(legacy=False) differs on {texts_differ} texts and {dialogues_differ} dialogues",
        file=sys.stderr,
    )

    out = os.path.join(TOKENIZERS, "vocab", f"{FAMILY}.tokenizer.json.gz")
    spec = json.load(open(os.path.join(folder, "tokenizer.json"), encoding="utf-8"))
    with open(out, "wb") as f:
        f.write(gzip.compress(json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode(), 9, mtime=0))
    with open(os.path.join(folder, "tokenizer_config.json"), "rb") as f:
        config_gz = gzip.compress(f.read(), 9, mtime=0)
    with open(os.path.join(TOKENIZERS, FAMILY, "tokenizer_config.json.gz"), "wb") as f:
        f.write(config_gz)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
