// Rotary position embedding on the projections' own [b, t, heads, d] layout, forward and backward
// (`sign` -1: the rotation by the opposite angle), in HF's rotate_half layout:
//   out1 = x1 c - x2 s,  out2 = x1 s + x2 c   (x1, x2: the first and second half of a head).
// The arithmetic is the compute dtype's own, as candle's rope_thd kernel and torch's eager ops do
// it (each product rounded, then the sum); nvcc may fuse a product and the sum into one FMA here
// and not there, so results agree with candle's within rounding (the CUDA test holds them to the
// crate's multiple of candle's own error against f64), not bit for bit. Each thread takes N = 16 / sizeof(T) neighbouring pairs: one
// 16-byte load of each half, of cos and of sin, and one store of each half; candle's takes one
// pair in 2-byte loads, well short of the memory bandwidth (benches/code_notes.md).
#include <stdint.h>
#include "dtype.cuh"

// cos/sin are [t, d/2] (every row of the batch at the same positions) or, with `per_row`,
// [b, t, d/2] (packed rows: each token at its own position).
template <typename T>
__device__ __forceinline__ void rope_pair(const T* x, const T* cos, const T* sin, T* y, int64_t pair, int64_t half,
                                          int64_t heads, int64_t t, int per_row, int sign) {
    const int64_t bth = pair / half, i = pair - bth * half;
    const int64_t bt = bth / heads;  // b * t + position
    const int64_t cs = (per_row ? bt : bt % t) * half + i;
    const int64_t i1 = bth * 2 * half + i, i2 = i1 + half;
    const T c = cos[cs];
    const T s = sign < 0 ? T(-sin[cs]) : sin[cs];
    const T a = x[i1], b = x[i2];
    y[i1] = a * c - b * s;
    y[i2] = a * s + b * c;
}

template <typename T>
__device__ void rope_thd(const T* x, const T* cos, const T* sin, T* y, int64_t pairs, int64_t half, int64_t heads,
                         int64_t t, int per_row, int sign) {
    constexpr int N = Vec16<T>::N;
    const int64_t unit = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (half % N != 0 || !aligned16(x, cos, sin, y)) {  // a head too narrow for 16-byte vectors (or
        // an unaligned view): one pair per thread
        for (int64_t p = unit; p < pairs; p += (int64_t)gridDim.x * blockDim.x)
            rope_pair(x, cos, sin, y, p, half, heads, t, per_row, sign);
        return;
    }
    for (int64_t u = unit; u < pairs / N; u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pair = u * N;
        const int64_t bth = pair / half, i = pair - bth * half;
        const int64_t bt = bth / heads;
        const int64_t cs = (per_row ? bt : bt % t) * half + i;
        const int64_t i1 = bth * 2 * half + i, i2 = i1 + half;
        const Vec16<T> c = load16(cos + cs), s0 = load16(sin + cs), a = load16(x + i1), b = load16(x + i2);
        Vec16<T> o1, o2;
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const T s = sign < 0 ? T(-s0.v[k]) : s0.v[k];
            o1.v[k] = a.v[k] * c.v[k] - b.v[k] * s;
            o2.v[k] = a.v[k] * s + b.v[k] * c.v[k];
        }
        store16(y + i1, o1);
        store16(y + i2, o2);
    }
}

#define ROPE_OPS(NAME, T)                                                                                    \
    extern "C" __global__ void rope_thd_##NAME(const T* x, const T* cos, const T* sin, T* y, int64_t pairs,   \
                                               int64_t half, int64_t heads, int64_t t, int per_row,           \
                                               int sign) {                                                    \
        rope_thd<T>(x, cos, sin, y, pairs, half, heads, t, per_row, sign);                                    \
    }

ROPE_OPS(f32, float)
ROPE_OPS(f16, __half)
ROPE_OPS(bf16, __nv_bfloat16)
