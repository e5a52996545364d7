//! 4-bit NormalFloat (NF4) blockwise quantization, bit-exact with bitsandbytes' CUDA kernels
//! (`kQuantizeBlockwiseSmall`/`dQuantizeNF4`, `kDequantizeBlockwise`): one f32 absmax per 64
//! values, two codes per byte with the first value in the high nibble.

use half::{bf16, f16};

/// Values per absmax block (bnb's default and QLoRA's `blocksize=64`).
pub const BLOCKSIZE: usize = 64;

/// The NF4 codebook (`nf4_dequantization_lut` in kernels.cu, digits kept verbatim).
#[allow(clippy::excessive_precision)]
pub const NF4_CODE: [f32; 16] = [
    -1.0,
    -0.696_192_800_998_687_7,
    -0.525_073_051_452_636_7,
    -0.394_917_488_098_144_53,
    -0.284_441_381_692_886_35,
    -0.184_773_433_208_465_58,
    -0.091_050_036_251_544_95,
    0.0,
    0.079_580_299_556_255_34,
    0.160_930_201_411_247_25,
    0.246_112_301_945_686_34,
    0.337_915_241_718_292_24,
    0.440_709_829_330_444_34,
    0.562_617_003_917_694_1,
    0.722_956_836_223_602_3,
    1.0,
];

/// `dQuantizeNF4`: the kernel's decision tree on the midpoints between codebook neighbours, with
/// its exact float constants. Ties go to the lower code; NaN (an all-zero block) gives code 0.
#[inline]
#[allow(clippy::excessive_precision)]
pub fn quantize_value(x: f32) -> u8 {
    if x > 0.039_790_149_778_127_67 {
        if x > 0.389_312_535_524_368_3 {
            if x > 0.642_786_920_070_648_2 {
                if x > 0.861_478_418_111_801_1 {
                    0b1111
                } else {
                    0b1110
                }
            } else if x > 0.501_663_416_624_069_2 {
                0b1101
            } else {
                0b1100
            }
        } else if x > 0.203_521_251_678_466_8 {
            if x > 0.292_013_771_789_389_3 {
                0b1011
            } else {
                0b1010
            }
        } else if x > 0.120_255_250_483_751_3 {
            0b1001
        } else {
            0b1000
        }
    } else if x > -0.339_679_434_895_515_44 {
        if x > -0.137_911_733_239_889_14 {
            if x > -0.045_525_018_125_772_476 {
                0b0111
            } else {
                0b0110
            }
        } else if x > -0.234_607_405_960_559_84 {
            0b0101
        } else {
            0b0100
        }
    } else if x > -0.610_632_926_225_662_2 {
        if x > -0.459_995_269_775_390_6 {
            0b0011
        } else {
            0b0010
        }
    } else if x > -0.848_096_400_499_343_9 {
        0b0001
    } else {
        0b0000
    }
}

/// The decision tree's thresholds in ascending order: the tree returns the number of thresholds
/// strictly below x, which is how the blockwise loop computes it without branches.
#[allow(clippy::excessive_precision)]
const THRESHOLDS: [f32; 15] = [
    -0.848_096_400_499_343_9,
    -0.610_632_926_225_662_2,
    -0.459_995_269_775_390_6,
    -0.339_679_434_895_515_44,
    -0.234_607_405_960_559_84,
    -0.137_911_733_239_889_14,
    -0.045_525_018_125_772_476,
    0.039_790_149_778_127_67,
    0.120_255_250_483_751_3,
    0.203_521_251_678_466_8,
    0.292_013_771_789_389_3,
    0.389_312_535_524_368_3,
    0.501_663_416_624_069_2,
    0.642_786_920_070_648_2,
    0.861_478_418_111_801_1,
];

/// `quantize_value(v * inv)` for each value, branch-free (vectorizes).
#[inline]
fn quantize_scaled(vals: &[f32], inv: f32, codes: &mut [u8]) {
    for (c, &v) in codes.iter_mut().zip(vals) {
        let x = v * inv;
        *c = THRESHOLDS.iter().map(|&t| (x > t) as u8).sum();
    }
}

/// An input element the quantizer reads as f32 (exactly, as the kernel's `(float)` cast does).
pub trait Element: Copy + Send + Sync {
    fn to_f32(self) -> f32;
    /// Round-to-nearest-even from f32, as the kernel's store into `T` does.
    fn from_f32(v: f32) -> Self;
}

