#!/usr/bin/env python3
"""Checks of bench_models.py on a CPU, against transformers and PEFT themselves (no GPU, no
download): exits non-zero on the first failure.

    /work/venv/bin/python scripts/bench/check_bench_models.py

1. N: parameter_count(config) equals the parameters of transformers' own model of each published
   config.json, built on the meta device (full size, no memory).
2. N_lora: lora_parameter_count equals PEFT's trainable parameters (r=16, seven projections).
3. Windows: each layer's window equals what transformers' config makes of the same file
   (layer_types / sliding_window), and the attention FLOPs meet their closed forms: no window
   4·L·H·d·(T+1)/2, a window of 1 key 4·L·H·d.
4. Features: transformers reads each published file into the feature the benchmark is for
   (Llama 3.1's llama3 RoPE, Qwen2.5's q/k/v biases, Qwen3's q/k norms and head_dim, Nemo's head_dim,
   Gemma 2's softcaps, query_pre_attn_scalar, sliding window and tied embeddings), and every toy
   config (bench_models.tiny) keeps the same features on.
"""
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

import bench_models as bm

failures = []


def check(ok: bool, what: str):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def hf_config(c: dict):
    model_type = c["model_type"]
    return AutoConfig.for_model(model_type, **{k: v for k, v in c.items() if k != "model_type"})


def meta_model(c: dict):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config(c))


def features(name: str, cfg) -> list:
    """What transformers made of the file, per feature the model is in the benchmark for."""
    d = cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads
    out = []
    if name == "llama3.1-8b":
        rope = cfg.rope_parameters
        out.append(("rope llama3, factor 8", rope.get("rope_type") == "llama3" and rope.get("factor") == 8.0))
    if name.startswith("qwen3"):
        out.append(("head_dim 128 read from the file", cfg.head_dim == 128))
    if name == "mistral-nemo-12b":
        out.append(("head_dim 128, not hidden/heads (160)", d == 128 and cfg.hidden_size // cfg.num_attention_heads == 160))
    if name == "gemma2-9b":
        out.append(("softcaps 50 / 30", cfg.attn_logit_softcapping == 50.0 and cfg.final_logit_softcapping == 30.0))
        out.append(("query_pre_attn_scalar 256", cfg.query_pre_attn_scalar == 256))
        out.append(("tied embeddings (key absent, class default)", cfg.tie_word_embeddings is True))
        out.append(("sliding window 4096 on even layers", cfg.sliding_window == 4096
                    and cfg.layer_types[:2] == ["sliding_attention", "full_attention"]))
    return out


def module_features(name: str, model) -> list:
    attn = model.model.layers[0].self_attn
    out = []
    if name == "qwen2.5-7b":
        out.append(("q/k/v biases, none on o", all(getattr(attn, p).bias is not None for p in ("q_proj", "k_proj", "v_proj"))
                    and attn.o_proj.bias is None))
    if name.startswith("qwen3"):
        out.append(("q/k norms", hasattr(attn, "q_norm") and hasattr(attn, "k_norm")))
    return out


def main():
    for name in bm.MODELS:
        c = bm.config(name)
        cfg = hf_config(c)
        model = meta_model(c)
        n_hf = sum(p.numel() for p in model.parameters())
        n = bm.parameter_count(c)
        check(n == n_hf, f"{name}: N {n:,} (transformers: {n_hf:,})")
        layer_types = getattr(cfg, "layer_types", None)
        window = getattr(cfg, "sliding_window", None)
        if layer_types:
            hf_windows = [window if t == "sliding_attention" else None for t in layer_types]
        else:
            hf_windows = [window] * cfg.num_hidden_layers
        check(bm._windows(c) == hf_windows, f"{name}: windows per layer as transformers' config")
        for what, ok in features(name, cfg) + module_features(name, model):
            check(ok, f"{name}: {what}")

        # toy sizes: the same features, and PEFT's own count of the LoRA parameters
        t = bm.tiny(name)
        tcfg = hf_config(t)
        torch.manual_seed(0)
        tiny_model = AutoModelForCausalLM.from_config(tcfg)
        if name == "llama3.1-8b":
            check(tcfg.rope_parameters.get("rope_type") == "llama3", f"{name} (tiny): rope llama3")
        for what, ok in module_features(name, tiny_model):
            check(ok, f"{name} (tiny): {what}")
        check(sum(p.numel() for p in tiny_model.parameters()) == bm.parameter_count(t), f"{name} (tiny): N")
        peft_model = get_peft_model(tiny_model, LoraConfig(r=bm.LORA_R, lora_alpha=32, target_modules=list(bm.PROJECTIONS)))
        n_lora = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        check(n_lora == bm.lora_parameter_count(t), f"{name} (tiny): N_lora {bm.lora_parameter_count(t):,} (PEFT: {n_lora:,})")
        if name == "gemma2-9b":
            check(tcfg.attn_logit_softcapping == 50.0 and tcfg.tie_word_embeddings and tcfg.sliding_window == 8
                  and tcfg.query_pre_attn_scalar == tcfg.head_dim, f"{name} (tiny): softcaps, tied, window 8 < seq")
        if name == "mistral-nemo-12b":
            check(tcfg.head_dim != tcfg.hidden_size // tcfg.num_attention_heads, f"{name} (tiny): head_dim apart")

    # attention FLOPs: closed forms
    c = bm.config("llama3.1-8b")
    L, H, d = c["num_hidden_layers"], c["num_attention_heads"], c["hidden_size"] // c["num_attention_heads"]
    for T in (512, 2048):
        check(bm.attention_flops_per_token(c, T) == 4 * L * H * d * (T + 1) / 2, f"attention FLOPs, no window, T={T}")
    c = dict(bm.config("mistral-7b"), sliding_window=1)
    check(bm.attention_flops_per_token(c, 2048) == 4 * 32 * 32 * 128, "attention FLOPs, a window of one key")
    c = bm.config("gemma2-9b")
    check(bm.attention_flops_per_token(c, 2048) == 4 * 42 * 16 * 256 * 2049 / 2, "Gemma 2 at 2048: the 4096 window cuts nothing")
    print(f"\n{len(failures)} failure(s)" if failures else "\nall checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
