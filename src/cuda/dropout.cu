// LoRA dropout on the device: element i is kept unless hash(seed, i) falls under p, so the mask
// is a pure function of (seed, index), regenerated in the backward's recompute instead of stored,
// and identical to the CPU path's (src/model/lora/dropout.rs has the same SplitMix64 finaliser).
#include <stdint.h>

#include "dtype.cuh"

#define THREADS 256

__device__ __forceinline__ uint64_t mix(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// out = x * keep_scale where hash(seed, i) >> 32 >= drop_below, else 0.
template <typename T>
__device__ void dropout(const T* x, T* out, int64_t n, uint64_t seed, uint32_t drop_below, float keep_scale) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * THREADS) {
        const bool keep = (uint32_t)(mix(seed, (uint64_t)i) >> 32) >= drop_below;
        store(out + i, keep ? to_f32(x[i]) * keep_scale : 0.0f);
    }
}

#define DROPOUT_OP(NAME, T)                                                                          \
    extern "C" __global__ void dropout_##NAME(const T* x, T* out, int64_t n, uint64_t seed,          \
                                              uint32_t drop_below, float keep_scale) {               \
        dropout<T>(x, out, n, seed, drop_below, keep_scale);                                         \
    }

DROPOUT_OP(f32, float)
DROPOUT_OP(f16, __half)
DROPOUT_OP(bf16, __nv_bfloat16)
