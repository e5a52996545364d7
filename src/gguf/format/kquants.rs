//! llama.cpp's reference quantizers for the types a `Q4_K_M` file holds, ported from ggml's
//! `ggml-quants.c` (ggml-org/llama.cpp, the code llama-cpp-python 0.3.36 ships):
//! `quantize_row_q4_K_ref`, `quantize_row_q5_K_ref`, `quantize_row_q6_K_ref` and
//! `quantize_row_q5_0_ref`, which `llama-quantize` runs on every tensor when no importance
//! matrix is given. The port keeps ggml's order of f32 operations and its `nearest_int`
//! (round half to even through the 1.5·2^23 trick), so the blocks are byte-exact with llama.cpp's
//! (tests/golden/gguf_kquants.json, from `ggml_quantize_chunk` itself).
//!
//! Why not candle's `k_quants` `from_float`: its Q4_K/Q5_K follow the older `make_qkx1_quants`
//! search (llama.cpp before the ref quantizers moved to `make_qkx2_quants`) and round with
//! `f32::round` (half away from zero), so its blocks differ from today's llama.cpp
//! (tests/gguf_kquants.rs `candle_q4k_is_not_llama_cpps`: 12 of the 14 golden rows differ).

use half::f16;

pub const QK_K: usize = 256;
/// Bytes of one block of 256 values.
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;
/// Bytes of one `q5_0` block of 32 values.
pub const Q5_0_BYTES: usize = 22;

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even for |v| < 2^22 (and ggml's own garbage beyond).
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12582912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

fn fp16(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn fp16_round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// `make_qkx2_quants`: an affine fit `x ≈ scale·L − min` of one sub-block, L in 0..=nmax, weighted
/// squared error (`use_mad` false, as the ref quantizers call it). Returns (scale, min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.clamp(0, nmax) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `make_qx_quants` with `rmse_type` 1 and no importance weights (as `quantize_row_q6_K_ref`
/// calls it): a symmetric scale for one sub-block, L in 0..2·nmax (offset by nmax).
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = -nmax_f / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let (w, l) = (x[i] * x[i], l as f32);
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax_f + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
                l_out[i] = (nmax + l) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` from the 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The shared half of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref` for one block of 256:
/// eight sub-block fits, their scales and mins packed as 6 bits each, and each value's level L
/// in 0..=nmax. Returns (d, dmin as f16 bytes, the 12 scale bytes, L).
fn affine_k_block(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> ([u8; 2], [u8; 2], [u8; 12], [u8; QK_K]) {
    let mut levels = [0u8; QK_K];
    let mut aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let (mut scales, mut mins) = ([0f32; QK_K / 32], [0f32; QK_K / 32]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..QK_K / 32 {
        let sub = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in sub {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(sub) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(
            nmax,
            sub,
            &weights,
            &mut levels[32 * j..32 * j + 32],
            &mut aux,
            rmin,
            0.1,
            nstep,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..QK_K / 32 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (fp16(max_scale / 63.0), fp16(max_min / 63.0));
    let (d_f, dmin_f) = (fp16_round(max_scale / 63.0), fp16_round(max_min / 63.0));
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, &packed);
        let d = d_f * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_f * m as f32;
        for ii in 0..32 {
            levels[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, levels)
}

/// `quantize_row_q4_K_ref` of `x` (a multiple of 256 values): 144 bytes per block, `d`, `dmin`,
/// 12 scale bytes, 128 bytes of 4-bit levels.
pub fn quantize_q4_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK_K * Q4_K_BYTES);
    for block in x.chunks_exact(QK_K) {
        let (d, dmin, scales, levels) = affine_k_block(block, 15, -1.0, 20);
        out.extend_from_slice(&d);
        out.extend_from_slice(&dmin);
        out.extend_from_slice(&scales);
        for j in (0..QK_K).step_by(64) {
            out.extend((0..32).map(|l| levels[j + l] | (levels[j + l + 32] << 4)));
        }
    }
    out
}

/// `quantize_row_q5_K_ref`: 176 bytes per block, `d`, `dmin`, 12 scale bytes, 32 bytes of high
/// bits, 128 bytes of low nibbles.
pub fn quantize_q5_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK_K * Q5_K_BYTES);
    for block in x.chunks_exact(QK_K) {
        let (d, dmin, scales, levels) = affine_k_block(block, 31, -0.5, 15);
        let (mut qh, mut ql) = ([0u8; QK_K / 8], [0u8; QK_K / 2]);
        let (mut m1, mut m2) = (1u8, 2u8);
        for (chunk, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let mut l1 = levels[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = levels[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[32 * chunk + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
        out.extend_from_slice(&d);
        out.extend_from_slice(&dmin);
        out.extend_from_slice(&scales);
        out.extend_from_slice(&qh);
        out.extend_from_slice(&ql);
    }
    out
}

/// `quantize_row_q6_K_ref`: 210 bytes per block, 128 bytes of low nibbles, 64 of high bit pairs,
/// 16 signed 8-bit scales, `d`.
pub fn quantize_q6_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / QK_K * Q6_K_BYTES);
    for block in x.chunks_exact(QK_K) {
        let mut levels = [0i8; QK_K];
        let mut scales = [0f32; QK_K / 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(32, &block[16 * ib..16 * ib + 16], &mut levels[16 * ib..16 * ib + 16]);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            out.extend_from_slice(&[0u8; Q6_K_BYTES]);
            continue;
        }
        let iscale = -128.0f32 / max_scale;
        let d = fp16(1.0 / iscale);
        let d_f = fp16_round(1.0 / iscale);
        let mut qscales = [0i8; QK_K / 16];
        for ib in 0..QK_K / 16 {
            qscales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = d_f * qscales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let l = nearest_int(block[16 * j + ii] / d).clamp(-32, 31);
                levels[16 * j + ii] = (l + 32) as i8;
            }
        }
        let (mut ql, mut qh) = ([0u8; QK_K / 2], [0u8; QK_K / 4]);
        for (half, j) in (0..QK_K).step_by(128).enumerate() {
            let (ql, qh) = (&mut ql[64 * half..], &mut qh[32 * half..]);
            for l in 0..32 {
                let q = |k: usize| levels[j + l + k] as u8;
                ql[l] = (q(0) & 0xF) | ((q(64) & 0xF) << 4);
                ql[l + 32] = (q(32) & 0xF) | ((q(96) & 0xF) << 4);
                qh[l] = (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
            }
        }
        out.extend_from_slice(&ql);
        out.extend_from_slice(&qh);
        out.extend(qscales.iter().map(|&s| s as u8));
        out.extend_from_slice(&d);
    }
    out
}

/// `quantize_row_q5_0_ref` of `x` (a multiple of 32 values): 22 bytes per block, `d`, 4 bytes of
/// fifth bits, 16 bytes of low nibbles.
pub fn quantize_q5_0(x: &[f32]) -> Vec<u8> {
    const QK: usize = 32;
    let mut out = Vec::with_capacity(x.len() / QK * Q5_0_BYTES);
    for block in x.chunks_exact(QK) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in block {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qh = 0u32;
        let mut qs = [0u8; QK / 2];
        for j in 0..QK / 2 {
            // C's (int8_t)(x + 16.5f): truncation toward zero
            let level = |v: f32| ((v * id + 16.5) as i32 as i8).min(31) as u8;
            let (xi0, xi1) = (level(block[j]), level(block[QK / 2 + j]));
            qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        out.extend_from_slice(&fp16(d));
        out.extend_from_slice(&qh.to_le_bytes());
        out.extend_from_slice(&qs);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let got: Vec<i32> = [0.5f32, 1.5, 2.5, -0.5, -1.5, 2.49, -7.51].map(nearest_int).to_vec();
        assert_eq!(got, [0, 2, 2, 0, -2, 2, -8]);
    }

    #[test]
    fn block_sizes_match_ggml() {
        let x = vec![0.25f32; 2 * QK_K];
        assert_eq!(quantize_q4_k(&x).len(), 2 * Q4_K_BYTES);
        assert_eq!(quantize_q5_k(&x).len(), 2 * Q5_K_BYTES);
        assert_eq!(quantize_q6_k(&x).len(), 2 * Q6_K_BYTES);
        assert_eq!(quantize_q5_0(&x).len(), 16 * Q5_0_BYTES);
    }
}
