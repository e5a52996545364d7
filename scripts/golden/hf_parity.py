#!/usr/bin/env python3
"""Reference numbers for lora-ft's model parity tests, from transformers + PEFT (CPU).

For each case this writes tests/golden/parity_<case>.safetensors with the logits, the loss and the
LoRA gradients of one forward/backward on a fixed batch with fixed LoRA weights, computed in
float64 (every op: transformers' RMSNorm and RoPE tables, which it keeps in float32 even for a
float64 model, are patched to stay in float64), and beside each tensor `torch_f32_err.<name>`:
the relative error of transformers' own float32 run against that float64 result. The Rust tests
hold lora-ft's float32 error to a multiple of torch's (the rule in tests/parity.rs). Every case
is described in tests/golden/parity_cases.json. The two tiny random models (Llama, and Mistral with a
sliding window shorter than the sequence) and their PEFT adapters are written to tests/fixtures/.
SmolLM2-135M comes from the project's GGUF; its LoRA weights follow a formula the Rust test
recomputes, so no 12 MB adapter is committed.

Run from anywhere:  /work/venv/bin/python scripts/golden/hf_parity.py [--case tiny-llama ...]
"""

import argparse
import contextlib
import math
import json
import os
import shutil
from pathlib import Path

import numpy as np
import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
FIXTURES = REPO / "tests" / "fixtures"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMOLLM2_GGUF = Path.home() / ".cache/lora-ft/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GRAD_LAYERS = [0, 15, 29]

# Tolerances (logits and loss, LoRA gradients) of the sanity checks below against the eager f32
# reference: another attention kernel moves only f32 rounding noise; so does float64, but that
# noise grows in the backward through 30 layers (SmolLM2's f32 gradients are up to 2e-4 from the
# float64 ones), so the float64 check is looser. The Rust tests do not use these: they hold
# lora-ft to a multiple of the float32 errors this script stores.
SDPA_TOL = (1e-5, 1e-4)
F64_TOL = (1e-5, 1e-3)
ROUNDTRIP_TOL = (0.0, 0.0)

TINY_SIZES = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=128,
)

SMOLLM2_FORMULA = {
    "A": "lora_A [r, in]: A[i, j] = 0.02 * sin(0.37*i + 0.11*j + 1.3*l + m + 1)",
    "B": "lora_B [out, r]: B[i, j] = 0.02 * cos(0.23*i + 0.17*j + 0.7*l + m + 2)",
    "indices": "i = row, j = column (0-based); l = layer index 0..29; "
    "m = module index in (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) = 0..6",
    "precision": "evaluated in float64, then cast to float32 (round to nearest)",
}


