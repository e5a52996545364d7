//! The dropout mask as a pure function of (seed, element index): element i is dropped when the
//! top 32 bits of SplitMix64(seed, i) fall under p·2³². The CPU loops (`cpu::vector`), the
//! composed path (`model::lora::dropout`) and the CUDA kernel (`src/cuda/dropout.cu`) draw it alike.

/// SplitMix64's increment (2⁶⁴ / φ): element i's draw starts from seed + (i + 1)·GOLDEN.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output for element `i` of the mask drawn from `seed`.
#[inline(always)]
pub fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add((i + 1).wrapping_mul(GOLDEN));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Elements whose draw's top 32 bits fall under this are dropped, for dropout rate `p`.
pub fn drop_below(p: f64) -> u32 {
    (p * 4_294_967_296.0).min(u32::MAX as f64) as u32
}

/// Whether element `i` of the mask drawn from `seed` is dropped.
#[inline(always)]
pub fn dropped(seed: u64, i: u64, below: u32) -> bool {
    ((mix(seed, i) >> 32) as u32) < below
}
