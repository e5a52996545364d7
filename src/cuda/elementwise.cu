// Fused RMSNorm and SwiGLU, forward and backward: one pass over the rows instead of candle's
// six to ten elementwise kernels (each a full read and write of [tokens, hidden]). The rounding
// follows HF: RMSNorm normalises in f32, rounds to the compute dtype, then multiplies by the
// weight. src/model/ops.rs keeps the composed versions as the CPU path and the tests' reference.
#include <stdint.h>

#include "dtype.cuh"

#define THREADS 256
#include "block_reduce.cuh"

template <typename T>
__device__ __forceinline__ T round_to(float v) {
    T out;
    store(&out, v);
    return out;
}

// y = w * T(x * rsqrt(mean(x^2) + eps)); one block per row, 16-byte loads where the row allows.
template <typename T>
__device__ void rms_norm(const T* x, const T* w, T* y, int cols, float eps) {
    constexpr int N = Vec16<T>::N;
    const T* xr = x + (int64_t)blockIdx.x * cols;
    T* yr = y + (int64_t)blockIdx.x * cols;
    const bool vec = cols % N == 0 && aligned16(xr, yr, w);
    float sq = 0.0f;
    if (vec) {
        for (int j = threadIdx.x * N; j < cols; j += THREADS * N) {
            const Vec16<T> xv = load16(xr + j);
#pragma unroll
            for (int k = 0; k < N; ++k) sq += to_f32(xv.v[k]) * to_f32(xv.v[k]);
        }
    } else {
        for (int j = threadIdx.x; j < cols; j += THREADS) sq += to_f32(xr[j]) * to_f32(xr[j]);
    }
    const float inv_rms = rsqrtf(block_sum(sq) / cols + eps);
    if (vec) {
        for (int j = threadIdx.x * N; j < cols; j += THREADS * N) {
            const Vec16<T> xv = load16(xr + j), wv = load16(w + j);
            Vec16<T> out;
#pragma unroll
            for (int k = 0; k < N; ++k)
                out.v[k] = round_to<T>(to_f32(round_to<T>(to_f32(xv.v[k]) * inv_rms)) * to_f32(wv.v[k]));
            store16(yr + j, out);
        }
    } else {
        for (int j = threadIdx.x; j < cols; j += THREADS)
            store(yr + j, to_f32(round_to<T>(to_f32(xr[j]) * inv_rms)) * to_f32(w[j]));
    }
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

__device__ __forceinline__ float silu_mul(float g, float u) { return g * sigmoid(g) * u; }

// Grid-stride over [from, n) one value at a time (the tails and unaligned tensors).
#define FOR_EACH_VALUE(i, from, n) \
    for (int64_t i = (from) + (int64_t)blockIdx.x * THREADS + threadIdx.x; i < (n); i += (int64_t)gridDim.x * THREADS)
// Grid-stride over the 16-byte vectors of [0, n).
#define FOR_EACH_VEC(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < (n) / N; i += (int64_t)gridDim.x * THREADS)

// a = silu(g) * u; 16-byte loads and stores where the tensors are aligned.
template <typename T>
__device__ void swiglu(const T* g, const T* u, T* a, int64_t n) {
    constexpr int N = Vec16<T>::N;
    const bool vec = aligned16(g, u, a);
    if (vec) {
        FOR_EACH_VEC(i, n) {
            const Vec16<T> gv = load16(g + i * N), uv = load16(u + i * N);
            Vec16<T> out;
#pragma unroll
            for (int k = 0; k < N; ++k) out.v[k] = round_to<T>(silu_mul(to_f32(gv.v[k]), to_f32(uv.v[k])));
            store16(a + i * N, out);
        }
    }
    FOR_EACH_VALUE(i, vec ? n / N * N : 0, n) store(a + i, silu_mul(to_f32(g[i]), to_f32(u[i])));
}

// d_up = da silu(g); d_gate = da u sigma(g) (1 + g (1 - sigma(g))).
__device__ __forceinline__ void swiglu_grads(float g, float u, float da, float& d_gate, float& d_up) {
    const float sig = sigmoid(g);
    d_up = da * g * sig;
    d_gate = da * u * sig * (1.0f + g * (1.0f - sig));
}

// Both gradients into one buffer: d_gate at [0, n), d_up at [n, 2n).
template <typename T>
__device__ void swiglu_backward(const T* g, const T* u, const T* da, T* d_gate_up, int64_t n) {
    constexpr int N = Vec16<T>::N;
    T* d_up = d_gate_up + n;
    const bool vec = aligned16(g, u, da, d_gate_up) && aligned16(d_up, d_up, d_up);
    float dg, du;
    if (vec) {
        FOR_EACH_VEC(i, n) {
            const Vec16<T> gv = load16(g + i * N), uv = load16(u + i * N), dav = load16(da + i * N);
            Vec16<T> dgv, duv;
#pragma unroll
            for (int k = 0; k < N; ++k) {
                swiglu_grads(to_f32(gv.v[k]), to_f32(uv.v[k]), to_f32(dav.v[k]), dg, du);
                dgv.v[k] = round_to<T>(dg);
                duv.v[k] = round_to<T>(du);
            }
            store16(d_gate_up + i * N, dgv);
            store16(d_up + i * N, duv);
        }
    }
    FOR_EACH_VALUE(i, vec ? n / N * N : 0, n) {
        swiglu_grads(to_f32(g[i]), to_f32(u[i]), to_f32(da[i]), dg, du);
        store(d_gate_up + i, dg);
        store(d_up + i, du);
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
