//! LoRA dropout as a pure function of (seed, element index): element i of the input is kept unless
//! the top 32 bits of SplitMix64(seed, i) fall under p·2³², and kept values are scaled by 1/(1-p)
//! as `torch.nn.Dropout` does (the draw: `model::ops::dropout_mask`). Nothing is stored between the
//! forward and the backward's recompute, and CPU and GPU draw the same mask.

use crate::model::ops::dropout_mask::{drop_below, dropped, GOLDEN};
use candle_core::{DType, Result, Tensor};

/// The seed of one dropout mask.
#[derive(Debug, Clone, Copy)]
pub struct DropoutSeed(pub u64);

impl DropoutSeed {
    /// The seed whose mask over a tensor equals this one's from element `values` on: the mask of
    /// a tile of rows that starts `values` elements into the whole tensor.
    pub fn skip(self, values: usize) -> Self {
        DropoutSeed(self.0.wrapping_add((values as u64).wrapping_mul(GOLDEN)))
    }
}

/// x with dropout rate `p` applied (same shape and dtype). `p = 0` returns x.
pub fn dropout(x: &Tensor, seed: DropoutSeed, p: f64) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    let keep_scale = (1.0 / (1.0 - p)) as f32;
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return crate::cuda::dropout::dropout(x, seed.0, drop_below(p), keep_scale);
    }
    let below = drop_below(p);
    if crate::model::ops::cpu::takes(&[x]) {
        // the mask drawn and applied in one pass, threads over the elements
        return crate::model::ops::cpu::elementwise::dropout(x, seed.0, below, keep_scale);
    }
    let mask: Vec<f32> = (0..x.elem_count() as u64)
        .map(|i| if dropped(seed.0, i, below) { 0.0 } else { keep_scale })
        .collect();
    let mask = Tensor::from_vec(mask, x.shape(), x.device())?;
    let dtype = x.dtype();
    if dtype == DType::F32 {
        x.contiguous()?.mul(&mask)
    } else {
        x.to_dtype(DType::F32)?.mul(&mask)?.to_dtype(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn dropout_drops_about_p_scales_the_rest_and_is_a_function_of_the_seed() {
        let x = Tensor::ones((400, 250), DType::F32, &Device::Cpu).unwrap();
        let y = dropout(&x, DropoutSeed(7), 0.1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let dropped = y.iter().filter(|&&v| v == 0.0).count() as f64 / y.len() as f64;
        assert!((dropped - 0.1).abs() < 0.005, "dropped {dropped}");
        assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.9).abs() < 1e-6));
        let again =
            dropout(&x, DropoutSeed(7), 0.1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(y, again);
        let other =
            dropout(&x, DropoutSeed(8), 0.1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_ne!(y, other);
        assert_eq!(
            dropout(&x, DropoutSeed(7), 0.0).unwrap().to_vec2::<f32>().unwrap(),
            x.to_vec2::<f32>().unwrap()
        );
    }

    /// The CPU's fused pass (f32) gives the bits of the mask drawn whole and multiplied, over
    /// more elements than one of its tasks holds.
    #[test]
    fn the_fused_cpu_pass_equals_the_drawn_mask() {
        let x = Tensor::randn(0f32, 1.0, (70, 1000), &Device::Cpu).unwrap();
        let (seed, p) = (DropoutSeed(11), 0.25);
        let below = drop_below(p);
        let keep = (1.0 / (1.0 - p)) as f32;
        let mask: Vec<f32> =
            (0..x.elem_count() as u64).map(|i| if dropped(seed.0, i, below) { 0.0 } else { keep }).collect();
        let want = x.mul(&Tensor::from_vec(mask, x.shape(), &Device::Cpu).unwrap()).unwrap();
        let got = dropout(&x, seed, p).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
        };
        assert_eq!(bits(&got), bits(&want));
    }

    /// A tile of rows masked with the skipped seed gets exactly the whole tensor's mask there.
    #[test]
    fn a_skipped_seed_masks_a_row_tile_as_the_whole_tensor() {
        let x = Tensor::randn(0f32, 1.0, (9, 13), &Device::Cpu).unwrap();
        let whole = dropout(&x, DropoutSeed(5), 0.4).unwrap();
        let tile = dropout(&x.narrow(0, 4, 3).unwrap(), DropoutSeed(5).skip(4 * 13), 0.4).unwrap();
        assert_eq!(tile.to_vec2::<f32>().unwrap(), whole.narrow(0, 4, 3).unwrap().to_vec2::<f32>().unwrap());
        let unskipped = dropout(&x.narrow(0, 4, 3).unwrap(), DropoutSeed(5), 0.4).unwrap();
        assert_ne!(unskipped.to_vec2::<f32>().unwrap(), tile.to_vec2::<f32>().unwrap());
    }

    /// The device draws the same mask as the CPU.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_dropout_equals_the_cpu_mask() {
        let gpu = Device::new_cuda(0).unwrap();
        let x = Tensor::randn(0f32, 1.0, (123, 457), &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let xd = x.to_dtype(dtype).unwrap();
            let cpu = dropout(&xd, DropoutSeed(99), 0.3).unwrap().to_dtype(DType::F32).unwrap();
            let on_gpu = dropout(&xd.to_device(&gpu).unwrap(), DropoutSeed(99), 0.3).unwrap();
            let on_gpu = on_gpu.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
            let diff = (cpu - on_gpu).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff < 1e-2, "{dtype:?}: {diff}");
        }
    }
}
