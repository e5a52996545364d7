//! bitsandbytes' 8-bit dynamic maps and its blockwise quantizer (used for the absmax values of
//! double quantization), bit-exact with `create_dynamic_map(signed=True)`, `kQuantizeBlockwise`
//! (General8bit) and `kDequantizeBlockwise`; the unsigned map (`create_dynamic_map(signed=False)`)
//! is 8-bit AdamW's for its second moment (optim/adamw8bit.rs).

use std::sync::OnceLock;

/// Values per absmax block of the 8-bit quantizer (bnb's `blocksize=256` for nested statistics).
pub const BLOCKSIZE: usize = 256;

/// `create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)`: 256 sorted values in
/// [-1, 1]. Generated rather than embedded; a test checks it against the golden file.
pub fn dynamic_map() -> &'static [f32; 256] {
    static MAP: OnceLock<[f32; 256]> = OnceLock::new();
    MAP.get_or_init(|| generate(true))
}

/// `create_dynamic_map(signed=False)`: 256 sorted values in [0, 1], twice as many fractions per
/// exponent and no negatives (8-bit AdamW's `qmap2`).
pub fn unsigned_dynamic_map() -> &'static [f32; 256] {
    static MAP: OnceLock<[f32; 256]> = OnceLock::new();
    MAP.get_or_init(|| generate(false))
}

/// `torch.linspace(0.1, 1, k, dtype=float32)` as PyTorch's CPU kernel computes it: the first half
/// counts up from the start, the second half down from the end, and the compiler fuses each
/// multiply-add into one FMA (the golden map needs this exact rounding).
fn torch_linspace(k: usize) -> Vec<f32> {
    let (start, end) = (0.1f32, 1.0f32);
    let step = (end - start) / (k - 1) as f32;
    (0..k)
        .map(
            |i| {
                if i < k / 2 {
                    step.mul_add(i as f32, start)
                } else {
                    (-step).mul_add((k - i - 1) as f32, end)
                }
            },
        )
        .collect()
}

fn generate(signed: bool) -> [f32; 256] {
    // 10^(-6 + i) as Python floats, rounded to f32 when torch multiplies an f32 tensor by them.
    const SCALES: [f64; 7] = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0];
    let mut data = Vec::with_capacity(256);
    for (i, &scale) in SCALES.iter().enumerate() {
        // the unsigned map spends the sign bit on twice the fractions
        let bounds = torch_linspace((1 << (i + usize::from(!signed))) + 1);
        let means: Vec<f32> = bounds.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
        let scale = scale as f32;
        data.extend(means.iter().map(|m| scale * m));
        if signed {
            data.extend(means.iter().map(|m| -scale * m));
        }
    }
    data.push(0.0);
    data.push(1.0);
    data.sort_by(f32::total_cmp);
    data.try_into().expect("the dynamic map has 2^8 entries")
}

/// bnb's `dQuantize<0>`: a 7-step binary search over the sorted map followed by a midpoint test
/// against the last pivot's neighbours. Not always the nearest code: the neighbours are the last
/// bracket of the search, so the kernel's exact comparisons are reproduced here.
#[inline]
pub fn quantize_value(code: &[f32; 256], x: f32) -> u8 {
    let mut b = Bracket::search(code, -1.0, x);
    if b.upper_pivot == 255 {
        b.upper = code[255];
    }
    if b.lower_pivot == 0 {
        b.lower = code[0];
    }
    b.nearer(x)
}

/// Where the binary search of bitsandbytes' quantizers (`dQuantize`, and the 8-bit optimizers'
/// `quantize_2D`) ends: the last pivot and its value, and the bracket around it.
pub(crate) struct Bracket {
    pivot: usize,
    val: f32,
    lower_pivot: usize,
    upper_pivot: usize,
    lower: f32,
    upper: f32,
}

