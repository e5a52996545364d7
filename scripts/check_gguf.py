"""Reads a GGUF file that `lora-ft export-gguf` wrote with gguf-py's own reader (`pip install
gguf`) and checks what llama.cpp needs of a Llama-family file: the keys, every tensor's name,
shape and type (1-D f32, 2-D the file type), the tokenizer arrays' lengths. With `--source DIR`
(the model folder exported with no adapter, one f32/f16/bf16 model.safetensors) every tensor's
bytes must also equal what gguf-py makes of the source tensor: Q/K rows permuted as
convert_hf_to_gguf.py's `LlamaModel.permute`, then `gguf.quants.quantize` to the file's type.
Prints a summary; exits 1 naming the first problem.

    python3 scripts/check_gguf.py FILE.gguf [--source DIR]
"""

import json
import os
import sys

import numpy as np
from gguf import quants

from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

REQUIRED = [
    "general.architecture", "general.name", "general.file_type", "llama.context_length",
    "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
    "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
    "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size", "tokenizer.ggml.model",
    "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
]
FILE_TYPES = {1: T.F16, 7: T.Q8_0, 32: T.BF16}


def fail(message):
    print(f"error: {message}")
    sys.exit(1)


def main(path):
    reader = GGUFReader(path)
    fields = reader.fields
    for key in REQUIRED:
        if key not in fields:
            fail(f"{path}: key {key} is missing")
    value = lambda key: fields[key].contents()
    if value("general.architecture") != "llama":
        fail(f"general.architecture is {value('general.architecture')!r}")
    weight_type = FILE_TYPES.get(value("general.file_type"))
    if weight_type is None:
        fail(f"general.file_type {value('general.file_type')} is none of 1 (f16), 7 (q8_0), 32 (bf16)")
    vocab = value("llama.vocab_size")
    for key in ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type"]:
        if len(fields[key].data) != vocab:
            fail(f"{key} has {len(fields[key].data)} entries, llama.vocab_size is {vocab}")
    layers = value("llama.block_count")
    names = {t.name for t in reader.tensors}
    for layer in range(layers):
        for part in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]:
            if f"blk.{layer}.{part}.weight" not in names:
                fail(f"tensor blk.{layer}.{part}.weight is missing")
    for t in reader.tensors:
        want = T.F32 if len(t.shape) == 1 else weight_type
        if t.tensor_type != want and not (len(t.shape) > 1 and t.tensor_type == T.F16):
            fail(f"tensor {t.name} is {t.tensor_type.name}, expected {want.name}")
    types = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    print(
        f"{path}: GGUF v{value('GGUF.version')}, {len(fields)} keys, {len(reader.tensors)} tensors {types}, "
        f"{layers} layers, vocabulary {vocab} ({value('tokenizer.ggml.model')}/{value('tokenizer.ggml.pre')}), "
        f"{len(fields['tokenizer.ggml.merges'].data)} merges, chat template: {'tokenizer.chat_template' in fields}"
    )


def safetensors(path):
    """name -> f32 array of a safetensors file, read with numpy alone."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        data = f.read()
    dtypes = {"F32": np.float32, "F16": np.float16}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if entry["dtype"] == "BF16":
            values = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtypes[entry["dtype"]]).astype(np.float32)
        out[name] = values.reshape(entry["shape"])
    return out


def permute(weights, n_head):
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def compare_with_source(path, source):
    reader = GGUFReader(path)
    config = json.load(open(os.path.join(source, "config.json")))
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    tensors = safetensors(os.path.join(source, "model.safetensors"))
    gguf_name = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for name, values in tensors.items():
        if name.startswith("model.layers."):
            layer, module = name[len("model.layers."):].split(".", 1)
            gguf_name[name] = f"blk.{layer}.{parts[module.rsplit('.', 1)[0]]}.weight"
    ours = {t.name: t for t in reader.tensors}
    for name, values in tensors.items():
        t = ours[gguf_name[name]]
        if t.name.endswith("attn_q.weight"):
            values = permute(values, heads)
        elif t.name.endswith("attn_k.weight"):
            values = permute(values, kv_heads)
        with np.errstate(over="ignore"):
            want = quants.quantize(values, t.tensor_type).tobytes()
        if bytes(t.data.tobytes()) != want:
            fail(f"tensor {t.name}: our {t.tensor_type.name} bytes differ from gguf-py's of {name}")
    print(f"{path}: all {len(tensors)} tensors byte for byte as gguf-py writes {source}")


if __name__ == "__main__":
    main(sys.argv[1])
    if len(sys.argv) == 4 and sys.argv[2] == "--source":
        compare_with_source(sys.argv[1], sys.argv[3])
