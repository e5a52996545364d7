#!/usr/bin/env python3
"""The peer's QLoRA training step for any model folder: Unsloth (FastLanguageModel over
transformers + PEFT + bitsandbytes) on the anchor's recipe, as peft_train_ref.py runs it: NF4 +
double quantization (Unsloth's own 4-bit config), LoRA r=16 alpha 32 dropout 0 on all seven
projections, Unsloth's gradient checkpointing ("unsloth": checkpoints offloaded to host memory),
and train_ref_loop.py's step and loop (autocast, loss scaling in f16, clipping at 1.0,
torch.optim.Adafactor at lr 2e-4, random token ids, 2 warm-up steps then --steps timed ones) on the
folder scripts/bench/load_memory_ref.py --create wrote, so the three stacks train the same random
model. Unsloth's kernels (fast RMSNorm, RoPE, SwiGLU/GeGLU, LoRA MLP/QKV/O, its cross-entropy)
replace the model's; attention is PyTorch's SDPA (no xformers or flash-attn on the GPU machine).

    unsloth_train_ref.py --model DIR [--shapes 512x8,2048x4,2048x8] [--dtype f16|bf16]
                         [--steps 4] [--out FILE] [--checkpoint-skip 0|auto]

UNSLOTH_BLOCK_COMPILE=0 (Unsloth's own switch) runs each decoder layer uncompiled, its Triton
kernels still in: Gemma 2's compiled block failed in Inductor on the H200 (session 12); its JSON
says which ran (block_compile).

`--checkpoint-skip auto` is Unsloth's own selective checkpointing (get_peft_model's
checkpoint_skip_layers): after the first step it keeps as many layers un-checkpointed as fit, sized
once, for that first step's shape, within `--gpu-mem` GiB where given (torch's per-process memory
fraction, which Unsloth reads). The shapes then run largest first (batch × length), so that the
layers it keeps fit every shape of the run, as they would a user's run of the largest. Unsloth needs a CUDA GPU. It is carried as wheels (scripts/device/
unsloth_wheels.txt, pack.sh unsloth) and runs offline: HF_HUB_OFFLINE and its statistics off. Its
import sets PYTORCH_ALLOC_CONF=expandable_segments:True for its own process, as for its users.
"""
import time

STARTED = time.time()  # before the imports: Unsloth's own (patching, kernels) count in its first step

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

# offline and quiet before anything imports huggingface_hub or unsloth
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("UNSLOTH_DISABLE_STATISTICS", "1")
# the code Unsloth generates goes to ./unsloth_compiled_cache otherwise (unsloth_zoo/compiler.py)
os.environ.setdefault("UNSLOTH_COMPILE_LOCATION", os.path.join(tempfile.gettempdir(), "unsloth_compiled_cache"))
# no silent fallback to Unsloth's CPU backend where no GPU is seen
os.environ.setdefault("UNSLOTH_DISABLE_CPU_FALLBACK", "1")

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--model", required=True, help="HF folder (config.json + safetensors)")
ap.add_argument("--arch", default="", help="the name to print in the table (bench_models.MODELS)")
ap.add_argument("--shapes", default="512x8,2048x4,2048x8")
ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--checkpoint-skip", default="0", choices=["0", "auto"])
ap.add_argument("--gpu-mem", type=float, default=0.0, help="GiB of the card Unsloth may use (0: all)")
ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "unsloth_ref.json"))
args = ap.parse_args()

from unsloth import FastLanguageModel  # noqa: E402  (before transformers and peft: it patches them)
import torch  # noqa: E402

import train_ref_loop  # noqa: E402


def word_level_tokenizer(folder, vocab_size, max_len):
    """A tokenizer with one word per id of the model's vocabulary, special tokens first: Unsloth
    loads a tokenizer with every model (llama.py `load_correct_tokenizer`, no way around it) and
    grows the embeddings where the tokenizer has more ids or lacks a pad token distinct from eos;
    the benchmark's random ids need no real one, and its folder (load_memory_ref.py) has none."""
    os.makedirs(folder, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {t: i for i, t in enumerate(special)}
    vocab.update({f"t{i}": i for i in range(len(special), vocab_size)})
    added = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
             for i, t in enumerate(special)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    json.dump(tok, open(os.path.join(folder, "tokenizer.json"), "w"))
    # the class named, or Qwen's and Gemma's tokenizer classes add special tokens of their own
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
               "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": max_len, "padding_side": "right"},
              open(os.path.join(folder, "tokenizer_config.json"), "w"))
    return folder


compute = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
if args.gpu_mem:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_mem * 2**30 / total), 0)
max_seq = max(int(shape.split("x")[0]) for shape in args.shapes.split(","))
vocab_size = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
tokenizer = word_level_tokenizer(os.path.normpath(args.model) + "-unsloth-tokenizer", vocab_size, max_seq)
t0 = time.time()
model, _tokenizer = FastLanguageModel.from_pretrained(
    model_name=args.model, tokenizer_name=tokenizer, max_seq_length=max_seq, dtype=compute, load_in_4bit=True)
load_s = time.time() - t0
skip = {"checkpoint_skip_layers": "auto"} if args.checkpoint_skip == "auto" else {}
model = FastLanguageModel.get_peft_model(
    model, r=16, lora_alpha=32, lora_dropout=0.0, bias="none", use_gradient_checkpointing="unsloth",
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    random_state=3407, **skip)
FastLanguageModel.for_training(model)
# f16 loss scaling unscales f32 gradients only (torch's GradScaler refuses f16 ones), as Hugging
# Face's Trainer needs them under fp16 = True: LoRA weights left in f16 train in f32, as PEFT's are
upcast = [p for p in model.parameters() if p.requires_grad and p.dtype == torch.float16]
for p in upcast:
    p.data = p.data.float()


def version(name):
    try:
        return __import__(name).__version__
    except Exception:
        return None


info = dict(stack="unsloth", arch=args.arch or os.path.basename(os.path.normpath(args.model)),
            dtype=args.dtype, attn="unsloth (sdpa)", load_s=round(load_s, 1), checkpoint_skip=args.checkpoint_skip,
            gpu_mem_gib=args.gpu_mem or None, lora_upcast_from_f16=len(upcast),
            block_compile=os.environ.get("UNSLOTH_BLOCK_COMPILE", "1") != "0",
            versions={n: version(n) for n in
                      ("unsloth", "unsloth_zoo", "torch", "transformers", "peft", "bitsandbytes", "trl")})
shapes = args.shapes.split(",")
if args.checkpoint_skip == "auto":
    shapes.sort(key=lambda shape: -int(shape.split("x")[0]) * int(shape.split("x")[1]))
train_ref_loop.run(model, compute, "cuda", ",".join(shapes), args.steps, args.out, info, started=STARTED)
