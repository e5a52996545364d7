#!/usr/bin/env python3
"""Check a run's TensorBoard event files (`train.report_to = ["tensorboard"]`) with TensorBoard's
own reader against the run's metrics.jsonl and config.json.

    python3 scripts/tensorboard_check.py RUN_DIR     # RUN_DIR = the config's output.dir

Reads RUN_DIR/tb/ with tensorboard.backend.event_processing.event_accumulator.EventAccumulator,
as `tensorboard --logdir RUN_DIR/tb` does (every file of the folder, in name order, a resumed
run's restart marker dropping what the earlier run logged after its checkpoint), and asserts:

- every scalar tag holds the steps of metrics.jsonl and its values as float32, exactly (for a
  step logged twice, by a run and the run resumed from its checkpoint, the later record, as
  `lora-ft plot` reads it); the train/ and gpu/ tags hold each step once;
- the text `config` is the text plugin's, renders through it, and is the TOML of config.json.

Exits 1 with what differs. Needs `pip install tensorboard`.
"""

import json
import struct
import sys
import tomllib
from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.text import text_plugin
from tensorboard.util import tensor_util

# tag -> the metrics.jsonl key it holds
STEP_TAGS = {
    "train/loss": "loss",
    "train/learning_rate": "lr",
    "train/grad_norm": "grad_norm",
    "train/loss_scale": "loss_scale",
    "train/epoch": "epoch",
    "train/tokens_per_s": "tokens_per_s",
    "gpu/memory_allocated_gib": "gpu_allocated_gib",
    "gpu/memory_peak_gib": "gpu_peak_gib",
}
EVAL_TAGS = {"eval/loss": "eval_loss", "eval/perplexity": "eval_ppl"}


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def logged(run_dir):
    """tag -> {step: value} from metrics.jsonl, the later record of a step winning."""
    want = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line torn by a kill, as `lora-ft plot` skips it
        tags = EVAL_TAGS if "eval_loss" in record else STEP_TAGS
        for tag, key in tags.items():
            if key in record:
                want.setdefault(tag, {})[record["step"]] = f32(record[key])
    return want


def without_nulls(value):
    """config.json as its TOML has it: TOML has no null, so those keys are left out."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def check(run_dir):
    errors = []
    tb = run_dir / "tb"
    files = sorted(p.name for p in tb.iterdir() if "tfevents" in p.name)
    if not files:
        return [f"{tb}: no event files"]
    acc = event_accumulator.EventAccumulator(
        str(tb), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    want = logged(run_dir)
    tags = set(acc.Tags()["scalars"])
    if tags != set(want):
        errors.append(f"scalar tags {sorted(tags)}, metrics.jsonl has {sorted(want)}")
    for tag in sorted(tags & set(want)):
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        if not tag.startswith("eval/") and steps != sorted(set(steps)):
            errors.append(f"{tag}: steps {steps} (each logged step once, in order)")
        got = {e.step: e.value for e in events}
        if got != want[tag]:
            diff = {s: (got.get(s), want[tag].get(s)) for s in sorted(set(got) | set(want[tag]))
                    if got.get(s) != want[tag].get(s)}
            errors.append(f"{tag}: step: (TensorBoard, metrics.jsonl) differ at {diff}")

    if acc.Tags()["tensors"] != ["config"]:
        errors.append(f"tensor tags {acc.Tags()['tensors']}, want ['config']")
        return errors
    if "config" not in acc.PluginTagToContent("text"):
        errors.append("the tensor 'config' is not the text plugin's")
    configs = acc.Tensors("config")
    if len(configs) != len(files):
        errors.append(f"{len(configs)} config texts in {len(files)} event files")
    text = tensor_util.make_ndarray(configs[-1].tensor_proto).item().decode()
    html = text_plugin.text_array_to_html(tensor_util.make_ndarray(configs[-1].tensor_proto), True)
    if "<pre><code" not in html or "[train]" not in html:
        errors.append(f"the config does not render as a code block: {html[:200]!r}")
    fence, end = "```toml\n", "```\n"
    if not (text.startswith(fence) and text.endswith(end)):
        errors.append(f"the config text is not a TOML code block: {text[:80]!r}")
        return errors
    toml = tomllib.loads(text[len(fence):-len(end)])
    ran = without_nulls(json.loads((run_dir / "config.json").read_text()))
    if toml != ran:
        errors.append(f"the config text is not config.json:\n  text: {toml}\n  json: {ran}")
    print(
        f"{run_dir}: {len(files)} event file(s); "
        + ", ".join(f"{t} {len(want[t])} steps" for t in sorted(tags & set(want)))
        + f"; config text of {len(text)} chars"
    )
    return errors


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    errors = check(Path(sys.argv[1]))
    for e in errors:
        print(f"tensorboard_check: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
