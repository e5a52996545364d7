//! The fused loops' inner loops over contiguous f32: exp, max, sums and the SiLU gate, written
//! so that the compiler vectorizes them (sums over 16 fixed lanes, exp as a polynomial instead of
//! a libm call), compiled three times — for AVX-512, for AVX2 with FMA, and for the baseline —
//! and picked once at run time. Every lane does the same f32 operations in the same order at
//! every width, so the three give the same bits.

use std::sync::OnceLock;

use crate::model::ops::dropout_mask::dropped;

/// Partial sums a reduction keeps: the widest vector of f32 (AVX-512).
const LANES: usize = 16;

/// Values whose exps are summed in f32 lanes before the sum goes on in f64.
const BLOCK: usize = 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Avx512,
    Avx2,
    Base,
}

fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq");
            if avx512 && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Level::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Level::Avx2;
            }
        }
        Level::Base
    })
}

/// e^x for x ≤ 0 (and up to 88): x = n·ln2 + r with |r| ≤ ln2/2, e^r by Cephes' expf polynomial
/// (relative error about 2e-7), times 2^n built in the exponent bits; 0 below −87.3.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.3, 88.3);
    let n = (x * LOG2E + 0.5).floor();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = (p * r) * r + r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x <= -87.3 {
        0.0
    } else {
        e * scale
    }
}

/// The 16 partial sums added in order (a tree of adds would make the compiler pair the lanes up
/// in the loop that fills them, and vectorize it worse).
#[inline(always)]
fn total(lanes: [f32; LANES]) -> f32 {
    let mut sum = 0f32;
    for lane in lanes {
        sum += lane;
    }
    sum
}

/// Σ f(x_i) over 16 lanes (a tail shorter than 16 into the first lanes).
#[inline(always)]
fn sum_by(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        let chunk: &[f32; LANES] = chunk.try_into().expect("a whole chunk");
        for l in 0..LANES {
            lanes[l] += f(chunk[l]);
        }
    }
    for (l, &x) in tail.iter().enumerate() {
        lanes[l] += f(x);
    }
    total(lanes)
}

/// Σ f(x_i, y_i) over 16 lanes, pairs up to the shorter slice.
#[inline(always)]
fn sum_pairs(x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = x.len().min(y.len());
    let mut lanes = [0f32; LANES];
    let (xs, ys) = (x[..n].chunks_exact(LANES), y[..n].chunks_exact(LANES));
    let (xt, yt) = (xs.remainder(), ys.remainder());
    for (x, y) in xs.zip(ys) {
        let (x, y): (&[f32; LANES], &[f32; LANES]) =
            (x.try_into().expect("a whole chunk"), y.try_into().expect("a whole chunk"));
        for l in 0..LANES {
            lanes[l] += f(x[l], y[l]);
        }
    }
    for (l, (&x, &y)) in xt.iter().zip(yt).enumerate() {
        lanes[l] += f(x, y);
    }
    total(lanes)
}

#[inline(always)]
fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + exp(-g))
}

