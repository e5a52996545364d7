//! Double quantization of the NF4 absmax values (bitsandbytes' `compress_statistics=True`):
//! subtract their mean, then quantize to 8 bits with the dynamic map in blocks of 256.

use super::dynamic;

/// The 8-bit form of a set of f32 absmax values.
#[derive(Debug, Clone, PartialEq)]
pub struct DoubleQuantized {
    /// One dynamic-map code per absmax value.
    pub codes: Vec<u8>,
    /// One f32 scale per `dynamic::BLOCKSIZE` codes.
    pub absmax2: Vec<f32>,
    /// The mean that was subtracted before quantizing.
    pub offset: f32,
}

/// `absmax.mean()` as torch computes it on CUDA for f32: the sum, rounded to f32, times the f32
/// factor `1.0f / n`. The sum is taken in f64 here; CUDA's f32 tree reduction can differ from the
/// correctly rounded sum by an ulp or so for long inputs.
pub fn mean_offset(absmax: &[f32]) -> f32 {
    let sum: f64 = absmax.iter().map(|&a| a as f64).sum();
    (sum as f32) * (1.0 / absmax.len() as f32)
}

impl DoubleQuantized {
    pub fn compress(absmax: &[f32]) -> Self {
        Self::compress_with_offset(absmax, mean_offset(absmax))
    }

    /// Quantizes `absmax - offset` (f32 subtraction) with a given offset.
    pub fn compress_with_offset(absmax: &[f32], offset: f32) -> Self {
        let centered: Vec<f32> = absmax.iter().map(|&a| a - offset).collect();
        let (codes, absmax2) = dynamic::quantize_blockwise(&centered);
        Self { codes, absmax2, offset }
    }

    /// The absmax values as bnb's `dequantize_4bit` restores them: `code * absmax2`, then
    /// `+ offset`, each rounded in f32.
    pub fn decompress(&self) -> Vec<f32> {
        let mut absmax = dynamic::dequantize_blockwise(&self.codes, &self.absmax2);
        for a in &mut absmax {
            *a += self.offset;
        }
        absmax
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_is_exact_for_representable_sums() {
        assert_eq!(mean_offset(&[1.0, 2.0, 3.0, 6.0]), 3.0);
        assert_eq!(mean_offset(&[0.5]), 0.5);
    }

    #[test]
    fn compress_decompress_compress_is_a_fixed_point_and_close() {
        let absmax: Vec<f32> = (0..300).map(|i| 0.01 + (i % 17) as f32 * 0.003).collect();
        let dq = DoubleQuantized::compress(&absmax);
        assert_eq!((dq.codes.len(), dq.absmax2.len()), (300, 2));
        let restored = dq.decompress();
        for (a, r) in absmax.iter().zip(&restored) {
            // the dynamic map's coarsest step near 1 is 1/64 of absmax2
            assert!((a - r).abs() <= dq.absmax2[0].max(dq.absmax2[1]) / 64.0, "{a} vs {r}");
        }
        let again = DoubleQuantized::compress_with_offset(&restored, dq.offset);
        assert_eq!(again.codes, dq.codes);
    }

    #[test]
    fn constant_absmax_is_nan_scaled_to_code_zero() {
        let dq = DoubleQuantized::compress(&[0.25; 3]);
        assert_eq!((dq.offset, dq.absmax2.clone(), dq.codes.clone()), (0.25, vec![0.0], vec![0; 3]));
        // code 0 is -0.99…, times absmax2 = 0 gives -0, plus the offset: exact
        assert_eq!(dq.decompress(), vec![0.25; 3]);
    }
}
