#!/usr/bin/env python3
"""The benchmark's model architectures (issue 4's and issue 18's), as their published config.json
files say, and the FLOP counts the tables divide by.

Each entry is the config.json of the Hub repository named beside it, key for key (the model folder
written for the benchmark carries exactly this file, so `lora-ft` reads what a user downloads),
plus how each stack runs it: the compute dtype and the reference's attention implementation.

    bench_models.py --shell NAME     # dtype=… attn=… … for scripts/device/bench_train.sh
    bench_models.py --table          # N, LoRA parameters and FLOPs per token at 2048 for every model
"""
import argparse
import copy
import json
import sys

# mistralai/Mistral-7B-v0.1 and meta-llama/Llama-2-13b-hf as issue 4's benchmark wrote them
# (../shared/anchors/peft_qlora_baseline.py; its config keys, not the Hub file's extra ones).
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32000,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "sliding_window": 4096, "tie_word_embeddings": False, "hidden_act": "silu",
}
LLAMA2_13B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 5120,
    "intermediate_size": 13824, "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "hidden_act": "silu",
}
# mistralai/Mistral-7B-v0.3 (and -Instruct-v0.3: the same keys): v0.1's shape with a 32768-token
# vocabulary (the v3 tokenizer, whose template takes tools), rope_theta 1e6 and no sliding window
MISTRAL_7B_V03 = {
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
    "use_cache": True, "vocab_size": 32768,
}
# meta-llama/Llama-3.1-8B (and -Instruct: same keys but eos_token_id [128001, 128008, 128009])
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}
# Qwen/Qwen2.5-7B (q/k/v biases: Qwen2's attention always has them, config.json has no key for it)
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
    "vocab_size": 152064,
}
# Qwen/Qwen3-8B
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
# Qwen/Qwen3-14B
QWEN3_14B = dict(QWEN3_8B, hidden_size=5120, intermediate_size=17408, max_window_layers=40,
                 num_attention_heads=40, num_hidden_layers=40)
# mistralai/Mistral-Nemo-Base-2407 (-Instruct-2407: the same but max_position_embeddings 1024000)
MISTRAL_NEMO_12B = {
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 128000, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.3", "use_cache": True, "vocab_size": 131072,
}
# google/gemma-2-9b-it (no tie_word_embeddings key: Gemma2Config's default, tied, applies)
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2",
    "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
    "sliding_window_size": 4096, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
    "use_cache": True, "vocab_size": 256000,
}

# name: (config.json, compute dtype of both stacks, the reference's attention implementation)
# Gemma 2 runs in bf16: its real weights overflow f16 (embeddings scaled by sqrt(hidden), large
# post-norm weights; transformers neither refuses nor clamps f16 for it), so no one trains it in f16.
# Its reference attention is eager: transformers 5.17's SDPA path drops `softcap` silently
# (integrations/sdpa_attention.py takes it into **kwargs), so only eager computes the model's own
# function without flash-attn (`--attn sdpa` measures the faster, uncapped variant).
MODELS = {
    "mistral-7b": (MISTRAL_7B, "f16", "sdpa"),
    "llama2-13b": (LLAMA2_13B, "f16", "sdpa"),
    "mistral-7b-v0.3": (MISTRAL_7B_V03, "f16", "sdpa"),
    "llama3.1-8b": (LLAMA31_8B, "f16", "sdpa"),
    "qwen2.5-7b": (QWEN25_7B, "f16", "sdpa"),
    "qwen3-8b": (QWEN3_8B, "f16", "sdpa"),
    "qwen3-14b": (QWEN3_14B, "f16", "sdpa"),
    "mistral-nemo-12b": (MISTRAL_NEMO_12B, "f16", "sdpa"),
    "gemma2-9b": (GEMMA2_9B, "bf16", "eager"),
}
# issue 4's models keep issue 4's command (the anchor script, six shapes, time to the first step)
ISSUE4 = ("mistral-7b", "llama2-13b")
SHAPES_ISSUE18 = "512x8,2048x4,2048x8"

PEAK_FLOPS = 989e12  # H100 SXM (and H200) dense f16/bf16 tensor-core peak, no sparsity
LORA_R = 16
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def config(name: str) -> dict:
    return copy.deepcopy(MODELS[name][0])


def _family(c: dict) -> str:
    return (c.get("architectures") or ["LlamaForCausalLM"])[0]


def _sizes(c: dict):
    h, heads = c["hidden_size"], c["num_attention_heads"]
    d = c.get("head_dim") or h // heads
    kv = c.get("num_key_value_heads") or heads
    return h, c["intermediate_size"], heads, kv, d


def tied(c: dict) -> bool:
    """tie_word_embeddings as transformers reads it: absent means the config class's default."""
    return c.get("tie_word_embeddings", _family(c) == "Gemma2ForCausalLM")


def parameter_count(c: dict) -> int:
    """Every parameter of the model (embeddings and lm_head, a tied matrix once; q/k/v biases,
    q/k norms, Gemma's four norms a layer): N, counted as benches/train_*.md count it."""
    h, i, heads, kv, d = _sizes(c)
    fam = _family(c)
    layer = h * heads * d * 2 + h * kv * d * 2 + 3 * h * i
    layer += (4 if fam == "Gemma2ForCausalLM" else 2) * h
    if fam == "Qwen2ForCausalLM" or c.get("attention_bias"):
        layer += heads * d + 2 * kv * d
    if fam == "Qwen3ForCausalLM":
        layer += 2 * d  # q_norm, k_norm over each head
    embeddings = c["vocab_size"] * h * (1 if tied(c) else 2)
    return c["num_hidden_layers"] * layer + embeddings + h


