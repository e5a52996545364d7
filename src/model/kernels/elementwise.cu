// Fused RMSNorm and SwiGLU, forward and backward: one pass over the rows instead of candle's
// six to ten elementwise kernels (each a full read and write of [tokens, hidden]). The rounding
// follows HF: RMSNorm normalises in f32, rounds to the compute dtype, then multiplies by the
// weight. src/model/ops.rs keeps the composed versions as the CPU path and the tests' reference.
#include <stdint.h>

#include "../../kernels/dtype.cuh"

#define THREADS 256
#include "../../kernels/block_reduce.cuh"

template <typename T>
__device__ __forceinline__ T round_to(float v) {
    T out;
    store(&out, v);
    return out;
}

// y = w * T(x * rsqrt(mean(x^2) + eps)); one block per row.
template <typename T>
__device__ void rms_norm(const T* x, const T* w, T* y, int cols, float eps) {
    const T* xr = x + (int64_t)blockIdx.x * cols;
    T* yr = y + (int64_t)blockIdx.x * cols;
    float sq = 0.0f;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        const float v = to_f32(xr[j]);
        sq += v * v;
    }
    const float inv_rms = rsqrtf(block_sum(sq) / cols + eps);
    for (int j = threadIdx.x; j < cols; j += THREADS)
        store(yr + j, to_f32(round_to<T>(to_f32(xr[j]) * inv_rms)) * to_f32(w[j]));
}

// dx = r g - x r^3 mean(g x) with g = T(dy * w) and r = rsqrt(mean(x^2) + eps), recomputed here
// from x (which the backward reads anyway) instead of kept from the forward.
template <typename T>
__device__ void rms_norm_backward(const T* x, const T* w, const T* dy, T* dx, int cols, float eps) {
    const int64_t off = (int64_t)blockIdx.x * cols;
    float sq = 0.0f, gx = 0.0f;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        const float xv = to_f32(x[off + j]);
        const float g = to_f32(round_to<T>(to_f32(dy[off + j]) * to_f32(w[j])));
        sq += xv * xv;
        gx += g * xv;
    }
    const float r = rsqrtf(block_sum(sq) / cols + eps);
    const float coef = r * r * r * block_sum(gx) / cols;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        const float g = to_f32(round_to<T>(to_f32(dy[off + j]) * to_f32(w[j])));
        store(dx + off + j, r * g - to_f32(x[off + j]) * coef);
    }
}

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// a = silu(g) * u
template <typename T>
__device__ void swiglu(const T* g, const T* u, T* a, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * THREADS) {
        const float gv = to_f32(g[i]);
        store(a + i, gv * sigmoid(gv) * to_f32(u[i]));
    }
}

// d_up = da silu(g); d_gate = da u sigma(g) (1 + g (1 - sigma(g))). Both written into one
// buffer: d_gate at [0, n), d_up at [n, 2n).
template <typename T>
__device__ void swiglu_backward(const T* g, const T* u, const T* da, T* d_gate_up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * THREADS) {
        const float gv = to_f32(g[i]), dav = to_f32(da[i]);
        const float sig = sigmoid(gv);
        store(d_gate_up + n + i, dav * gv * sig);
        store(d_gate_up + i, dav * to_f32(u[i]) * sig * (1.0f + gv * (1.0f - sig)));
    }
}

#define ELEMENTWISE_OPS(NAME, T)                                                                             \
    extern "C" __global__ void rms_norm_##NAME(const T* x, const T* w, T* y, int cols, float eps) {          \
        rms_norm<T>(x, w, y, cols, eps);                                                                     \
    }                                                                                                        \
    extern "C" __global__ void rms_norm_backward_##NAME(const T* x, const T* w, const T* dy, T* dx, int cols, \
                                                        float eps) {                                         \
        rms_norm_backward<T>(x, w, dy, dx, cols, eps);                                                       \
    }                                                                                                        \
    extern "C" __global__ void swiglu_##NAME(const T* g, const T* u, T* a, int64_t n) { swiglu<T>(g, u, a, n); } \
    extern "C" __global__ void swiglu_backward_##NAME(const T* g, const T* u, const T* da, T* d_gate_up,     \
                                                      int64_t n) {                                           \
        swiglu_backward<T>(g, u, da, d_gate_up, n);                                                          \
    }

ELEMENTWISE_OPS(f32, float)
ELEMENTWISE_OPS(f16, __half)
ELEMENTWISE_OPS(bf16, __nv_bfloat16)