impl Element for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Element for f16 {
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Element for bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// Quantizes `x` blockwise: returns the packed codes (`(n + 1) / 2` bytes) and one absmax per
/// block. An odd length pads the last low nibble with the code of 0.0 (of NaN in a zero block).
pub fn quantize<T: Element>(x: &[T]) -> (Vec<u8>, Vec<f32>) {
    let mut packed = Vec::with_capacity(x.len().div_ceil(2));
    let mut absmax = Vec::with_capacity(x.len().div_ceil(BLOCKSIZE));
    let mut block = [0f32; BLOCKSIZE];
    for chunk in x.chunks(BLOCKSIZE) {
        let vals = &mut block[..chunk.len()];
        for (v, &e) in vals.iter_mut().zip(chunk) {
            *v = e.to_f32();
        }
        let amax = super::dynamic::block_absmax(vals, chunk.len() < BLOCKSIZE);
        let inv = 1.0 / amax;
        // the kernel pads a partial block with zeros, which also scale (0 * inv) and quantize;
        // whole blocks of a fixed size let the compiler vectorize the comparisons
        block[chunk.len()..].fill(0.0);
        let mut codes = [0u8; BLOCKSIZE];
        quantize_scaled(&block, inv, &mut codes);
        let len = chunk.len().div_ceil(2) * 2;
        packed.extend(codes[..len].chunks_exact(2).map(|p| p[0] << 4 | p[1]));
        absmax.push(amax);
    }
    (packed, absmax)
}

/// `NF4_CODE[c] * absmax` per value, computed in f32 and rounded once to `T`; `n` values.
pub fn dequantize<T: Element>(packed: &[u8], absmax: &[f32], n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    for (bytes, &amax) in packed.chunks(BLOCKSIZE / 2).zip(absmax) {
        for &b in bytes {
            out.push(T::from_f32(NF4_CODE[(b >> 4) as usize] * amax));
            out.push(T::from_f32(NF4_CODE[(b & 0x0f) as usize] * amax));
        }
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codebook_values_map_to_themselves() {
        for (i, &c) in NF4_CODE.iter().enumerate() {
            assert_eq!(quantize_value(c) as usize, i, "code {i} = {c}");
        }
    }

    #[test]
    fn codes_switch_within_a_few_ulps_of_each_midpoint() {
        // the tree's constants were generated from the f64 codebook, so the switch from code i to
        // i + 1 sits at the midpoint up to rounding; walk 8 ulps either side
        for i in 0..15 {
            let mid = ((NF4_CODE[i] as f64 + NF4_CODE[i + 1] as f64) / 2.0) as f32;
            let ulps =
                |k: i32| f32::from_bits((mid.to_bits() as i32 + if mid > 0.0 { k } else { -k }) as u32);
            let codes: Vec<u8> = (-8..=8).map(|k| quantize_value(ulps(k))).collect();
            assert!(codes.windows(2).all(|w| w[0] <= w[1]), "midpoint {i}: {codes:?}");
            assert_eq!((codes[0] as usize, codes[16] as usize), (i, i + 1), "midpoint {i}: {codes:?}");
        }
    }

    #[test]
    fn branch_free_quantizer_equals_the_decision_tree() {
        let mut xs = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1.0, -1.0];
        for &t in &THRESHOLDS {
            let b = t.to_bits() as i32;
            xs.extend((-3..=3).map(|k| f32::from_bits((b + k) as u32)));
        }
        xs.extend((0..20_000).map(|i| (i as f32 / 10_000.0 - 1.0) * 1.01));
        let mut codes = vec![0u8; xs.len()];
        quantize_scaled(&xs, 1.0, &mut codes);
        for (x, c) in xs.iter().zip(&codes) {
            assert_eq!(*c, quantize_value(*x), "x = {x:e}");
        }
    }

    #[test]
    fn nan_is_code_zero() {
        assert_eq!(quantize_value(f32::NAN), 0);
    }

    #[test]
    fn quantize_of_dequantize_is_identity() {
        let x: Vec<f32> = (0..301).map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021).collect();
        let (packed, absmax) = quantize(&x);
        assert_eq!((packed.len(), absmax.len()), (151, 5));
        let y: Vec<f32> = dequantize(&packed, &absmax, x.len());
        let (packed2, absmax2) = quantize(&y);
        assert_eq!(absmax, absmax2);
        assert_eq!(packed, packed2);
    }

    #[test]
    fn first_value_is_the_high_nibble_and_odd_length_pads_with_zero_code() {
        let (packed, absmax) = quantize(&[1.0f32, -1.0, 0.0]);
        assert_eq!(absmax, vec![1.0]);
        assert_eq!(packed, vec![0xf0, 0x77]);
    }
}
