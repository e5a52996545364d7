"""A synthetic 80-layer Llama with grouped KV heads and an untied lm_head (what llama.cpp calls a
70B: its Q4_K_M gives such a model's attn_v Q5_K, not Q4_K) for the Q4_K_M golden: hidden 256, 4
heads, 2 KV heads, SmolLM2's tokenizer (vocab 49152). Every weight comes from an integer hash,
so tests/gguf_q4km.rs builds the same folder bit for bit in Rust:

    value(t, i) = ((i·2654435761 + t·40503) mod 2^32 / 2^32 − 0.5) · 0.02·(1 + t mod 5)

in f64, rounded to f32, t the tensor's index in the sorted names, i the element's; norms 1.

    python3 scripts/golden/gguf_q4km_llama80.py OUT_DIR SMOLLM2_HF_DIR
    lora-ft export-gguf --model OUT_DIR F32.gguf --type f32
    lora-ft export-gguf --model OUT_DIR Q.gguf --type q4_k_m
    python3 scripts/gguf_q4km_check.py --ours Q.gguf --source F32.gguf --golden tests/golden/gguf_q4km_llama80.json
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
          "intermediate_size": 256, "num_hidden_layers": 80, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 49152, "max_position_embeddings": 2048,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
          "bos_token_id": 1, "eos_token_id": 2}


def shapes():
    h, kv, v = 256, 128, 49152
    out = {"model.embed_tokens.weight": [v, h], "lm_head.weight": [v, h], "model.norm.weight": [h]}
    for l in range(80):
        p = f"model.layers.{l}."
        out.update({p + "self_attn.q_proj.weight": [h, h], p + "self_attn.k_proj.weight": [kv, h],
                    p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, h],
                    p + "mlp.gate_proj.weight": [h, h], p + "mlp.up_proj.weight": [h, h],
                    p + "mlp.down_proj.weight": [h, h], p + "input_layernorm.weight": [h],
                    p + "post_attention_layernorm.weight": [h]})
    return out


def values(t, n):
    i = np.arange(n, dtype=np.uint64)
    u = ((i * np.uint64(2654435761) + np.uint64(t * 40503)) % np.uint64(2**32)).astype(np.float64) / 2.0**32
    return ((u - 0.5) * (0.02 * (1 + t % 5))).astype(np.float32)


def main():
    out, smol = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    json.dump(CONFIG, open(os.path.join(out, "config.json"), "w"))
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(smol, name), out)
    names = sorted(shapes().items())
    header, offset = {}, 0
    for name, shape in names:
        size = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for t, (name, shape) in enumerate(names):
            n = int(np.prod(shape))
            f.write((np.ones(n, np.float32) if len(shape) == 1 else values(t, n)).tobytes())
    print(f"wrote {out}: {len(names)} tensors")


if __name__ == "__main__":
    main()