/// Each function's body once, compiled for each level, and the entry point that picks one.
macro_rules! kernels {
    ($($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block)*) => {
        mod base {
            #[allow(unused_imports)]
            use super::*;
            $(#[inline(always)] pub fn $name($($arg: $ty),*) $(-> $ret)? $body)*
        }
        #[cfg(target_arch = "x86_64")]
        mod avx2 {
            #[allow(unused_imports)]
            use super::*;
            $(#[target_feature(enable = "avx2,fma")] pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                super::base::$name($($arg),*)
            })*
        }
        #[cfg(target_arch = "x86_64")]
        mod avx512 {
            #[allow(unused_imports)]
            use super::*;
            $(#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")] pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                super::base::$name($($arg),*)
            })*
        }
        $($(#[$doc])* pub fn $name($($arg: $ty),*) $(-> $ret)? {
            match level() {
                // SAFETY: the CPU has the features these were compiled for (checked in `level`)
                #[cfg(target_arch = "x86_64")]
                Level::Avx512 => unsafe { avx512::$name($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                Level::Avx2 => unsafe { avx2::$name($($arg),*) },
                _ => base::$name($($arg),*),
            }
        })*
    };
}

kernels! {
    /// The largest value (−∞ for none).
    pub fn max(xs: &[f32]) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let chunks = xs.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            let chunk: &[f32; LANES] = chunk.try_into().expect("a whole chunk");
            for l in 0..LANES {
                lanes[l] = lanes[l].max(chunk[l]);
            }
        }
        lanes.iter().chain(tail).copied().fold(f32::NEG_INFINITY, f32::max)
    }

    /// x ← e^(x − shift) in place; returns the sum of the new values (blocks of `BLOCK` summed
    /// in f32 lanes, the blocks' sums in f64: a 49,152-word row's sum stays accurate).
    pub fn exp_shifted(xs: &mut [f32], shift: f32) -> f32 {
        let mut sum = 0f64;
        for block in xs.chunks_mut(BLOCK) {
            let mut lanes = [0f32; LANES];
            let mut chunks = block.chunks_exact_mut(LANES);
            for chunk in &mut chunks {
                let chunk: &mut [f32; LANES] = chunk.try_into().expect("a whole chunk");
                for l in 0..LANES {
                    let e = exp(chunk[l] - shift);
                    chunk[l] = e;
                    lanes[l] += e;
                }
            }
            for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
                *x = exp(*x - shift);
                lanes[l] += *x;
            }
            sum += total(lanes) as f64;
        }
        sum as f32
    }

    /// Σ e^(x − shift), the values left as they are (summed as `exp_shifted` sums).
    pub fn exp_shifted_sum(xs: &[f32], shift: f32) -> f32 {
        xs.chunks(BLOCK).map(|block| sum_by(block, |x| exp(x - shift)) as f64).sum::<f64>() as f32
    }

    /// y ← y + a · x (over the shorter).
    pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    }

    /// x ← x · factor in place.
    pub fn scale(xs: &mut [f32], factor: f32) {
        for x in xs.iter_mut() {
            *x *= factor;
        }
    }

    /// Σ x_i · y_i (over the shorter).
    pub fn dot(x: &[f32], y: &[f32]) -> f32 {
        sum_pairs(x, y, |x, y| x * y)
    }

    /// The dot products of four rows with y (each over the shorter), y read once for all four:
    /// each equal to `dot(row, y)`.
    pub fn dot4(x0: &[f32], x1: &[f32], x2: &[f32], x3: &[f32], y: &[f32]) -> [f32; 4] {
        let n = y.len().min(x0.len()).min(x1.len()).min(x2.len()).min(x3.len());
        let mut lanes = [[0f32; LANES]; 4];
        let ys = y[..n].chunks_exact(LANES);
        let xs = [x0, x1, x2, x3].map(|x| x[..n].chunks_exact(LANES));
        let tail = ys.remainder();
        let tails = [0, 1, 2, 3].map(|r| xs[r].remainder());
        let [a, b, c, d] = xs;
        for ((((y, a), b), c), d) in ys.zip(a).zip(b).zip(c).zip(d) {
            let y: &[f32; LANES] = y.try_into().expect("a whole chunk");
            let rows: [&[f32; LANES]; 4] = [a, b, c, d].map(|x| x.try_into().expect("a whole chunk"));
            for l in 0..LANES {
                lanes[0][l] += rows[0][l] * y[l];
                lanes[1][l] += rows[1][l] * y[l];
                lanes[2][l] += rows[2][l] * y[l];
                lanes[3][l] += rows[3][l] * y[l];
            }
        }
        for (l, &y) in tail.iter().enumerate() {
            for r in 0..4 {
                lanes[r][l] += tails[r][l] * y;
            }
        }
        lanes.map(total)
    }

    /// Σ x_i².
    pub fn sum_squares(xs: &[f32]) -> f32 {
        sum_by(xs, |x| x * x)
    }

    /// dP ← P ⊙ (dP − rowsum(dP ⊙ P)): the softmax's backward of one row in place.
    pub fn softmax_grad(p: &[f32], dp: &mut [f32]) {
        let row = sum_pairs(p, dp, |p, d| p * d);
        for (d, &p) in dp.iter_mut().zip(p) {
            *d = p * (*d - row);
        }
    }

    /// y_i = x_i · m_i, m_i = 0 where the top 32 bits of element (first + i)'s draw from `seed`
    /// fall under `below`, else `keep_scale` (LoRA dropout's mask, ops/dropout_mask.rs).
    pub fn dropout(xs: &[f32], ys: &mut [f32], seed: u64, first: u64, below: u32, keep_scale: f32) {
        for (i, (y, &x)) in ys.iter_mut().zip(xs).enumerate() {
            *y = x * if dropped(seed, first + i as u64, below) { 0.0 } else { keep_scale };
        }
    }

    /// a = silu(g) ⊙ u.
    pub fn silu_gated(g: &[f32], u: &[f32], a: &mut [f32]) {
        for ((a, &g), &u) in a.iter_mut().zip(g).zip(u) {
            *a = (g * sigmoid(g)) * u;
        }
    }

    /// d_gate = da ⊙ u ⊙ σ(g)(1 + g(1 − σ(g))), d_up = da ⊙ silu(g).
    pub fn silu_gated_backward(g: &[f32], u: &[f32], da: &[f32], d_gate: &mut [f32], d_up: &mut [f32]) {
        let n = g.len().min(u.len()).min(da.len()).min(d_gate.len()).min(d_up.len());
        let (g, u, da, d_gate, d_up) = (&g[..n], &u[..n], &da[..n], &mut d_gate[..n], &mut d_up[..n]);
        for i in 0..n {
            let (g, u, da) = (g[i], u[i], da[i]);
            let sig = sigmoid(g);
            d_up[i] = da * (g * sig);
            d_gate[i] = (da * u) * (sig * (1.0 + g * (1.0 - sig)));
        }
    }

    /// `silu_gated_backward` and a = silu(g) ⊙ u in the same pass.
    pub fn silu_gated_backward_act(g: &[f32], u: &[f32], da: &[f32], d_gate: &mut [f32], d_up: &mut [f32], a: &mut [f32]) {
        let n = g.len().min(u.len()).min(da.len()).min(d_gate.len()).min(d_up.len()).min(a.len());
        let (g, u, da) = (&g[..n], &u[..n], &da[..n]);
        let (d_gate, d_up, a) = (&mut d_gate[..n], &mut d_up[..n], &mut a[..n]);
        for i in 0..n {
            let (g, u, da) = (g[i], u[i], da[i]);
            let sig = sigmoid(g);
            let value = g * sig;
            d_up[i] = da * value;
            d_gate[i] = (da * u) * (sig * (1.0 + g * (1.0 - sig)));
            a[i] = value * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polynomial against f64's exp over the range softmax feeds it (max-shifted values)
    /// and past it; 0 below the f32 range.
    #[test]
    fn exp_is_within_a_few_ulp_of_the_exact_value() {
        let mut worst = 0f64;
        for i in 0..200_000 {
            let x = -87.0 + i as f32 * (87.0 + 10.0) / 200_000.0;
            let exact = (x as f64).exp();
            worst = worst.max(((exp(x) as f64) - exact).abs() / exact);
        }
        assert!(worst < 4.0 * f32::EPSILON as f64, "relative error {worst:.2e}");
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }

    /// Each level gives the bits of the baseline (the lanes are the same at every width).
    #[test]
    fn every_level_gives_the_baselines_bits() {
        let xs: Vec<f32> = (0..1003).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let ys: Vec<f32> = (0..1003).map(|i| ((i * 13 % 17) as f32 - 8.0) / 3.0).collect();
        let m = base::max(&xs);
        let mut e = xs.clone();
        let sum = base::exp_shifted(&mut e, m);
        let mut a = vec![0f32; xs.len()];
        base::silu_gated(&xs, &ys, &mut a);
        assert_eq!(max(&xs).to_bits(), m.to_bits());
        let mut e2 = xs.clone();
        assert_eq!(exp_shifted(&mut e2, m).to_bits(), sum.to_bits());
        assert_eq!(e2, e);
        assert_eq!(exp_shifted_sum(&xs, m).to_bits(), sum.to_bits());
        assert_eq!(dot(&xs, &ys).to_bits(), base::dot(&xs, &ys).to_bits());
        let four = dot4(&xs, &ys, &ys, &xs, &ys);
        assert_eq!(four, base::dot4(&xs, &ys, &ys, &xs, &ys));
        assert_eq!([four[0], four[1]], [dot(&xs, &ys), dot(&ys, &ys)]);
        let mut a2 = vec![0f32; xs.len()];
        silu_gated(&xs, &ys, &mut a2);
        assert_eq!(a2, a);
        let (mut d, mut d2) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        base::dropout(&xs, &mut d, 7, 100, 1 << 30, 4.0 / 3.0);
        dropout(&xs, &mut d2, 7, 100, 1 << 30, 4.0 / 3.0);
        assert_eq!(d2, d);
        assert!(d.contains(&0.0) && d.iter().any(|&v| v != 0.0));
        // and the sums are sums: against f64
        let exact: f64 = xs.iter().zip(&ys).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&xs, &ys) as f64 - exact).abs() < 1e-4 * exact.abs().max(1.0));
    }
}
