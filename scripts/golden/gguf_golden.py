"""Golden values for `lora-ft import FILE.gguf`: what transformers' own GGUF loader makes of the
SmolLM2-135M-Instruct Q4_1 file (config, dequantized weights with the Q/K permutation undone,
tokenizer ids). Run on CPU:

    /work/venv/bin/python scripts/golden/gguf_golden.py [GGUF] [OUT_JSON]

Writes tests/golden/gguf_smollm2.json, read by tests/gguf_import.rs.
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_GGUF = os.path.expanduser("~/.cache/lora-ft/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")

STRINGS = [
    "Hello, world!",
    "12345 67",
    "a  b   c    d",
    " leading space",
    "trailing space ",
    "line1\nline2\n\n\tTabbed\r\nend",
    "😀👍🏽",
    "café naïve",
    "日本語のテキスト、中文",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|>",
    "<|im_start|>assistant\nSure!<|im_end|><|endoftext|>",
    "def f(x):\n    return x**2  # square",
    "I'm here, don't we'll",
    "1/3 ≈ 0.333… ÀÉÎÕÜ",
    "",
]

LAYERS = [0, 15, 29]


def fnv1a64(text: str) -> str:
    """A checksum the Rust test recomputes without a hashing crate."""
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8"):
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def tensor_names(num_layers):
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in LAYERS:
        p = f"model.layers.{i}."
        names += [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight"]
    p = "model.layers.0."
    names += [
        p + "self_attn.v_proj.weight",
        p + "self_attn.o_proj.weight",
        p + "mlp.gate_proj.weight",
        p + "mlp.up_proj.weight",
        p + "mlp.down_proj.weight",
        p + "input_layernorm.weight",
        p + "post_attention_layernorm.weight",
    ]
    return names


def tensor_check(t):
    t64 = t.detach().to(torch.float64)
    check = {"shape": list(t.shape), "sum": t64.sum().item(), "sum_sq": (t64 * t64).sum().item()}
    if t.dim() == 1:
        check["rows"] = {"0": [float(x) for x in t[:8]]}
    else:
        # rows 0..2 and 63/64 straddle a head boundary (head_dim 64): a wrong Q/K permutation moves them
        rows = sorted({0, 1, 2, 63, 64, t.shape[0] - 1})
        check["rows"] = {str(r): [float(x) for x in t[r, :8]] for r in rows}
    return check


def tokenizer_checks(tok):
    backend = json.loads(tok.backend_tokenizer.to_str())
    model = backend["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    return {
        "normalizer": backend["normalizer"],
        "pre_tokenizer": backend["pre_tokenizer"],
        "post_processor": backend["post_processor"],
        "decoder": backend["decoder"],
        "added_tokens": backend["added_tokens"],
        "model": {k: v for k, v in model.items() if k not in ("vocab", "merges")},
        "vocab_len": len(vocab),
        "vocab_fnv1a64": fnv1a64("\n".join(f"{i}\t{t}" for t, i in vocab)),
        "merges_len": len(merges),
        "merges_fnv1a64": fnv1a64("\n".join(merges)),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "unk_token": tok.unk_token,
        "encodings": [
            {
                "text": s,
                "ids": tok(s)["input_ids"],
                "ids_no_special": tok(s, add_special_tokens=False)["input_ids"],
            }
            for s in STRINGS
        ],
    }


def main():
    gguf = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF
    out = sys.argv[2] if len(sys.argv) > 2 else "tests/golden/gguf_smollm2.json"
    folder, name = os.path.split(gguf)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    cfg = model.config
    params = dict(model.named_parameters())
    golden = {
        "source": "transformers "
        + __import__("transformers").__version__
        + f" from_pretrained(gguf_file={name!r}, dtype=float32)",
        "config": {
            "architectures": type(model).__name__,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_position_embeddings,
            "rope_theta": cfg.rope_parameters["rope_theta"],
            "rms_norm_eps": cfg.rms_norm_eps,
            "vocab_size": cfg.vocab_size,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_id,
            "pad_token_id": cfg.pad_token_id,
        },
        "tensor_count": len(params),
        "tensors": {n: tensor_check(params[n]) for n in tensor_names(cfg.num_hidden_layers)},
        "tokenizer": tokenizer_checks(tok),
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
