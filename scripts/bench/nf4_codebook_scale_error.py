# Would an NF4 GEMV that multiplies each absmax block's sum by its absmax after the products (the
# fixed codebook rounded to the dtype as its table, no per-block tables) hold the tolerance rule?
# Its error against the exact product beside the dequantize + GEMM stack's, on random weights.
#   python3 scripts/bench/nf4_codebook_scale_error.py    (numpy)
import numpy as np
CODE = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)

def bf16(a):
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)

def rnd(a, dt):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32) if dt == "f16" else bf16(a)

rng = np.random.default_rng(0)
for (out, inp) in [(1024, 4096), (512, 14336)]:
    w = (rng.standard_normal((out, inp)) * 0.05).astype(np.float32)
    blocks = w.reshape(out, inp // 64, 64)
    amax = np.abs(blocks).max(-1).astype(np.float32)
    idx = np.abs(blocks[..., None] / amax[..., None, None] - CODE).argmin(-1)
    wq = (CODE[idx] * amax[..., None]).astype(np.float32)            # exact f32 weights
    for dt in ["f16", "bf16"]:
        x = rnd(rng.standard_normal((8, inp)).astype(np.float32), dt)
        exact = x.astype(np.float64) @ wq.reshape(out, inp).astype(np.float64).T
        w16 = rnd(wq, dt).reshape(out, inp)
        stack = rnd((x @ w16.T).astype(np.float32), dt)               # f32 sums, one rounding
        code16 = rnd(CODE, dt)[idx]                                   # [out, blocks, 64]
        part = np.einsum("obk,nbk->nob", code16, x.reshape(8, inp // 64, 64)).astype(np.float32)
        prop = rnd((part * amax[None]).sum(-1).astype(np.float32), dt)
        e_stack = np.abs(stack - exact).max(); e_prop = np.abs(prop - exact).max()
        bound = 2 * e_stack + np.abs(exact).max() * 2.0**-23
        print(f"[{out}, {inp}] {dt}: stack {e_stack:.3e}  codebook-then-scale {e_prop:.3e}  "
              f"ratio {e_prop / e_stack:.2f}  within 2x+eps: {e_prop <= bound}")