impl Bracket {
    /// Seven halvings from the middle (127) of the sorted `code`, the bracket starting at
    /// [`lower`, 1].
    #[inline]
    pub(crate) fn search(code: &[f32; 256], lower: f32, x: f32) -> Self {
        let mut b = Self { pivot: 127, val: code[127], lower_pivot: 0, upper_pivot: 255, lower, upper: 1.0 };
        let mut step = 64;
        while step > 0 {
            if x > b.val {
                (b.lower_pivot, b.lower) = (b.pivot, b.val);
                b.pivot += step;
            } else {
                (b.upper_pivot, b.upper) = (b.pivot, b.val);
                b.pivot -= step;
            }
            b.val = code[b.pivot];
            step >>= 1;
        }
        b
    }

    /// The last pivot or the bracket's end on x's side, whichever is nearer by the midpoint
    /// between their values; a tie goes to the pivot.
    #[inline]
    pub(crate) fn nearer(&self, x: f32) -> u8 {
        let chosen = if x > self.val {
            if x > (self.upper + self.val) * 0.5 {
                self.upper_pivot
            } else {
                self.pivot
            }
        } else if x < (self.lower + self.val) * 0.5 {
            self.lower_pivot
        } else {
            self.pivot
        };
        chosen as u8
    }
}

/// The largest |x| of a block as the kernel reduces it: `fmaxf` from -FLT_MAX (NaN ignored), with
/// a partial block padded by zeros.
#[inline]
pub(crate) fn block_absmax(block: &[f32], padded: bool) -> f32 {
    let start = if padded { 0.0 } else { -f32::MAX };
    block.iter().fold(start, |m, v| m.max(v.abs()))
}

/// 8-bit blockwise quantization of `x` with the dynamic map: `codes[i]` for every value and one
/// absmax per `BLOCKSIZE` values. Values are scaled by the reciprocal of the absmax, as the kernel
/// does (an all-zero block gives NaN, which the search maps to code 0).
pub fn quantize_blockwise(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let code = dynamic_map();
    let mut codes = Vec::with_capacity(x.len());
    let mut absmax = Vec::with_capacity(x.len().div_ceil(BLOCKSIZE));
    for block in x.chunks(BLOCKSIZE) {
        let amax = block_absmax(block, block.len() < BLOCKSIZE);
        let inv = 1.0 / amax;
        codes.extend(block.iter().map(|&v| quantize_value(code, v * inv)));
        absmax.push(amax);
    }
    (codes, absmax)
}

/// `code[q] * absmax` per value, in f32.
pub fn dequantize_blockwise(codes: &[u8], absmax: &[f32]) -> Vec<f32> {
    let code = dynamic_map();
    codes
        .chunks(BLOCKSIZE)
        .zip(absmax)
        .flat_map(|(block, &amax)| block.iter().map(move |&q| code[q as usize] * amax))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_is_sorted_signed_and_spans_minus_one_to_one() {
        let m = dynamic_map();
        assert!(m.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(m[255], 1.0);
        assert_eq!(m.iter().filter(|v| **v == 0.0).count(), 1);
        assert_eq!(m.iter().filter(|v| **v < 0.0).count(), 127);
        // the most negative entry is the top fraction's midpoint (0.99296875 after rounding)
        assert!((m[0] + 0.992_968_75).abs() < 1e-6, "{}", m[0]);
    }

    #[test]
    fn every_code_value_quantizes_to_itself() {
        let m = dynamic_map();
        for (i, &v) in m.iter().enumerate() {
            assert_eq!(quantize_value(m, v) as usize, i, "code {i} value {v}");
        }
    }

    #[test]
    fn blockwise_round_trip_is_a_fixed_point() {
        let x: Vec<f32> = (0..700).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let (codes, absmax) = quantize_blockwise(&x);
        assert_eq!(absmax.len(), 3);
        let y = dequantize_blockwise(&codes, &absmax);
        let (codes2, absmax2) = quantize_blockwise(&y);
        assert_eq!(codes, codes2);
        assert_eq!(absmax, absmax2);
    }

    #[test]
    fn zero_block_is_nan_scaled_to_code_zero() {
        let (codes, absmax) = quantize_blockwise(&[0.0; 5]);
        assert_eq!(absmax, vec![0.0]);
        assert_eq!(codes, vec![0; 5]);
    }
}
