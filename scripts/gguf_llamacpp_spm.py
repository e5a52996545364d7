#!/usr/bin/env python3
"""Issue 21's SentencePiece check in llama.cpp itself: a tiny random model (transformers, seed 0,
2 layers, hidden 64) with a real SentencePiece vocabulary, exported by `lora-ft export-gguf`
(f16), loaded by llama-cpp-python: its tokenization of llama.cpp's test texts
(tests/fixtures/vocab-gguf/ggml-vocab-<name>.gguf.inp) must give the reference ids (.out:
sentencepiece's for Mistral, transformers' for Gemma), and its logits (llama.cpp through
scripts/gguf_llamacpp_run.py, as gguf_llamacpp_families.py's) the bound of
gguf_llamacpp_families.py (3·ew + e32 against transformers float64).

    python3 scripts/gguf_llamacpp_spm.py [--lora-ft BIN]

- mistral-v0.1: Mistral 7B v0.1's tokenizer.model (tests/fixtures/tokenizers/mistral-v0.1), no
  tokenizer.json: the converter's `_create_vocab_sentencepiece` path;
- gemma-2: Gemma 2's tokenizer.json and tokenizer_config.json, no tokenizer.model: scores from
  the merge order.
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_llamacpp_families as fam  # noqa: E402

FIX = "tests/fixtures"
SEP = "\n__ggml_vocab_test__\n"


def cases(name):
    base = os.path.join(FIX, "vocab-gguf", f"ggml-vocab-{name}.gguf")
    texts = open(base + ".inp", encoding="utf-8").read()[: -len(SEP)].split(SEP)
    ids = [[int(t) for t in line.split()] for line in open(base + ".out", encoding="utf-8").read().splitlines()]
    assert len(texts) == len(ids)
    return list(zip(texts, ids))


def build(name, folder):
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM
    torch.manual_seed(0)
    os.makedirs(folder)
    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
    if name == "mistral-v0.1":
        model = MistralForCausalLM(MistralConfig(vocab_size=32000, sliding_window=None, tie_word_embeddings=False,
                                                 **small))
        with open(os.path.join(folder, "tokenizer.model"), "wb") as f:
            f.write(gzip.open(os.path.join(FIX, "tokenizers/mistral-v0.1/tokenizer.model.gz")).read())
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                   "add_eos_token": False}, open(os.path.join(folder, "tokenizer_config.json"), "w"))
    else:
        model = Gemma2ForCausalLM(Gemma2Config(vocab_size=256000, query_pre_attn_scalar=16, sliding_window=4,
                                               layer_types=["sliding_attention", "full_attention"], **small))
        with open(os.path.join(folder, "tokenizer.json"), "wb") as f:
            f.write(gzip.open(os.path.join(FIX, "tokenizers/vocab/gemma2.tokenizer.json.gz")).read())
        shutil.copy(os.path.join(FIX, "tokenizers/gemma-2/tokenizer_config.json"), folder)
    model.save_pretrained(folder)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lora-ft", default="target/release/lora-ft")
    args = ap.parse_args()
    import numpy as np
    import torch
    from llama_cpp import Llama
    failed = 0
    print("| vocabulary | tokenizations equal to the reference | max abs dlogit vs f64 | e32 | ew | bound | pass |")
    print("|---|---|---|---|---|---|---|")
    for name in ["mistral-v0.1", "gemma-2"]:
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, name)
            build(name, folder)
            out = os.path.join(tmp, f"{name}.gguf")
            run = subprocess.run([args.lora_ft, "export-gguf", "--model", folder, out, "--type", "f16"],
                                 capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"{name}: export-gguf failed: {run.stderr[-2000:]}")
            llm = Llama(model_path=out, n_ctx=64, n_batch=64, logits_all=True, n_threads=2, verbose=False)
            tests = cases(name)
            same = sum(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) == ids for text, ids in tests)
            del llm
            seqs = fam.SEQUENCES
            ref = fam.hf_logits(folder, torch.float64, seqs)
            e32 = fam.max_diff(fam.hf_logits(folder, torch.float32, seqs), ref)
            ew = fam.max_diff(fam.hf_logits(folder, torch.float64, seqs, fam.f16_round), ref)
            d = fam.max_diff(fam.llamacpp_logits(out, seqs), ref)
            bound = 3 * ew + e32
            ok = same == len(tests) and d <= bound
            failed += not ok
            print(f"| {name} | {same}/{len(tests)} | {d:.3e} | {e32:.1e} | {ew:.3e} | {bound:.3e} | "
                  f"{'yes' if ok else 'NO'} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
