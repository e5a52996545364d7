"""Tiny GGUF files of every architecture `lora-ft import` reads, and what transformers' own GGUF
loader makes of them. Run on CPU from the repository root:

    /work/venv/bin/python scripts/golden/gguf_arch_golden.py

For each case it builds a random tiny model with transformers, writes it as llama.cpp's
`convert_hf_to_gguf.py` would (tensor names from `gguf.get_tensor_name_map`, llama's Q/K rows
permuted, Gemma's norm weights stored as w + 1, 1-D tensors in F32, the rest F16 / Q8_0 / Q4_0,
the same metadata keys), then loads that file with
`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` and records its config and every
parameter (shape, FNV-1a 64 of the little-endian f32 bytes, a few values) in
tests/golden/gguf_<case>.json; the GGUF files go to tests/fixtures/gguf/ (tests/gguf_arch.rs).

Where transformers 5.17's loader ignores what llama.cpp reads, the golden config holds
llama.cpp's value instead and says so under "llama_cpp_overrides":
- llama 3.x: the loader drops `rope_freqs` (and every `rope.scaling.*` key) and so loses the
  llama3 frequencies; the golden keeps the llama.cpp frequencies base^(-2i/d) / rope_freqs[i]
  (`llama_cpp_inv_freq`), which the imported config must reproduce.
- qwen3: the loader has no `attention.key_length` mapping (Qwen3Config's default head_dim 128
  stays); llama.cpp reads head_dim from that key, so this script passes it to from_pretrained.
- gemma2/gemma3: softcaps, the local RoPE base, linear RoPE scaling of the global layers and
  query_pre_attn_scalar come from the file / llama.cpp's rules (llama-model.cpp), not from the
  config class defaults.
"""

import json
import os
import sys

import gguf
import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as QT
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    Qwen2Config,
    Qwen3Config,
)

FIXTURES = "tests/fixtures/gguf"
GOLDEN = "tests/golden"


