"""The reference for `lora-ft bench attention`: causal attention as transformers' Mistral/Llama
"sdpa" path runs it under PEFT (repeat_kv, then torch's scaled_dot_product_attention with
is_causal, which picks its FlashAttention backend in f16), forward and backward on random inputs,
printing the same JSON fields per shape.

  python3 scripts/bench/attention_ref.py --shapes 512x8,2048x8 [--heads 32 --kv-heads 8 --head-dim 128]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def repeat_kv(x, n_rep):
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def timed(fn, iters):
    fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / iters


def row(seq, bs, heads, kv_heads, head_dim, iters, dtype):
    dev = "cuda"
    q = torch.randn(bs, heads, seq, head_dim, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(bs, kv_heads, seq, head_dim, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(bs, kv_heads, seq, head_dim, device=dev, dtype=dtype, requires_grad=True)
    d_ctx = torch.randn(bs, heads, seq, head_dim, device=dev, dtype=dtype)
    n_rep = heads // kv_heads

    def forward():
        return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True)

    with torch.no_grad():
        fwd_s = timed(forward, iters)
    out = forward()
    bwd_s = timed(lambda: torch.autograd.grad(out, (q, k, v), d_ctx, retain_graph=True), iters)
    flops = 2.0 * bs * heads * seq * seq * head_dim
    return {"seq": seq, "bs": bs, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "fwd_ms": fwd_s * 1e3, "bwd_ms": bwd_s * 1e3,
            "fwd_tflops": flops / fwd_s / 1e12, "bwd_tflops": 2.5 * flops / bwd_s / 1e12}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="512x8,2048x8")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    a = ap.parse_args()
    dtype = torch.float16 if a.dtype == "f16" else torch.bfloat16
    for shape in a.shapes.split(","):
        seq, bs = (int(x) for x in shape.split("x"))
        print(json.dumps(row(seq, bs, a.heads, a.kv_heads, a.head_dim, a.iters, dtype)), flush=True)


if __name__ == "__main__":
    main()
