//! The arithmetic of bitsandbytes' 8-bit blockwise AdamW (`bnb.optim.AdamW8bit`, bitsandbytes
//! 0.50.2), element by element on the CPU, in the order its CUDA kernels compute it: our own
//! implementation of what `kOptimizerStatic8bit2StateBlockwise` (8-bit state) and
//! `kOptimizer32bit2State` (the 32-bit state of parameters below `min_8bit_size`) in
//! csrc/kernels.cu do for the "adam" optimizer with weight decay, `gnorm_scale` 1 and no
//! `max_unorm`. bitsandbytes compiles them with `--use_fast_math`, so:
//!
//! * every f32 operation flushes subnormal inputs and results to zero (`ftz`);
//! * `a * b + c` written in one expression is one fused multiply-add where nvcc contracts it,
//!   and which product it fuses is nvcc's choice, read off the PTX nvcc 13.0 makes of
//!   `adamw8bit.cu` (the same expressions as bitsandbytes' kernels): in the 8-bit kernel the
//!   gradient's product, `s2 = fma(g, (1-β2)·g, s2·β2)` and `s1 = fma(1-β1, g, s1·β1)`; in the
//!   32-bit kernel the state's, `s1 = fma(β1, s1, (1-β1)·g)`, `s2 = fma(β2, s2, (1-β2)·(g·g))`;
//!   `sqrt(s2) + correction2·eps` is not fused (the product is hoisted out of the loop);
//! * `__fdividef(a, b)` (the normalization `s / absmax` before quantizing) is `a * rcp(b)`,
//!   the GPU's approximate reciprocal; here `a * (1 / b)` with a correctly rounded reciprocal.
//!   The two can differ in the last bit of the ratio, which changes a code only when the ratio
//!   lies within an ulp of the midpoint between two codes: the one place this CPU path may
//!   differ from bitsandbytes' codes (the CUDA step uses the GPU's own `__fdividef`);
//! * the parameter update's `__powf`, `sqrtf` and divisions are approximate on the GPU: the
//!   parameters agree to a few ulp of the step, not bit for bit (the state does not depend
//!   on them).
//!
//! Blocks are 256 elements (`BLOCKSIZE_2STATE`); each block's absmax is the largest magnitude of
//! the updated state, taken before quantizing, over all 256 lanes: the lanes past the end of a
//! parameter's last block read code 128 (state1) and 0 (state2) with a zero gradient, as the
//! kernel's padded loads do, and take part in the maximum.

use crate::quant::dynamic::Bracket;

/// Elements per quantization block of the 8-bit state.
pub const BLOCK: usize = 256;
/// bitsandbytes' `min_8bit_size` default: smaller parameters keep 32-bit state.
pub const MIN_8BIT_SIZE: usize = 4096;

/// The step's scalars, in f32 as the kernels receive them (`ct.c_float`).
#[derive(Debug, Clone, Copy)]
pub struct Hyper {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub lr: f32,
    pub weight_decay: f32,
    /// Multiplies every gradient (our loss-scale and clipping factor; bitsandbytes' `gnorm_scale`).
    pub grad_mult: f32,
    /// `sqrt(1 - beta2^t)`.
    pub correction2: f32,
    /// `-lr · correction2 / (1 - beta1^t)`.
    pub step_size: f32,
}

impl Hyper {
    /// The scalars of step `t` (1-based). The corrections are computed in f32 as the kernel
    /// does, with the CPU's `powf` and `sqrt` where the GPU has its approximate ones.
    pub fn new(beta1: f64, beta2: f64, eps: f64, lr: f64, weight_decay: f64, grad_mult: f64, t: u64) -> Self {
        let (beta1, beta2, lr) = (beta1 as f32, beta2 as f32, lr as f32);
        let t = t as f32;
        let correction1 = 1.0 - beta1.powf(t);
        let correction2 = (1.0 - beta2.powf(t)).sqrt();
        Hyper {
            beta1,
            beta2,
            eps: eps as f32,
            lr,
            weight_decay: weight_decay as f32,
            grad_mult: grad_mult as f32,
            correction2,
            step_size: -lr * correction2 / correction1,
        }
    }
}

/// Flush to zero: a subnormal f32 becomes a zero of its sign, as the GPU's `.ftz` operations
/// read and write them.
#[inline]
pub fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

#[inline]
fn mul(a: f32, b: f32) -> f32 {
    ftz(ftz(a) * ftz(b))
}

#[inline]
fn add(a: f32, b: f32) -> f32 {
    ftz(ftz(a) + ftz(b))
}

