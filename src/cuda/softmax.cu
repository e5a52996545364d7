// Row-wise attention softmax kernels for one query chunk, scores `[rows, cols]` (rows = b·h·len):
// the causal / sliding-window mask is computed from indices instead of read from a tensor, the
// softmax is taken in f32 and written once in the compute dtype, and the backward
// dS = P ⊙ (dP − rowsum(P ⊙ dP)) is one pass. They replace six to eight full passes over the
// scores with candle's elementwise kernels (src/model/ops/attention/composed.rs keeps that composed version as
// the reference and the CPU path).
#include <stdint.h>

#include "dtype.cuh"

#define THREADS 256


template <bool MAX>
__device__ float block_reduce(float v) {
    __shared__ float warp_vals[THREADS / 32];
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_xor_sync(0xffffffff, v, off);
        v = MAX ? fmaxf(v, o) : v + o;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // warp_vals may still be read by a previous reduction
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? warp_vals[lane] : (MAX ? -INFINITY : 0.0f);
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_xor_sync(0xffffffff, v, off);
        v = MAX ? fmaxf(v, o) : v + o;
    }
    return v;
}

// Query row i of a chunk sits at position q_pos0 + i and sees key j when j <= pos and, with a
// window w > 0, pos - j < w (HF Mistral's rule).
template <typename T>
__device__ void causal_softmax(const T* scores, T* probs, int64_t rows, int cols, int len, int q_pos0, int window) {
    const int64_t row = blockIdx.x;
    if (row >= rows) return;
    const int pos = q_pos0 + (int)(row % len);
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    const int hi = min(cols - 1, pos);  // visible keys: lo..=hi
    const T* x = scores + row * cols;
    T* y = probs + row * cols;
    float m = -INFINITY;
    for (int j = lo + threadIdx.x; j <= hi; j += THREADS) m = fmaxf(m, to_f32(x[j]));
    m = block_reduce<true>(m);
    float sum = 0.0f;
    for (int j = lo + threadIdx.x; j <= hi; j += THREADS) sum += expf(to_f32(x[j]) - m);
    const float inv = 1.0f / block_reduce<false>(sum);
    for (int j = threadIdx.x; j < cols; j += THREADS)
        store(y + j, (j >= lo && j <= hi) ? expf(to_f32(x[j]) - m) * inv : 0.0f);
}

template <typename T>
__device__ void softmax_backward(const T* p, const T* dp, T* ds, int64_t rows, int cols) {
    const int64_t row = blockIdx.x;
    if (row >= rows) return;
    const T* pr = p + row * cols;
    const T* dpr = dp + row * cols;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < cols; j += THREADS) dot += to_f32(pr[j]) * to_f32(dpr[j]);
    dot = block_reduce<false>(dot);
    for (int j = threadIdx.x; j < cols; j += THREADS)
        store(ds + row * cols + j, to_f32(pr[j]) * (to_f32(dpr[j]) - dot));
}

#define SOFTMAX_OPS(NAME, T)                                                                              \
    extern "C" __global__ void causal_softmax_##NAME(const T* scores, T* probs, int64_t rows, int cols,  \
                                                      int len, int q_pos0, int window) {                 \
        causal_softmax<T>(scores, probs, rows, cols, len, q_pos0, window);                               \
    }                                                                                                    \
    extern "C" __global__ void softmax_backward_##NAME(const T* p, const T* dp, T* ds, int64_t rows,     \
                                                        int cols) {                                      \
        softmax_backward<T>(p, dp, ds, rows, cols);                                                      \
    }

SOFTMAX_OPS(f32, float)
SOFTMAX_OPS(f16, __half)
SOFTMAX_OPS(bf16, __nv_bfloat16)