def lora_parameter_count(c: dict, r: int = LORA_R) -> int:
    """LoRA A and B of rank r on the seven projections of every layer."""
    h, i, heads, kv, d = _sizes(c)
    per_layer = r * ((h + heads * d) * 2 + (h + kv * d) * 2 + 3 * (h + i))
    return c["num_hidden_layers"] * per_layer


def _windows(c: dict):
    """Each layer's attention window in tokens (None: the whole causal prefix), as transformers
    applies them: Gemma 2 alternates sliding (even layers) and global; Mistral's `sliding_window`
    covers every layer; Qwen2/3 only with use_sliding_window, from max_window_layers on."""
    n, w, fam = c["num_hidden_layers"], c.get("sliding_window"), _family(c)
    if not w:
        return [None] * n
    if fam == "Gemma2ForCausalLM":
        return [w if l % 2 == 0 else None for l in range(n)]
    if fam in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        if not c.get("use_sliding_window"):
            return [None] * n
        first = c.get("max_window_layers") or 0
        return [w if l >= first else None for l in range(n)]
    return [w] * n


def attention_flops_per_token(c: dict, seq: int) -> float:
    """Forward attention FLOPs per token, summed over layers: QKᵀ and PV (2·2 FLOPs a multiply-add)
    over the keys each query sees: the causal prefix, cut at the layer's window."""
    _, _, heads, _, d = _sizes(c)
    total = 0.0
    for w in _windows(c):
        seen = sum(min(t + 1, w or seq) for t in range(seq)) / seq
        total += 4 * heads * d * seen
    return total


def flops_per_token(c: dict, seq: int) -> dict:
    """Model FLOPs (what training needs: frozen weights forward and input gradient, 4N; LoRA
    forward, input and weight gradients, 6·N_lora; attention forward and backward, 3A) and hardware
    FLOPs with gradient checkpointing's recompute (one more forward: 6N + 8·N_lora + 4A)."""
    n, nl, a = parameter_count(c), lora_parameter_count(c), attention_flops_per_token(c, seq)
    return {"model": 4 * n + 6 * nl + 3 * a, "hardware": 6 * n + 8 * nl + 4 * a, "n": n, "n_lora": nl, "attn": a}


def tiny(name: str) -> dict:
    """The same config.json at toy sizes (every key kept, each feature still on: head_dim apart
    from hidden/heads where the real one is, GQA, biases, windows, softcaps) for CPU checks."""
    c = config(name)
    real_h, real_heads = c["hidden_size"], c["num_attention_heads"]
    explicit = "head_dim" in c and c["head_dim"] != real_h // real_heads
    heads = 4
    kv = 4 if (c.get("num_key_value_heads") or real_heads) == real_heads else 2
    c.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=heads,
             vocab_size=512)
    if "num_key_value_heads" in c:
        c["num_key_value_heads"] = kv
    if "head_dim" in c:
        c["head_dim"] = 32 if explicit else 16
    if c.get("sliding_window") and _family(c) in ("Gemma2ForCausalLM", "MistralForCausalLM"):
        c["sliding_window"] = 8
        if "sliding_window_size" in c:
            c["sliding_window_size"] = 8
    if "query_pre_attn_scalar" in c:
        c["query_pre_attn_scalar"] = c["head_dim"]
    if "max_window_layers" in c:
        c["max_window_layers"] = 2
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids inside the toy vocabulary
        if key in c:
            c[key] = [t % 512 for t in c[key]] if isinstance(c[key], list) else c[key] % 512
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shell", metavar="NAME", help="dtype=… attn=… issue4=0|1 size_gib=… for a shell's eval")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--names", action="store_true", help="every model name, one a line")
    ap.add_argument("--config", metavar="NAME", help="print the config.json")
    args = ap.parse_args()
    if args.shell:
        if args.shell not in MODELS:
            sys.exit(f"unknown model {args.shell!r}: one of {', '.join(MODELS)}")
        cfg, dtype, attn = MODELS[args.shell]
        size_gib = (parameter_count(cfg) * 2 + (1 << 30) - 1) >> 30  # the 16-bit folder, rounded up
        print(f"dtype={dtype} attn={attn} issue4={int(args.shell in ISSUE4)} size_gib={size_gib}")
    elif args.names:
        print("\n".join(MODELS))
    elif args.config:
        print(json.dumps(config(args.config), indent=2))
    elif args.table:
        print("| model | N | N_lora | attention FLOPs/token at 2048 (fwd) | model FLOPs/token at 2048 | with recompute |")
        print("|---|---:|---:|---:|---:|---:|")
        for name in MODELS:
            f = flops_per_token(config(name), 2048)
            print(f"| {name} | {f['n'] / 1e9:.3f}e9 | {f['n_lora'] / 1e6:.1f}e6 | {f['attn'] / 1e9:.2f}e9 "
                  f"| {f['model'] / 1e9:.2f}e9 | {f['hardware'] / 1e9:.2f}e9 |")
    else:
        ap.print_help()


if __name__ == "__main__":
    main()
