#!/usr/bin/env python3
"""Reference numbers for `lora-ft eval` (tests/eval.rs), from transformers + PEFT on the CPU.

For every dialogue of tests/fixtures/eval_dialogues.jsonl: the chat template rendered by
transformers' `apply_chat_template`, the HF tokenizer's ids, the assistant-only labels found by
chat_masking.py's independent string search (the reply and its <|im_end|>), cut to max_seq_len as
lora-ft's training cuts (truncation_side "right": keep the start; a row left with no trained
token after the shift is dropped), then the mean next-token cross-entropy over its trained tokens
from the un-quantized base model, with and without the PEFT adapter:
  - `loss_*_f64`: the model in float64, RMSNorm, RoPE and softmax patched to stay in float64
    (hf_parity.exact_float64) and the cross-entropy taken in float64 from the logits: the exact
    answer to f64 precision;
  - `loss_*_f32`: transformers' own float32 run (`model(input_ids, labels=...).loss`), whose
    error against the float64 answer sets the Rust test's tolerance (lora_ft::testing).
The file's mean is token-weighted: sum of per-dialogue loss sums / all trained tokens.

Two cases:
  tiny-chat: a random 2-layer Llama written here to tests/fixtures/tiny-chat/ with a 1024-token
    byte-level BPE tokenizer trained here on the shipped training dialogues, SmolLM2's chat template
    (copied from its tokenizer_config.json), and a random PEFT adapter (adapter/);
  smollm2: SmolLM2-135M-Instruct (~/.cache/lora-ft/smollm2-hf, `lora-ft import` of the GGUF) with
    tests/golden/peft_smollm2_adapter.

Run from anywhere:  /work/venv/bin/python scripts/golden/eval_golden.py [--case tiny-chat|smollm2]
Writes tests/golden/eval_<case>.json (and tiny-chat's fixture folder for that case).
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_masking import assistant_spans  # noqa: E402  the chat masking golden's span search
from hf_parity import exact_float64, rel_err  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
FIXTURES = REPO / "tests" / "fixtures"
DIALOGUES = FIXTURES / "eval_dialogues.jsonl"
TINY_DIR = FIXTURES / "tiny-chat"
SMOLLM2_DIR = Path(os.environ.get("LORA_FT_CACHE", Path.home() / ".cache/lora-ft")) / "smollm2-hf"
SMOLLM2_ADAPTER = GOLDEN / "peft_smollm2_adapter"
MAX_SEQ_LEN = {"tiny-chat": 384, "smollm2": 256}
IGNORE = -100
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


# ---------------------------------------------------------------- the dialogue file

def write_dialogues():
    """Four shipped eval dialogues (system prompt, several turns), the chat masking golden's cases
    without a system message, with a trailing user turn, and with non-ASCII text, then a dialogue
    longer than max_seq_len (cut, still trained) and one whose only reply starts past it (dropped)."""
    from chat_masking import CONVERSATIONS

    shipped = [json.loads(l) for l in (REPO / "datasets/customer-service-v1/eval.jsonl").read_text().splitlines()[:4]]
    rows = [r["messages"] for r in shipped] + [CONVERSATIONS[0], CONVERSATIONS[4], CONVERSATIONS[3]]
    long_turns = [{"role": "system", "content": "You help customers of Fernhollow Outfitters."}]
    for i in range(8):
        long_turns.append({"role": "user", "content": f"Question {i}: where is parcel FH-{5790314 + i}?"})
        long_turns.append({"role": "assistant", "content": f"Parcel FH-{5790314 + i} left our warehouse on "
                           f"day {i + 2} and should reach you within three working days."})
    rows.append(long_turns)
    rows.append([{"role": "user", "content": "Please read my whole story before answering. " * 60},
                 {"role": "assistant", "content": "I have read it."}])
    DIALOGUES.write_text("".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in rows))


def read_dialogues():
    out = []
    for i, line in enumerate(DIALOGUES.read_text().splitlines()):
        if line.strip():
            out.append((i + 1, json.loads(line)["messages"]))
    return out


def encode(tok, messages):
    """ids and labels of one dialogue: transformers' rendering and tokens, chat_masking's spans."""
    text = tok.apply_chat_template(messages, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = assistant_spans(text)
    assert len(spans) == sum(m["role"] == "assistant" for m in messages)
    labels = [tid if any(s <= a and b <= e and a < b for s, e in spans) else IGNORE
              for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"])]
    return enc["input_ids"], labels


# ---------------------------------------------------------------- the tiny model

def write_tiny_fixture():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if TINY_DIR.exists():
        shutil.rmtree(TINY_DIR)
    TINY_DIR.mkdir(parents=True)
    smol_cfg = json.loads((SMOLLM2_DIR / "tokenizer_config.json").read_text())
    tok_cfg = {
        "chat_template": smol_cfg["chat_template"],
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (TINY_DIR / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [m["content"] for line in (REPO / "datasets/customer-service-v1/train.jsonl").read_text().splitlines()
             for m in json.loads(line)["messages"]]
    bpe.train_from_iterator(texts, trainer)
    bpe.save(str(TINY_DIR / "tokenizer.json"))
    vocab = bpe.get_vocab_size()
    assert vocab == 1024, vocab

    torch.manual_seed(20261125)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                      max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        # larger than transformers' 0.02 init, so logits spread over several nats: the loss
        # then depends on which tokens are scored, not only on the vocabulary size
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            std = 1.0 if "embed_tokens" in name else 0.2 if "lm_head" in name else p.shape[1] ** -0.5
            p.normal_(0.0, std)
    model.save_pretrained(TINY_DIR, safe_serialization=True)
    cfg_path = TINY_DIR / "config.json"
    c = json.loads(cfg_path.read_text())
    c["rope_theta"] = c["rope_parameters"]["rope_theta"]
    cfg_path.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    gen = TINY_DIR / "generation_config.json"
    if gen.exists():
        gen.unlink()

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm = get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * 0.2)
    pm.peft_config["default"].base_model_name_or_path = str(TINY_DIR.relative_to(REPO))
    pm.save_pretrained(TINY_DIR / "adapter")
    (TINY_DIR / "adapter" / "README.md").unlink(missing_ok=True)
    acfg = TINY_DIR / "adapter" / "adapter_config.json"
    a = json.loads(acfg.read_text())
    a["target_modules"] = sorted(a["target_modules"])
    acfg.write_text(json.dumps(a, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------- the reference losses

def loss_sum_f64(model, ids, labels):
    with exact_float64(), torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    assert logits.dtype == torch.float64
    return torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=IGNORE,
                                             reduction="sum").item()


def loss_mean_f32(model, ids, labels):
    with torch.no_grad():
        return model(input_ids=ids, labels=labels, use_cache=False).loss.item()


def load_peft(model_dir, adapter_dir, dtype):
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    return PeftModel.from_pretrained(base, adapter_dir).eval()


def run_case(case, model_dir, adapter_dir):
    print(f"[{case}]")
    max_len = MAX_SEQ_LEN[case]
    tok = AutoTokenizer.from_pretrained(model_dir)
    models = {dt: load_peft(model_dir, adapter_dir, dt) for dt in (torch.float64, torch.float32)}
    dialogues, totals = [], {k: [0.0, 0] for k in ("adapter_f64", "adapter_f32", "base_f64", "base_f32")}
    for index, (line, messages) in enumerate(read_dialogues()):
        ids, labels = encode(tok, messages)
        length = len(ids)
        truncated = length > max_len
        ids, labels = ids[:max_len], labels[:max_len]
        n = sum(l != IGNORE for l in labels[1:])
        row = {"index": index, "line": line, "length": length, "truncated": truncated, "tokens": n,
               "input_ids": ids, "labels": labels}
        if n > 0:
            t_ids, t_labels = torch.tensor([ids]), torch.tensor([labels])
            for with_adapter in (True, False):
                which = "adapter" if with_adapter else "base"
                for dt, suffix in ((torch.float64, "f64"), (torch.float32, "f32")):
                    pm = models[dt]
                    if with_adapter:
                        s = loss_sum_f64(pm, t_ids, t_labels) if dt == torch.float64 else \
                            loss_mean_f32(pm, t_ids, t_labels) * n
                    else:
                        with pm.disable_adapter():
                            s = loss_sum_f64(pm, t_ids, t_labels) if dt == torch.float64 else \
                                loss_mean_f32(pm, t_ids, t_labels) * n
                    row[f"loss_{which}_{suffix}"] = s / n
                    totals[f"{which}_{suffix}"][0] += s
                    totals[f"{which}_{suffix}"][1] += n
            print(f"  line {line}: {length} tokens{' (cut)' if truncated else ''}, {n} trained, "
                  f"loss {row['loss_adapter_f64']:.6f} with the adapter, {row['loss_base_f64']:.6f} without")
        else:
            print(f"  line {line}: {length} tokens, dropped (no trained token in the first {max_len})")
        dialogues.append(row)
    kept = [d for d in dialogues if d["tokens"] > 0]
    assert any(d["truncated"] for d in kept), "no kept dialogue is cut: the truncation path is untested"
    assert len(kept) == len(dialogues) - 1, "exactly the last dialogue should be dropped"
    for which in ("adapter", "base"):
        diffs = [abs(d[f"loss_{which}_f32"] - d[f"loss_{which}_f64"]) / d[f"loss_{which}_f64"] for d in kept]
        assert max(diffs) < 1e-4, (which, max(diffs))
    # the adapter must move the per-dialogue losses by more than the Rust test's bound (4 x the
    # f32 error, at least 4 x 8 f32 ulp; both as lora_ft::testing::rel_err measures: max |a - b|
    # over max |b|), so a run that ignored it would fail there
    def vec_err(a, b):
        return max(abs(x - y) for x, y in zip(a, b)) / max(abs(y) for y in b)

    loss = {k: [d[f"loss_{k}"] for d in kept] for k in ("adapter_f64", "adapter_f32", "base_f64")}
    bound = 4 * max(vec_err(loss["adapter_f32"], loss["adapter_f64"]), 8 * 2.0 ** -23)
    moved = vec_err(loss["base_f64"], loss["adapter_f64"])
    print(f"  the adapter moves the losses by {moved:.2e} (relative), the test's bound is {bound:.2e}")
    assert moved > 10 * bound, (moved, bound)
    means = {k: v[0] / v[1] for k, v in totals.items()}
    print(f"  mean over {totals['adapter_f64'][1]} tokens: {means['adapter_f64']:.6f} with the adapter, "
          f"{means['base_f64']:.6f} without")
    golden = {
        "generator": f"scripts/golden/eval_golden.py --case {case}",
        "model": str(model_dir.relative_to(REPO)) if model_dir.is_relative_to(REPO) else "lora_ft::fixtures::smollm2_dir()",
        "adapter": str(adapter_dir.relative_to(REPO)),
        "data": str(DIALOGUES.relative_to(REPO)),
        "max_seq_len": max_len,
        "truncation_side": "right",
        "trained_tokens": totals["adapter_f64"][1],
        "mean_loss_adapter_f64": means["adapter_f64"],
        "mean_loss_adapter_f32": means["adapter_f32"],
        "mean_loss_base_f64": means["base_f64"],
        "mean_loss_base_f32": means["base_f32"],
        "dialogues": dialogues,
    }
    out = GOLDEN / f"eval_{case}.json"
    out.write_text(json.dumps(golden, ensure_ascii=False) + "\n")
    print(f"  wrote {out.relative_to(REPO)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=["tiny-chat", "smollm2"], action="append")
    cases = ap.parse_args().case or ["tiny-chat", "smollm2"]
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    write_dialogues()
    if "tiny-chat" in cases:
        write_tiny_fixture()
        run_case("tiny-chat", TINY_DIR, TINY_DIR / "adapter")
    if "smollm2" in cases:
        run_case("smollm2", SMOLLM2_DIR, SMOLLM2_ADAPTER)


if __name__ == "__main__":
    main()
