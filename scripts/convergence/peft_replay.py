# Replays a lora-ft training run in the reference stack — transformers + PEFT (+ bitsandbytes for
# NF4) — from the trace `lora-ft train CONFIG --trace DIR` wrote: the same initial adapter, the
# same micro-batches in the same order, and the hyperparameters of the run's resolved config
# (RUN_DIR/config.json). Writes one JSON line per optimizer step and per evaluation, in the shape
# of lora-ft's metrics.jsonl, so scripts/convergence/compare.py can set the curves side by side.
#
#   python3 peft_replay.py --model HF_DIR --trace TRACE_DIR --run RUN_DIR --out peft_metrics.jsonl
#
# The recipe is the anchor's (../shared/anchors/peft_qlora_baseline.py): NF4 + double quant with
# fp16 (or bf16) compute, prepare_model_for_kbit_training, autocast, GradScaler for fp16,
# global-norm clipping; the optimizer and schedule are the ones lora-ft's config names.
import argparse, json, math, os, time

import torch
import torch.nn.functional as F
from peft import PeftModel, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, get_scheduler
from transformers.optimization import Adafactor as HfAdafactor

INIT_SCALE, GROWTH_INTERVAL = 65536.0, 2000  # lora-ft's loss_scale.rs, torch's GradScaler defaults


def load_model(model_dir, cfg, dtype):
    kwargs = dict(dtype=dtype, device_map={"": 0}, attn_implementation="sdpa")
    model_cfg = cfg["model"]
    if model_cfg.get("quantization", "nf4") == "nf4":
        from transformers import BitsAndBytesConfig
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=model_cfg.get("double_quant", True))
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    if "quantization_config" in kwargs:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model


def make_optimizer(params, cfg):
    o, lr, wd = cfg["optim"], cfg["train"]["lr"], cfg["train"]["weight_decay"]
    if o["flavor"] == "torch":
        return torch.optim.Adafactor(params, lr=lr, beta2_decay=o["decay_rate"],
                                     eps=(o["eps1"], o["eps2"]), d=o["clip_threshold"], weight_decay=wd)
    return HfAdafactor(params, lr=None if o["relative_step"] else lr,
                       eps=(o["eps1"] if o["eps1"] is not None else 1e-30, o["eps2"]),
                       clip_threshold=o["clip_threshold"], decay_rate=o["decay_rate"], beta1=o["beta1"],
                       weight_decay=wd, scale_parameter=o["scale_parameter"],
                       relative_step=o["relative_step"], warmup_init=o["warmup_init"])


def read_batches(path):
    with open(path) as f:
        for line in f:
            b = json.loads(line)
            shape = (b["batch_size"], b["seq_len"])
            ids = torch.tensor(b["input_ids"], dtype=torch.long).view(shape)
            labels = torch.tensor(b["labels"], dtype=torch.long).view(shape)
            yield b["step"], ids, labels


def loss_sum(model, ids, labels, dtype):
    """Summed next-token cross-entropy over trained positions, in f32, and their count."""
    ids, labels = ids.cuda(), labels.cuda()
    with torch.autocast("cuda", dtype=dtype):
        logits = model(input_ids=ids).logits
    target = labels[:, 1:].reshape(-1)
    flat = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    return F.cross_entropy(flat, target, ignore_index=-100, reduction="sum"), int((target != -100).sum())


@torch.no_grad()
def evaluate(model, eval_batches, dtype):
    total, tokens = 0.0, 0
    for _, ids, labels in eval_batches:
        s, n = loss_sum(model, ids, labels, dtype)
        total, tokens = total + s.item(), tokens + n
    return total / max(tokens, 1), tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="HF folder lora-ft trained (the imported SmolLM2)")
    ap.add_argument("--trace", required=True, help="the folder lora-ft train --trace wrote")
    ap.add_argument("--run", required=True, help="lora-ft's output.dir (its config.json)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(args.run, "config.json")))
    t = cfg["train"]
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[t["compute_dtype"]]
    model = load_model(args.model, cfg, dtype)
    model = PeftModel.from_pretrained(model, os.path.join(args.trace, "initial_adapter"), is_trainable=True)
    model.train()  # checkpointing is active in training mode only; dropout is 0 in the trace's adapter
    params = [p for p in model.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in params), "LoRA master weights must be f32"
    opt = make_optimizer(params, cfg)
    steps = {}
    for step, ids, labels in read_batches(os.path.join(args.trace, "train_batches.jsonl")):
        steps.setdefault(step, []).append((ids, labels))
    total = max(steps)
    sched = get_scheduler(t["schedule"], opt, num_warmup_steps=t["warmup_steps"], num_training_steps=total)
    scaler = torch.amp.GradScaler("cuda", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL,
                                  enabled=dtype == torch.float16)
    eval_batches = list(read_batches(os.path.join(args.trace, "eval_batches.jsonl")))
    out = open(args.out, "w")

    def log(record):
        out.write(json.dumps(record) + "\n")
        out.flush()
        print(json.dumps(record), flush=True)

    def log_eval(step):
        loss, n = evaluate(model, eval_batches, dtype)
        log({"step": step, "eval_loss": loss, "eval_ppl": math.exp(loss), "eval_tokens": n})

    log_eval(0)
    started = time.time()
    for step in range(1, total + 1):
        micro = steps[step]
        trained = sum(int((labels[:, 1:] != -100).sum()) for _, labels in micro)
        loss_total = 0.0
        for ids, labels in micro:
            s, _ = loss_sum(model, ids, labels, dtype)
            scaler.scale(s / trained).backward()
            loss_total += s.item()
        scaler.unscale_(opt)
        max_norm = t["max_grad_norm"] if t["max_grad_norm"] > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
        lr = sched.get_last_lr()[0]
        scaler.step(opt)
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)
        log({"step": step, "loss": loss_total / trained, "lr": lr, "grad_norm": grad_norm,
             "loss_scale": scaler.get_scale() if scaler.is_enabled() else 1.0,
             "elapsed_s": time.time() - started})
        if (t["eval_every"] > 0 and step % t["eval_every"] == 0) or step == total:
            log_eval(step)


if __name__ == "__main__":
    main()