@contextlib.contextmanager
def exact_float64():
    """transformers computes RMSNorm, the RoPE tables and the eager attention's softmax in float32
    whatever the model's dtype (and its loss casts the logits to float32: `reference_run` computes
    the float64 loss itself); inside this block a float64 model computes all of them in float64,
    so its result is the exact answer to float64 precision. The float32 path is untouched."""
    from transformers.models.gemma2 import modeling_gemma2
    from transformers.models.gemma3 import modeling_gemma3
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    def norm_forward(orig):
        def forward(self, hidden_states):
            if hidden_states.dtype != torch.float64:
                return orig(self, hidden_states)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))
        return forward

    def gemma_norm_forward(orig):
        # Gemma's (1 + w) norm, which casts to float32 inside
        def forward(self, x):
            if x.dtype != torch.float64:
                return orig(self, x)
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)
        return forward

    def rope_forward(orig):
        # Gemma 3's takes the layer kind, whose own parameters it uses
        def forward(self, x, position_ids, layer_type=None):
            if x.dtype != torch.float64:
                return orig(self, x, position_ids) if layer_type is None else orig(self, x, position_ids, layer_type)
            inv_freq, scaling = inv_freq_f64(self.config, layer_type)
            prefix = "" if layer_type is None else f"{layer_type}_"
            theirs = getattr(self, f"{prefix}inv_freq")
            assert rel_err(theirs, inv_freq) < 1e-6, "the float64 RoPE frequencies are not transformers'"
            assert abs(scaling - getattr(self, f"{prefix}attention_scaling")) < 1e-6 * scaling
            freqs = position_ids[:, :, None].double() * inv_freq[None, None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos() * scaling, emb.sin() * scaling
        return forward

    softmax = torch.nn.functional.softmax

    def softmax64(input, dim=None, _stacklevel=3, dtype=None):
        return softmax(input, dim=dim, dtype=None if input.dtype == torch.float64 else dtype)

    patched = [(torch.nn.functional, "softmax", softmax)]
    torch.nn.functional.softmax = softmax64
    for mod, prefix in ((modeling_llama, "Llama"), (modeling_mistral, "Mistral"), (modeling_qwen2, "Qwen2"),
                        (modeling_qwen3, "Qwen3"), (modeling_gemma2, "Gemma2"), (modeling_gemma3, "Gemma3")):
        norm = gemma_norm_forward if prefix.startswith("Gemma") else norm_forward
        for name, wrap in ((f"{prefix}RMSNorm", norm), (f"{prefix}RotaryEmbedding", rope_forward)):
            cls = getattr(mod, name)
            patched.append((cls, "forward", cls.forward))
            cls.forward = wrap(cls.forward)
    try:
        yield
    finally:
        for owner, attr, original in patched:
            setattr(owner, attr, original)


def inv_freq_f64(cfg, layer_type=None):
    """RoPE's inverse frequencies and attention scaling as transformers' modeling_rope_utils
    computes them (default, linear, dynamic within max_position_embeddings, yarn, llama3), in
    float64; Gemma 3's of one layer kind. `exact_float64` checks them against transformers' own
    float32 buffer."""
    p = cfg.rope_parameters if layer_type is None else cfg.rope_parameters[layer_type]
    kind, base = p.get("rope_type", "default"), p["rope_theta"]
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_freq, scaling = 1.0 / pos_freqs, 1.0
    if kind == "linear":
        inv_freq = inv_freq / p["factor"]
    elif kind == "llama3":
        factor, low, high, old = p["factor"], p["low_freq_factor"], p["high_freq_factor"], p["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif kind == "yarn":
        factor, old = p["factor"], p["original_max_position_embeddings"]
        scaling = p.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

        def correction_dim(rotations):
            return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        high = high + 0.001 if low == high else high
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extrapolation = 1 - ramp
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    elif kind not in ("default", "dynamic"):
        raise ValueError(f"rope_type {kind}")
    return inv_freq, scaling


def f32_errors(ref64, ref32, names=None, tag="f32"):
    """torch's own error per stored tensor: rel_err(f32 (or f16/bf16) run, float64 run)."""
    out = {}
    for k, v in ref64.items():
        if names is None or k in names:
            out[f"torch_{tag}_err." + k] = torch.tensor([rel_err(ref32[k].double(), v)], dtype=torch.float64)
    return out


def half_errors(out_dir: Path, input_ids, labels, stored):
    """torch's own f16 and bf16 errors: the same eager model and adapter cast whole to the half
    dtype (transformers still takes the norms, softmax and loss in float32), on the CPU."""
    out = {}
    for dtype, tag in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        half = reference_run(load_fixture(out_dir, "eager").to(dtype), input_ids, labels)
        errs = f32_errors(stored, flat(half), tag=tag)
        print(f"  torch {tag}: worst rel err {max(float(e) for e in errs.values()):.2e}")
        out.update(errs)
    return out


def flat(ref):
    """A reference_run result as one name -> tensor dict (the names of the golden file)."""
    return {"logits": ref["logits"], "loss": ref["loss"], "grad.inputs_embeds": ref["grad.inputs_embeds"],
            **ref["grads"]}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|: the metric every check here (and the Rust tests) uses."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def peft_key(param_name: str) -> str:
    """PEFT's in-memory name -> the key in adapter_model.safetensors (drops the adapter name)."""
    return param_name.replace(".default.", ".")


def module_index(name: str) -> int:
    return next(i for i, t in enumerate(TARGETS) if f".{t}." in name)


def layer_index(name: str) -> int:
    return int(name.split(".layers.")[1].split(".")[0])


# ---------------------------------------------------------------- tiny random models

def tiny_model(arch: str, seed: int, rope_theta: float, attn: str, rope=None, **overrides):
    """`rope`: the rope_scaling of a Llama 3.1 / YaRN / linear model (rope_type and its keys);
    `overrides`: config keys of the family's variants (Mistral Nemo's head_dim, no window)."""
    rope_parameters = {"rope_theta": rope_theta, "rope_type": "default", **(rope or {})}
    if arch == "llama":
        cfg = LlamaConfig(**TINY_SIZES, rope_parameters=rope_parameters, tie_word_embeddings=False, **overrides)
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        cfg = Qwen2Config(**TINY_SIZES, rope_parameters=rope_parameters, tie_word_embeddings=True, **overrides)
        cls = Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg = Qwen3Config(**TINY_SIZES, rope_parameters=rope_parameters, tie_word_embeddings=False, **overrides)
        cls = Qwen3ForCausalLM
    elif arch == "gemma2":
        cfg = Gemma2Config(**TINY_SIZES, rope_parameters=rope_parameters, **overrides)
        cls = Gemma2ForCausalLM
    elif arch == "gemma3":
        # `rope` holds each layer kind's parameters
        cfg = Gemma3TextConfig(**TINY_SIZES, rope_parameters=rope, **overrides)
        cls = Gemma3ForCausalLM
    else:
        keys = dict(head_dim=TINY_SIZES["hidden_size"] // TINY_SIZES["num_attention_heads"], sliding_window=5)
        keys.update(overrides)
        cfg = MistralConfig(**TINY_SIZES, rope_parameters=rope_parameters, tie_word_embeddings=True, **keys)
        cls = MistralForCausalLM
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    model = cls(cfg).float()
    with torch.no_grad():
        # Explicit init so the numbers do not depend on transformers' init code; norm weights
        # away from 1 so that a missing or misplaced norm weight shows in the logits (Gemma's
        # norms scale by 1 + w: w itself near 0).
        gemma = arch.startswith("gemma")
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.02 * torch.randn_like(p))
    return model.eval()


def tiny_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, TINY_SIZES["vocab_size"], (2, 12), generator=g, dtype=torch.int64)
    input_ids[1, -3:] = 0  # right padding with pad id 0
    labels = input_ids.clone()
    labels[0, :4] = -100
    labels[1, -3:] = -100
    return input_ids, labels


def add_lora(model, r: int, alpha: int):
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=TARGETS,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def set_lora_random(pm, seed: int, std: float = 0.1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(pm.named_parameters()):
            if "lora_" in name:
                p.copy_(std * torch.randn(p.shape, generator=g))


def set_lora_formula(pm):
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" not in name:
                continue
            p.copy_(formula_weight(name, tuple(p.shape)))


def formula_weight(name: str, shape) -> torch.Tensor:
    l, m = layer_index(name), module_index(name)
    i = np.arange(shape[0], dtype=np.float64)[:, None]
    j = np.arange(shape[1], dtype=np.float64)[None, :]
    if ".lora_A." in name:
        w = 0.02 * np.sin(0.37 * i + 0.11 * j + 1.3 * l + m + 1)
    else:
        w = 0.02 * np.cos(0.23 * i + 0.17 * j + 0.7 * l + m + 2)
    return torch.from_numpy(w.astype(np.float32))


def save_tiny_base(model, out_dir: Path):
    """config.json + model.safetensors (f32) of the plain model, before LoRA is injected."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    # transformers 5 writes rope_theta only inside rope_parameters; published checkpoints (and
    # most readers) use the top-level key, so write both. transformers reads either.
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    # (Gemma 3's rope_parameters hold one set per layer kind, as transformers 5 writes them: kept)
    flat_rope = "rope_theta" in cfg["rope_parameters"]
    if flat_rope:
        cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    if flat_rope and cfg["rope_parameters"].get("rope_type", "default") != "default":
        # Llama 3.1's and Qwen's published config.json carry the scaling as `rope_scaling`
        cfg["rope_scaling"] = {k: v for k, v in cfg["rope_parameters"].items() if k != "rope_theta"}
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def save_adapter(pm, out_dir: Path):
    """adapter/adapter_model.safetensors + adapter/adapter_config.json, as PEFT writes them."""
    pm.peft_config["default"].base_model_name_or_path = str(out_dir.relative_to(REPO))
    pm.save_pretrained(out_dir / "adapter")
    readme = out_dir / "adapter" / "README.md"
    if readme.exists():
        readme.unlink()
    # PEFT stores target_modules from a set; sort it so reruns write the same file.
    cfg_path = out_dir / "adapter" / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["target_modules"] = sorted(cfg["target_modules"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------- reference run

def reference_run(pm, input_ids, labels, keep_grad=lambda key: True):
    """Forward with labels + backward through inputs_embeds; returns the tensors of the golden file.
    grad.inputs_embeds is the gradient of the rows looked up in the embedding table: Gemma's
    embedding module scales them by sqrt(hidden) itself, so its scale is applied here."""
    pm.zero_grad(set_to_none=True)
    embed = pm.get_base_model().get_input_embeddings()
    rows = torch.nn.functional.embedding(input_ids, embed.weight).detach().requires_grad_()
    scale = getattr(embed, "embed_scale", None)
    inputs_embeds = rows * scale.to(rows.dtype) if scale is not None else rows
    assert rel_err(embed(input_ids), inputs_embeds) == 0.0
    if inputs_embeds.dtype == torch.float64:
        # transformers' loss casts the logits to float32 (`logits.float()`): the same mean
        # next-token cross-entropy in float64 instead
        out = pm(inputs_embeds=inputs_embeds, use_cache=False)
        out.loss = torch.nn.functional.cross_entropy(
            out.logits[:, :-1].reshape(-1, out.logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
    else:
        out = pm(inputs_embeds=inputs_embeds, labels=labels, use_cache=False)
    out.loss.backward()

    logits = out.logits.detach()
    check_loss_definition(logits, labels, out.loss.detach())
    with torch.no_grad():
        by_ids = pm(input_ids=input_ids, use_cache=False).logits
    assert rel_err(by_ids, logits) == 0.0, "input_ids and inputs_embeds paths differ"

    grads = {}
    for name, p in pm.named_parameters():
        if "lora_" in name:
            key = peft_key(name)
            assert p.grad is not None and p.grad.abs().max() > 0, f"no gradient for {key}"
            if keep_grad(key):
                grads["grad." + key] = p.grad.detach().clone()
        else:
            assert not p.requires_grad, f"base weight {name} is trainable"
    return {
        "logits": logits,
        "loss": out.loss.detach().reshape(1),
        "grad.inputs_embeds": rows.grad.detach().clone(),
        "grads": grads,
    }


def check_loss_definition(logits, labels, loss):
    """The loss is the mean next-token cross-entropy over positions whose shifted label != -100."""
    shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1]).double()
    shift_labels = labels[:, 1:].reshape(-1)
    mine = torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
    assert abs(mine.item() - loss.item()) <= 1e-5 * abs(mine.item()), (mine, loss)


def check_lora_matters(pm, input_ids, logits):
    with torch.no_grad(), pm.disable_adapter():
        plain = pm(input_ids=input_ids, use_cache=False).logits
    diff = (plain - logits).abs().max().item()
    assert diff > 1e-3, f"LoRA path barely changes the logits ({diff})"
    return diff


def compare_runs(ref, other, tols, what):
    """Relative errors of another run against the reference; tols = (logits and loss, grads)."""
    errs = {"logits": rel_err(other["logits"], ref["logits"]), "loss": rel_err(other["loss"], ref["loss"])}
    worst_key = max(ref["grads"], key=lambda k: rel_err(other["grads"][k], ref["grads"][k]))
    errs["grads"] = rel_err(other["grads"][worst_key], ref["grads"][worst_key])
    print(f"  {what}: rel err logits {errs['logits']:.1e}, loss {errs['loss']:.1e}, "
          f"grads {errs['grads']:.1e} (worst {worst_key})")
    assert max(errs["logits"], errs["loss"]) <= tols[0] and errs["grads"] <= tols[1], f"{what}: {errs} > {tols}"
    return errs


def check_sliding_window(pm, input_ids, window: int):
    """Eager attention probabilities must be zero exactly outside i - window < j <= i."""
    with torch.no_grad():
        out = pm(input_ids=input_ids, use_cache=False, output_attentions=True)
    n = input_ids.shape[1]
    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    allowed = (k <= q) & (k > q - window)
    for att in out.attentions:
        assert (att[..., ~allowed] == 0).all(), "attention outside the sliding window"
        assert (att[..., allowed] > 0).all(), "masked position inside the sliding window"


def check_gemma_features(out_dir: Path, input_ids, logits):
    """Each Gemma difference the case switches on must move the logits: the soft caps, the
    windows of the local layers, and (Gemma 3) the local layers' own RoPE base."""
    cfg = json.loads((out_dir / "config.json").read_text())
    variants = {"sliding_window": dict(layer_types=["full_attention"] * cfg["num_hidden_layers"])}
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key) is not None:
            variants[key] = {key: None}
    if "sliding_attention" in cfg.get("rope_parameters", {}):
        same = {k: dict(cfg["rope_parameters"]["full_attention"]) for k in ("full_attention", "sliding_attention")}
        variants["local_rope"] = dict(rope_parameters=same)
    out = {}
    for name, overrides in variants.items():
        with torch.no_grad():
            other = load_fixture(out_dir, "eager", **overrides)(input_ids=input_ids, use_cache=False).logits
        diff = (other - logits).abs().max().item()
        print(f"  without {name}: logits move by {diff:.2e}")
        assert diff > 1e-4, f"{name} does not change the logits ({diff})"
        out[f"without_{name}_logits_move_by_max_abs"] = diff
    return out


# ---------------------------------------------------------------- cases

def run_tiny(case: str, arch: str, seed: int, rope_theta: float, rope=None, **overrides):
    print(f"[{case}]")
    input_ids, labels = tiny_batch(seed + 100)
    model = tiny_model(arch, seed, rope_theta, "eager", rope, **overrides)
    out_dir = FIXTURES / case
    save_tiny_base(model, out_dir)
    pm = add_lora(model, r=4, alpha=8)
    set_lora_random(pm, seed + 200)
    ref = reference_run(pm, input_ids, labels)
    lora_diff = check_lora_matters(pm, input_ids, ref["logits"])

    save_adapter(pm, out_dir)
    checks = {"lora_changes_logits_by_max_abs": lora_diff}
    # Reload what was written: eager must reproduce the golden numbers exactly; sdpa and float64
    # (transformers still computes norms and rope tables in f32) only move f32 rounding noise.
    # transformers' sdpa path drops Gemma 2's soft cap of the scores: eager only there
    capped = getattr(model.config, "attn_logit_softcapping", None) is not None
    for attn, tol in (("eager", ROUNDTRIP_TOL),) + ((("sdpa", SDPA_TOL),) if not capped else ()):
        reloaded = load_fixture(out_dir, attn)
        checks[f"reload_{attn}_rel_err"] = compare_runs(
            ref, reference_run(reloaded, input_ids, labels), tol, f"reload {attn}"
        )
    with exact_float64():
        ref64 = reference_run(load_fixture(out_dir, "eager").double(), input_ids, labels)
    checks["float32_rel_err_to_float64"] = compare_runs(ref64, ref, F64_TOL, "float32 vs float64")
    if arch.startswith("gemma"):
        checks.update(check_gemma_features(out_dir, input_ids, ref["logits"]))
    window = getattr(pm.get_base_model().config, "sliding_window", None)
    if arch == "mistral" and window is not None:
        check_sliding_window(pm, input_ids, window)
        full = load_fixture(out_dir, "eager", sliding_window=None)
        with torch.no_grad():
            no_window = full(input_ids=input_ids, use_cache=False).logits
        diff = (no_window - ref["logits"]).abs().max().item()
        assert diff > 1e-4, f"sliding_window=None gives the same logits ({diff})"
        # Positions that see at most `window` tokens are untouched by the window.
        assert rel_err(no_window[:, :window], ref["logits"][:, :window]) < 1e-6
        checks["no_window_changes_logits_by_max_abs"] = diff
        print(f"  sliding window: logits differ from sliding_window=None by {diff:.2e}")

    stored = flat(ref64)
    tensors = {"input_ids": input_ids, "labels": labels, **stored, **f32_errors(stored, flat(ref)),
               **half_errors(out_dir, input_ids, labels, stored)}
    golden = GOLDEN / f"parity_{case}.safetensors"
    save_file(contiguous(tensors), golden, metadata={"generator": f"scripts/golden/hf_parity.py --case {case}"})
    cfg = pm.get_base_model().config
    return {
        "model_dir": str(out_dir.relative_to(REPO)),
        "adapter_dir": str((out_dir / "adapter").relative_to(REPO)),
        "golden": str(golden.relative_to(REPO)),
        "arch": arch,
        "config": tiny_config_summary(cfg),
        "base_init": f"torch.manual_seed({seed}); norm weights 1 + 0.1*randn, all other weights 0.02*randn "
        "(stored in model.safetensors, f32)",
        "lora": {"r": 4, "lora_alpha": 8, "scaling": 2.0, "lora_dropout": 0.0, "target_modules": TARGETS,
                 "init": f"0.1*randn from torch.Generator seed {seed + 200} (stored in adapter/adapter_model.safetensors)"},
        "batch": "input_ids [2,12] random ids in 1..255; row 1 right-padded with 3 pad tokens (id 0); "
        "labels = input_ids with -100 on row 0 positions 0..3 and on row 1's pads; no attention_mask "
        "(all ones: pure causal, pads attend like any token)",
        "checks": checks,
        "stored_precision": "the float64 run (norms and RoPE in float64 too); torch_f32_err.<name>: "
        "rel_err of the float32 eager run against it; torch_f16_err / torch_bf16_err: of the same run with "
        "the model and adapter cast to float16 / bfloat16",
        "tensors": describe(tensors),
    }


def tiny_config_summary(cfg):
    keys = list(TINY_SIZES) + ["tie_word_embeddings", "head_dim"]
    out = {k: getattr(cfg, k, None) for k in keys}
    for key in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "layer_types",
                "hidden_activation"):
        if getattr(cfg, key, None) is not None:
            out[key] = getattr(cfg, key)
    flat_rope = "rope_theta" in cfg.rope_parameters
    if flat_rope:
        out["rope_theta"] = cfg.rope_parameters["rope_theta"]
    else:  # Gemma 3: one set per layer kind
        out["rope_parameters"] = cfg.rope_parameters
        for kind in cfg.rope_parameters:
            out[f"rope_inv_freq_float64.{kind}"] = inv_freq_f64(cfg, kind)[0].tolist()
    if flat_rope and cfg.rope_parameters.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in cfg.rope_parameters.items() if k != "rope_theta"}
        inv_freq, scaling = inv_freq_f64(cfg)
        out["rope_inv_freq_float64"] = inv_freq.tolist()
        out["rope_attention_scaling"] = scaling
    if getattr(cfg, "sliding_window", None) is not None:
        out["sliding_window"] = cfg.sliding_window
        out["sliding_window_rule"] = "query i attends key j iff i - sliding_window < j <= i"
    return out


