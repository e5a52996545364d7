"""The timed loop the reference stacks run (peft_train_ref.py, unsloth_train_ref.py): the anchor's
step (../shared/anchors/peft_qlora_baseline.py: autocast to the compute dtype, loss scaling in f16,
clipping at 1.0, torch.optim.Adafactor at lr 2e-4) on random token ids as inputs and labels, 2
warm-up steps then `steps` timed ones per shape. One JSON line per shape (tokens/s, peak allocated
and reserved GiB, loss); a shape that runs out of GPU memory is recorded as {"error": "OOM"} and
the next one runs. `out` (the anchor's format, read by compare_train.py) is rewritten after every
shape, so a run stopped by a time limit keeps the shapes it finished.
"""
import contextlib
import gc
import json
import os
import sys
import time
import traceback

import torch

# SEQxBATCH: raise an out-of-memory error after that shape's first backward (gradients and
# checkpoints alive), to check on a CPU that the next shape still runs
INJECT_OOM = os.environ.get("PEFT_REF_INJECT_OOM", "")


class Step:
    """One optimizer step of `model` on ids as inputs and labels; `reset` after a failed one."""

    def __init__(self, model, compute, device):
        self.model, self.device = model, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.Adafactor(self.params, lr=2e-4)
        self.scaling = device == "cuda" and compute == torch.float16
        self.scaler = self.new_scaler()
        self.autocast = ((lambda: torch.autocast(device, dtype=compute))
                         if compute != torch.float32 else contextlib.nullcontext)

    def new_scaler(self):
        return torch.amp.GradScaler("cuda", enabled=self.scaling)

    def __call__(self, ids):
        with self.autocast():
            loss = self.model(input_ids=ids, labels=ids).loss
        self.scaler.scale(loss).backward()
        if INJECT_OOM == f"{ids.shape[1]}x{ids.shape[0]}":
            raise torch.OutOfMemoryError("injected: out of memory (PEFT_REF_INJECT_OOM)")
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def reset(self):
        """The traceback's frames are gone: free what the failed step left and start a new scaler
        (its per-optimizer state may be mid-step)."""
        self.opt.zero_grad(set_to_none=True)
        self.scaler = self.new_scaler()


def out_of_memory(e: Exception) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e) or "ALLOC_FAILED" in str(e)


def gib(v):
    return round(v / 2**30, 2)


def run(model, compute, device, shapes, steps, out, info, started=None):
    """Times `model` at each SEQxBATCH of `shapes` (comma-separated); `info` heads `out`. With
    `started` (time.time() at the process's start), `info` gets `first_step_s`: from then to the
    end of the first shape's first step."""
    cuda = device == "cuda"
    step = Step(model, compute, device)
    info = dict(info, steps=steps, gpu=torch.cuda.get_device_name(0) if cuda else "cpu",
                n_lora=sum(p.numel() for p in step.params))
    vocab = model.config.vocab_size
    results = []
    for shape in shapes.split(","):
        seq, bs = (int(x) for x in shape.split("x"))
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        failure = None
        try:
            ids = torch.randint(0, vocab, (bs, seq), device=device)
            for warm_up in range(2):
                step(ids)
                if started is not None and "first_step_s" not in info and warm_up == 0:
                    if cuda:
                        torch.cuda.synchronize()
                    info["first_step_s"] = round(time.time() - started, 2)
            if cuda:
                torch.cuda.synchronize()
            t = time.time()
            for _ in range(steps):
                loss = step(ids)
            if cuda:
                torch.cuda.synchronize()
            dt = (time.time() - t) / steps
            r = dict(seq=seq, bs=bs, step_s=round(dt, 4), tok_s=round(bs * seq / dt, 1), loss=float(loss))
            if cuda:
                r.update(peak_alloc_gib=gib(torch.cuda.max_memory_allocated()),
                         peak_reserved_gib=gib(torch.cuda.max_memory_reserved()))
        except (torch.OutOfMemoryError, RuntimeError) as e:
            failure = "OOM" if out_of_memory(e) else f"{type(e).__name__}: {str(e)[:200]}"
            if failure != "OOM":
                # the message alone can be empty (Inductor's AssertionError): the log keeps the traceback
                traceback.print_exc(file=sys.stderr)
        if failure:
            r = dict(seq=seq, bs=bs, error=failure)
            if cuda:
                r["peak_alloc_gib_at_error"] = gib(torch.cuda.max_memory_allocated())
            ids = loss = None
            step.reset()
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        print(json.dumps(r), flush=True)
        results.append(r)
        json.dump(dict(info, results=results), open(out, "w"), indent=1)
    return results
