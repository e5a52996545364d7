#!/usr/bin/env python3
"""Issue 21's llama.cpp check: a GGUF file `lora-ft export-gguf` wrote, run by llama.cpp itself
(llama-cpp-python, CPU), against `lora-ft chat` on the folder it came from: the same greedy reply
to each of ten customer-service prompts.

    python3 scripts/gguf_llamacpp_check.py --gguf OUT.gguf --model DIR [--adapter A] [--lora-ft BIN]
    python3 scripts/gguf_llamacpp_check.py --gguf BASE.gguf --lora-gguf ADAPTER.gguf --model DIR --adapter A
      (an `export-gguf --adapter-only` file applied by llama.cpp at run time over the base's GGUF)

Both sides get the same prompt text: the model's own chat template (tokenizer_config.json),
rendered here with jinja2 as transformers renders it, with the generation prompt; llama.cpp
tokenizes it with its special tokens parsed. `lora-ft chat --temperature 0` decodes greedily in
f32 from the HF folder; llama.cpp greedily (top_k 1) from the GGUF. Prints one line per prompt
and exits 1 if a reply differs (the first differing position is printed).
"""
import argparse
import json
import os
import subprocess
import sys

PROMPTS = [
    "My order arrived damaged. What should I do?",
    "How do I reset my password?",
    "Can I change the delivery address after ordering?",
    "I was charged twice for the same order.",
    "What is your return policy?",
    "The app crashes when I open my cart.",
    "Do you ship to Canada?",
    "How long does a refund take?",
    "I want to cancel my subscription.",
    "Where is my package? It has been a week.",
]


def ours(bin_, model, adapter, prompt, n):
    cmd = [bin_, "chat", "--model", model, "--prompt", prompt, "--quantization", "none",
           "--max-new-tokens", str(n), "--temperature", "0"]
    if adapter:
        cmd += ["--adapter", adapter]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"lora-ft chat failed: {out.stderr[-2000:]}")
    return out.stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--model", required=True, help="the HF folder the GGUF was exported from")
    ap.add_argument("--adapter", default="", help="the adapter merged into the GGUF, given to lora-ft chat")
    ap.add_argument("--lora-gguf", default=None, help="a LoRA GGUF (export-gguf --adapter-only) for llama.cpp to apply")
    ap.add_argument("--lora-ft", default="target/release/lora-ft")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args()
    import jinja2
    from llama_cpp import Llama

    cfg = json.load(open(os.path.join(args.model, "tokenizer_config.json")))
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(cfg["chat_template"])
    llm = Llama(model_path=args.gguf, lora_path=args.lora_gguf, n_ctx=1024, n_threads=2, verbose=False, seed=0)
    eos = cfg.get("eos_token")
    differing = 0
    for prompt in PROMPTS:
        text = template.render(messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
                               bos_token=cfg.get("bos_token", ""), eos_token=eos)
        done = llm(text, max_tokens=args.max_new_tokens, temperature=0.0, top_k=1, top_p=1.0,
                   repeat_penalty=1.0, stop=[eos] if eos else None)
        theirs = done["choices"][0]["text"].strip()
        mine = ours(args.lora_ft, args.model, args.adapter, prompt, args.max_new_tokens)
        same = theirs == mine
        differing += not same
        print(json.dumps({"prompt": prompt, "same": same, "llama.cpp": theirs, "lora-ft": mine}))
        if not same:
            at = next((i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b), min(len(theirs), len(mine)))
            print(f"  first difference at character {at}")
    print(f"{len(PROMPTS) - differing} of {len(PROMPTS)} replies identical")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