def load_fixture(out_dir: Path, attn: str, **overrides):
    base = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation=attn, **overrides)
    pm = PeftModel.from_pretrained(base, out_dir / "adapter", is_trainable=True)
    return pm.eval()


def smollm2_batch(tok):
    chats = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
         {"role": "assistant", "content": "Hello! How can I help?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}],
    ]
    texts = [tok.apply_chat_template(c, tokenize=False) for c in chats]
    rows = [tok(t, add_special_tokens=False).input_ids for t in texts]
    seq = max(len(r) for r in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    input_ids = torch.full((2, seq), pad, dtype=torch.int64)
    labels = torch.full((2, seq), -100, dtype=torch.int64)
    n_prompt_masked = 4
    for b, r in enumerate(rows):
        input_ids[b, : len(r)] = torch.tensor(r)
        labels[b, n_prompt_masked: len(r)] = torch.tensor(r[n_prompt_masked:])
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    return texts, input_ids, labels, lengths, pad, n_prompt_masked


def run_smollm2():
    print("[smollm2]")
    gdir, gname = str(SMOLLM2_GGUF.parent), SMOLLM2_GGUF.name
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    model = AutoModelForCausalLM.from_pretrained(
        gdir, gguf_file=gname, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    texts, input_ids, labels, lengths, pad, n_masked = smollm2_batch(tok)
    checksums = weight_checksums(model)
    pm = add_lora(model, r=8, alpha=16)
    set_lora_formula(pm)
    keep = lambda key: layer_index(key) in SMOLLM2_GRAD_LAYERS  # noqa: E731
    ref = reference_run(pm, input_ids, labels, keep_grad=keep)
    lora_diff = check_lora_matters(pm, input_ids, ref["logits"])
    pm.get_base_model().set_attn_implementation("sdpa")
    sdpa_err = compare_runs(ref, reference_run(pm, input_ids, labels, keep_grad=keep), SDPA_TOL, "sdpa")
    pm.get_base_model().set_attn_implementation("eager")
    # SmolLM2's 30 layers accumulate f32 rounding (~2.5e-5 in the deepest gradients), so the stored
    # numbers come from the float64 run of the same weights, and torch's own f32 error against it
    # is stored beside each tensor: the Rust test holds its f32 error to a multiple of that.
    with exact_float64():
        ref64 = reference_run(pm.double(), input_ids, labels, keep_grad=keep)
    f64_err = compare_runs(ref64, ref, F64_TOL, "float32 vs float64")

    last = lengths - 1

    def stored(r):
        return {"loss": r["loss"].double(), "logits_head": r["logits"][:, :, :1024].double(),
                "logits_last": r["logits"][torch.arange(2), last].double(),
                **{k: v.double() for k, v in r["grads"].items()}}

    s64 = stored(ref64)
    tensors = {
        "input_ids": input_ids,
        "labels": labels,
        "last_positions": last,
        **s64,
        **f32_errors(s64, stored(ref)),
    }
    golden = GOLDEN / "parity_smollm2.safetensors"
    save_file(contiguous(tensors), golden, metadata={"generator": "scripts/golden/hf_parity.py --case smollm2"})
    cfg = model.config
    return {
        "model_gguf": "~/.cache/lora-ft/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "model_dir": "lora_ft::fixtures::smollm2_dir() (the same weights after `lora-ft import`)",
        "base_weights": "transformers GGUF loader: Q4_1 dequantized to f32 by gguf-py; q_proj/k_proj "
        "un-permuted to the HF (rotate_half) layout; lm_head tied to embed_tokens",
        "base_weight_checksums": checksums,
        "golden": str(golden.relative_to(REPO)),
        "arch": "llama",
        "config": {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                   "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
                   "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
                   "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
                   "rope_theta": cfg.rope_parameters["rope_theta"], "tie_word_embeddings": cfg.tie_word_embeddings},
        "lora": {"r": 8, "lora_alpha": 16, "scaling": 2.0, "lora_dropout": 0.0, "target_modules": TARGETS,
                 "formula": SMOLLM2_FORMULA},
        "batch": {
            "texts": texts,
            "tokenization": "tokenizer(text, add_special_tokens=False) of the chat template's output "
            "(the template itself writes <|im_start|>)",
            "pad_token_id": pad,
            "padding": "right, to the longest row; no attention_mask (pure causal)",
            "labels": f"input_ids with -100 on the first {n_masked} positions of each row and on the pads",
            "lengths": lengths.tolist(),
        },
        "stored": {
            "logits_head": "logits[:, :, :1024]",
            "logits_last": "logits[b, last_positions[b], :] (the full vocab row at each row's last real token)",
            "grad.*": f"LoRA gradients of layers {SMOLLM2_GRAD_LAYERS} only, all 7 modules, A and B",
        },
        "checks": {"lora_changes_logits_by_max_abs": lora_diff, "sdpa_rel_err": sdpa_err,
                   "float32_run_rel_err_to_stored_float64": f64_err},
        "stored_precision": "the float64 run (norms and RoPE in float64 too); torch_f32_err.<name>: "
        "rel_err of the float32 eager run against it; torch_f16_err / torch_bf16_err: of the same run with "
        "the model and adapter cast to float16 / bfloat16",
        "tensors": describe(tensors),
    }


def weight_checksums(model):
    """Sums of a few dequantized base weights, to check an importer against transformers' reading."""
    sd = model.state_dict()
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.down_proj.weight",
             "model.layers.29.input_layernorm.weight", "model.norm.weight"]
    return {n: {"shape": list(sd[n].shape), "sum": sd[n].double().sum().item(),
                "sum_abs": sd[n].double().abs().sum().item(),
                "first8": [float(x) for x in sd[n].reshape(-1)[:8]]} for n in names}


def contiguous(tensors):
    return {k: v.detach().contiguous() for k, v in tensors.items()}


def describe(tensors):
    return {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)} for k, v in sorted(tensors.items())}


