"""Time to the first training step in the reference stack, for `first_step_s` of `lora-ft bench
train`: from process start (before importing torch) through loading the model into NF4 with
bitsandbytes, PEFT's LoRA (the anchor's recipe: r=16 on all seven projections, checkpointing),
Adafactor and one fp16 step with loss scaling (bf16: none) at SEQxBATCH, to the GPU finishing it.

  python3 scripts/bench/first_step_ref.py --model DIR [--shape 512x8] [--dtype f16|bf16] [--attn sdpa|eager]
"""
import time

T0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--shape", default="512x8")
ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
args = ap.parse_args()
seq, bs = (int(x) for x in args.shape.split("x"))
compute = torch.float16 if args.dtype == "f16" else torch.bfloat16
bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                         bnb_4bit_compute_dtype=compute)
model = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=bnb, dtype=compute,
                                             device_map={"": 0}, attn_implementation=args.attn)
load_s = time.time() - T0
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                        gradient_checkpointing_kwargs={"use_reentrant": False})
targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                                         target_modules=targets))
model.train()
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.Adafactor(params, lr=2e-4)
scaler = torch.amp.GradScaler("cuda", enabled=compute == torch.float16)
ids = torch.randint(0, model.config.vocab_size, (bs, seq), device="cuda")
with torch.autocast("cuda", dtype=compute):
    loss = model(input_ids=ids, labels=ids).loss
scaler.scale(loss).backward()
scaler.unscale_(opt)
torch.nn.utils.clip_grad_norm_(params, 1.0)
scaler.step(opt)
scaler.update()
torch.cuda.synchronize()
print(json.dumps({"stack": "transformers+peft+bitsandbytes", "seq": seq, "bs": bs,
                  "load_s": round(load_s, 2), "first_step_s": round(time.time() - T0, 2)}), flush=True)