#[inline]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    ftz(ftz(a).mul_add(ftz(b), ftz(c)))
}

/// The code of `x` in `code` (sorted ascending): the kernel's `quantize_2D`, a binary search of
/// seven halvings from the middle (127) followed by the nearer of the two neighbours, a tie
/// going to the code toward the middle of the search. `signed` sets the lower bound the search
/// starts from (-1 or 0).
pub fn quantize(code: &[f32; 256], signed: bool, x: f32) -> u8 {
    Bracket::search(code, if signed { -1.0 } else { 0.0 }, x).nearer(x)
}

/// One quantization block of an 8-bit parameter, in place: `p`, `g`, `state1`, `state2` are the
/// block's elements (up to 256), `absmax1`/`absmax2` its scales. `qmap1` is the signed map,
/// `qmap2` the unsigned one.
#[allow(clippy::too_many_arguments)]
pub fn update_block(
    p: &mut [f32],
    g: &[f32],
    state1: &mut [u8],
    state2: &mut [u8],
    absmax1: &mut f32,
    absmax2: &mut f32,
    (qmap1, qmap2): (&[f32; 256], &[f32; 256]),
    h: &Hyper,
) {
    let n = p.len();
    debug_assert!(n <= BLOCK && g.len() == n && state1.len() == n && state2.len() == n);
    let (one_minus_beta1, one_minus_beta2) = (1.0 - h.beta1, 1.0 - h.beta2);
    let mut s1 = [0f32; BLOCK];
    let mut s2 = [0f32; BLOCK];
    let (mut max1, mut max2) = (f32::MIN, f32::MIN);
    for j in 0..BLOCK {
        // past the end: the kernel's padded loads (gradient 0, state1 code 128, state2 code 0)
        let (gj, c1, c2) = if j < n { (g[j], state1[j], state2[j]) } else { (0.0, 128, 0) };
        if gj.is_finite() {
            let gv = mul(gj, h.grad_mult);
            let v = mul(qmap2[c2 as usize], *absmax2);
            s2[j] = fma(gv, mul(one_minus_beta2, gv), mul(v, h.beta2));
            let m = mul(qmap1[c1 as usize], *absmax1);
            s1[j] = fma(one_minus_beta1, gv, mul(m, h.beta1));
        }
        max1 = max1.max(s1[j].abs());
        max2 = max2.max(s2[j].abs());
    }
    *absmax1 = max1;
    *absmax2 = max2;
    let decay = 1.0 - h.lr * h.weight_decay;
    let (inv1, inv2) = (1.0 / max1, 1.0 / max2);
    for j in 0..n {
        if g[j].is_finite() {
            let denom = add(ftz(s2[j].sqrt()), mul(h.correction2, h.eps));
            let mut pj = fma(h.step_size, s1[j] / denom, p[j]);
            if h.weight_decay > 0.0 {
                pj = mul(pj, decay);
            }
            p[j] = pj;
        }
        let mut c1 = quantize(qmap1, true, mul(s1[j], inv1));
        // the sign of state1 survives quantization: a code of the other sign moves one toward it
        if qmap1[c1 as usize].is_sign_negative() != s1[j].is_sign_negative() {
            c1 = if s1[j] > 0.0 { c1.wrapping_add(1) } else { c1.wrapping_sub(1) };
        }
        state1[j] = c1;
        state2[j] = quantize(qmap2, false, mul(s2[j], inv2));
    }
}

/// One step of a parameter with 32-bit state (`exp_avg`, `exp_avg_sq`), in place, as
/// bitsandbytes' 32-bit Adam kernel: weight decay after the update, eps scaled by correction2.
pub fn update_full(p: &mut [f32], g: &[f32], exp_avg: &mut [f32], exp_avg_sq: &mut [f32], h: &Hyper) {
    let (one_minus_beta1, one_minus_beta2) = (1.0 - h.beta1, 1.0 - h.beta2);
    let decay = 1.0 - h.lr * h.weight_decay;
    for j in 0..p.len() {
        let gv = mul(g[j], h.grad_mult);
        exp_avg[j] = fma(h.beta1, exp_avg[j], mul(one_minus_beta1, gv));
        exp_avg_sq[j] = fma(h.beta2, exp_avg_sq[j], mul(one_minus_beta2, mul(gv, gv)));
        let denom = add(ftz(exp_avg_sq[j].sqrt()), mul(h.eps, h.correction2));
        let mut pj = fma(h.step_size, exp_avg[j] / denom, p[j]);
        if h.weight_decay > 0.0 {
            pj = mul(pj, decay);
        }
        p[j] = pj;
    }
}