# The tiny cases: (architecture, seed, rope_theta, rope_scaling, other config keys). Each switches
# on one feature of the families lora-ft reads: a sliding window shorter than the sequence
# (Mistral), Llama 3.1's RoPE with all three frequency bands in a 16-wide head (wavelengths
# 6.3 / 32.5 / 168+ against an original context of 64: kept, smoothed, divided), YaRN (Qwen's
# long-context RoPE, with its attention scaling), linear scaling, and Mistral Nemo's head_dim
# that is not hidden/heads, with no window; Qwen2's biases on q, k and v; Qwen3's q/k norms.
TINY_CASES = {
    "tiny-llama": ("llama", 1234, 10000.0, None, {}),
    "tiny-mistral": ("mistral", 4321, 500000.0, None, {}),
    "tiny-llama31": ("llama", 3101, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, {}),
    "tiny-yarn": ("llama", 2501, 1000000.0, {"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 32}, {}),
    "tiny-linear": ("llama", 1701, 10000.0, {"rope_type": "linear", "factor": 2.0}, {}),
    "tiny-nemo": ("mistral", 1207, 1000000.0, None, {"head_dim": 32, "sliding_window": None}),
    # Qwen2.5's small models: biased q/k/v, tied embeddings, no window
    "tiny-qwen2": ("qwen2", 2525, 1000000.0, None, {}),
    # Qwen3: per-head norms of q and k before RoPE, an explicit head_dim (32 where hidden/heads is 16)
    "tiny-qwen3": ("qwen3", 3003, 1000000.0, None, {"head_dim": 32}),
    # Gemma 2: (1 + w) norms before and after each sublayer, GeGLU, embeddings times sqrt(64), a
    # query scale 1/sqrt(24) with head_dim 16, local (window 5) and global layers alternating,
    # attention scores and final logits soft-capped tightly enough to bend them, tied embeddings
    "tiny-gemma2": ("gemma2", 2902, 10000.0, None, {"head_dim": 16, "query_pre_attn_scalar": 24,
                                                    "sliding_window": 5, "attn_logit_softcapping": 0.05,
                                                    "final_logit_softcapping": 0.25}),
    # Gemma 3: Gemma 2's layer without the caps, with (1 + w) q/k norms, head_dim 32, one local
    # layer (window 5, RoPE base 10k) and one global (base 1M, linear scaling 8)
    "tiny-gemma3": ("gemma3", 3303, None, {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                               "rope_theta": 1000000.0},
                                           "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                    {"head_dim": 32, "query_pre_attn_scalar": 24, "sliding_window": 5,
                     "layer_types": ["sliding_attention", "full_attention"]}),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=[*TINY_CASES, "smollm2"],
                    help="run only these cases (default: all); parity_cases.json keeps the others")
    args = ap.parse_args()
    cases = args.case or [*TINY_CASES, "smollm2"]
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    GOLDEN.mkdir(parents=True, exist_ok=True)
    index_path = GOLDEN / "parity_cases.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    index["about"] = {
        "generator": "scripts/golden/hf_parity.py",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
        "precision": "CPU, attn_implementation=eager, float64 (norms and RoPE included); torch_f32_err.<name> "
        "is the relative error of transformers' own float32 run against it, per tensor",
        "metric": "relative error = max|x - golden| / max|golden| per tensor; lora-ft's float32 error must be "
        "<= 4 x max(torch_f32_err, floor) (tests/parity.rs)",
        "loss": "mean over positions t with labels[b, t+1] != -100 of cross_entropy(logits[b, t], labels[b, t+1])",
        "lora": "y = W x + scaling * B (A x), scaling = lora_alpha / r; grad.<key> is dLoss/d<key>, key as in "
        "adapter_model.safetensors",
        "grad.inputs_embeds": "dLoss/d(output of the embedding layer), the model was fed inputs_embeds",
    }
    cases_out = index.setdefault("cases", {})
    for case in cases:
        if case in TINY_CASES:
            arch, seed, theta, rope, overrides = TINY_CASES[case]
            cases_out[case] = run_tiny(case, arch, seed=seed, rope_theta=theta, rope=rope, **overrides)
        else:
            cases_out[case] = run_smollm2()
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    print(f"wrote {index_path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