def fnv1a64_bytes(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for byte in data:
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def tiny_tokenizer(writer: gguf.GGUFWriter):
    """A byte-level BPE vocabulary (the 256 GPT-2 byte symbols, three merges, two control tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    alphabet = dict(zip(bs, (chr(c) for c in cs)))
    tokens = [alphabet[b] for b in range(256)] + ["Ġt", "he", "Ġthe", "<|bos|>", "<|eos|>"]
    types = [1] * 259 + [3, 3]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(259)
    writer.add_eos_token_id(260)
    writer.add_pad_token_id(260)
    return len(tokens)


def llama_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    # convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
    rope = cfg.rope_parameters
    base, dim = rope["rope_theta"], cfg.head_dim
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / float(freq)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32), freqs.numpy()


# (hf config class, gguf arch, overrides of the tiny shape)
CASES = {
    "llama3": (
        LlamaConfig,
        "llama",
        dict(
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192},
            tie_word_embeddings=True,
        ),
    ),
    "qwen2": (
        Qwen2Config,
        "qwen2",
        dict(
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
    ),
    "qwen3": (
        Qwen3Config,
        "qwen3",
        dict(
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=40960, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
        ),
    ),
    "gemma2": (
        Gemma2Config,
        "gemma2",
        dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=8192, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            query_pre_attn_scalar=32, sliding_window=64, attn_logit_softcapping=40.0,
            final_logit_softcapping=25.0,
        ),
    ),
    "gemma3": (
        Gemma3TextConfig,
        "gemma3",
        dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=7, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=131072, rms_norm_eps=1e-6,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            query_pre_attn_scalar=32, sliding_window=64,
        ),
    ),
}

# tensor type per HF parameter kind (1-D tensors are always F32, as llama.cpp keeps them)
TYPES = {
    "embed_tokens": QT.F16,
    "q_proj": QT.Q8_0,
    "k_proj": QT.Q8_0,
    "v_proj": QT.F16,
    "o_proj": QT.F32,
    "gate_proj": QT.Q4_0,
    "up_proj": QT.Q8_0,
    "down_proj": QT.F16,
    "lm_head": QT.Q8_0,
}


def write_gguf(case: str, cfg, model, path: str):
    _, arch, _ = CASES[case]
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny-{case}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    rope = cfg.rope_parameters
    if arch == "gemma3":
        rope = rope["full_attention"]
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope["rope_theta"])
    if arch.startswith("gemma"):
        w.add_sliding_window(cfg.sliding_window)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    vocab = tiny_tokenizer(w)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

    if arch == "llama":
        factors, _ = llama3_rope_factors(cfg)
        w.add_tensor("rope_freqs.weight", factors)
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(base)
        assert name is not None, hf_name
        t = t.detach().float()
        if arch == "llama" and base.endswith("q_proj"):
            t = llama_permute(t, cfg.num_attention_heads)
        if arch == "llama" and base.endswith("k_proj"):
            t = llama_permute(t, cfg.num_key_value_heads)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            t = t + 1.0  # convert_hf_to_gguf.py Gemma2Model/Gemma3Model.modify_tensors
        data = t.numpy().astype(np.float32)
        kind = TYPES.get(base.rsplit(".", 1)[-1], QT.F32) if data.ndim == 2 else QT.F32
        if kind == QT.F16:
            w.add_tensor(f"{name}.{suffix}", data.astype(np.float16))
        elif kind == QT.F32:
            w.add_tensor(f"{name}.{suffix}", data)
        else:
            q = gguf.quants.quantize(data, kind)
            w.add_tensor(f"{name}.{suffix}", q, raw_shape=q.shape, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_model(case: str):
    cls, _, shape = CASES[case]
    cfg = cls(vocab_size=261, bos_token_id=259, eos_token_id=260, pad_token_id=260, **shape)
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # norms near 1 (as trained ones are), everything else ~N(0, 0.5)
            p.copy_(torch.randn_like(p) * (0.1 if "norm" in name else 0.5) + (1.0 if "norm" in name and "gemma" not in case else 0.0))
    return cfg, model


def tensor_check(t: torch.Tensor):
    a = t.detach().to(torch.float32).contiguous().numpy()
    return {
        "shape": list(a.shape),
        "fnv1a64": fnv1a64_bytes(a.astype("<f4").tobytes()),
        "first": [float(x) for x in a.reshape(-1)[:4]],
    }


CONFIG_KEYS = [
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "vocab_size", "tie_word_embeddings", "bos_token_id", "eos_token_id",
    "pad_token_id", "rope_parameters", "hidden_act", "hidden_activation", "attention_bias",
    "mlp_bias", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
]


def main():
    only = sys.argv[1:] or list(CASES)
    os.makedirs(FIXTURES, exist_ok=True)
    for case in only:
        cfg, model = random_model(case)
        path = os.path.join(FIXTURES, f"tiny-{case}.gguf")
        write_gguf(case, cfg, model, path)
        extra = {"head_dim": cfg.head_dim} if case == "qwen3" else {}
        loaded = AutoModelForCausalLM.from_pretrained(
            FIXTURES, gguf_file=os.path.basename(path), dtype=torch.float32, **extra
        )
        c = loaded.config.to_dict()
        config = {k: c[k] for k in CONFIG_KEYS if k in c}
        config["architectures"] = [type(loaded).__name__]
        overrides = {}
        if case == "llama3":
            # transformers keeps the default rope; llama.cpp scales by rope_freqs
            overrides["rope_parameters"] = dict(cfg.rope_parameters)
        if case == "qwen3":
            overrides["head_dim"] = cfg.head_dim
        if case.startswith("gemma"):
            for key in ["query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"]:
                overrides[key] = getattr(cfg, key)
            overrides["rope_parameters"] = cfg.rope_parameters
        golden_config = {**config, **overrides}
        golden = {
            "source": f"transformers {transformers.__version__} from_pretrained(gguf_file="
            f"{os.path.basename(path)!r}, dtype=float32)",
            "gguf_file": path,
            "transformers_config": config,
            "llama_cpp_overrides": sorted(overrides),
            "config": golden_config,
            "tensors": {n: tensor_check(p) for n, p in loaded.named_parameters()},
        }
        if case == "llama3":
            factors, freqs = llama3_rope_factors(cfg)
            golden["llama_cpp_inv_freq"] = [float(f) / float(r) for f, r in zip(freqs, factors)]
        out = os.path.join(GOLDEN, f"gguf_{case}.json")
        with open(out, "w", encoding="utf-8") as f:
            json.dump(golden, f, indent=1)
            f.write("\n")
        print(f"wrote {path} ({os.path.getsize(path)} bytes) and {out}")


if __name__ == "__main__":
    main()
