// Fused RMSNorm and SwiGLU, forward and backward: one pass over the rows instead of candle's
// six to ten elementwise kernels (each a full read and write of [tokens, hidden]). The rounding
// follows HF: RMSNorm normalises in f32, rounds to the compute dtype, then multiplies by the
// weight. src/model/ops/norm.rs and src/model/ops/mlp.rs keep the composed versions as the CPU
// path and the tests' reference.
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
// from x (which the backward reads anyway) instead of kept from the forward. With `res` (may be
// null), dx = res + T(that): the residual branch's gradient added in the same pass, rounded as
// the separate add it replaces (candle's, on the rounded norm gradient) would round it.
template <typename T>
__device__ __forceinline__ float norm_grad_out(float nd, const T* res, int64_t i) {
    return res ? to_f32(res[i]) + to_f32(round_to<T>(nd)) : nd;
}

template <typename T>
__device__ void rms_norm_backward(const T* x, const T* w, const T* dy, const T* res, T* dx, int cols, float eps) {
    constexpr int N = Vec16<T>::N;
    const int64_t off = (int64_t)blockIdx.x * cols;
    const bool vec = cols % N == 0 && aligned16(x + off, dy + off, dx + off, w) &&
                     (!res || (reinterpret_cast<uintptr_t>(res + off) & 15) == 0);
    float sq = 0.0f, gx = 0.0f;
    if (vec) {
        for (int j = threadIdx.x * N; j < cols; j += THREADS * N) {
            const Vec16<T> xv = load16(x + off + j), dv = load16(dy + off + j), wv = load16(w + j);
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const float xk = to_f32(xv.v[k]);
                const float g = to_f32(round_to<T>(to_f32(dv.v[k]) * to_f32(wv.v[k])));
                sq += xk * xk;
                gx += g * xk;
            }
        }
    } else {
        for (int j = threadIdx.x; j < cols; j += THREADS) {
            const float xv = to_f32(x[off + j]);
            const float g = to_f32(round_to<T>(to_f32(dy[off + j]) * to_f32(w[j])));
            sq += xv * xv;
            gx += g * xv;
        }
    }
    const float r = rsqrtf(block_sum(sq) / cols + eps);
    const float coef = r * r * r * block_sum(gx) / cols;
    if (vec) {
        for (int j = threadIdx.x * N; j < cols; j += THREADS * N) {
            const Vec16<T> xv = load16(x + off + j), dv = load16(dy + off + j), wv = load16(w + j);
            Vec16<T> rv;
            if (res) rv = load16(res + off + j);
            Vec16<T> out;
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const float g = to_f32(round_to<T>(to_f32(dv.v[k]) * to_f32(wv.v[k])));
                const float nd = r * g - to_f32(xv.v[k]) * coef;
                out.v[k] = round_to<T>(res ? to_f32(rv.v[k]) + to_f32(round_to<T>(nd)) : nd);
            }
            store16(dx + off + j, out);
        }
    } else {
        for (int j = threadIdx.x; j < cols; j += THREADS) {
            const float g = to_f32(round_to<T>(to_f32(dy[off + j]) * to_f32(w[j])));
            store(dx + off + j, norm_grad_out(r * g - to_f32(x[off + j]) * coef, res, off + j));
        }
    }
}

// The same two kernels for short rows (Qwen3's and Gemma 3's per-head q/k norms: 128 values):
// `group` lanes per row (a power of two up to 32, so that a row's lanes share a warp), many rows
// per block. A block per row would leave most of its threads idle and pay two block-wide
// reductions per 256 bytes. The sums run in another order than the block kernels' (same rounding
// of the results).
__device__ __forceinline__ float group_sum(float v, int group) {
    for (int off = group / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    return v;
}

template <typename T>
__device__ void rms_norm_short(const T* x, const T* w, T* y, int64_t rows, int cols, int group, float eps) {
    constexpr int N = Vec16<T>::N;
    const int64_t row = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / group;
    const int lane = threadIdx.x % group;
    const bool live = row < rows;  // every lane stays for the shuffles
    const T* xr = x + (live ? row : 0) * cols;
    T* yr = y + (live ? row : 0) * cols;
    const bool vec = cols % N == 0 && aligned16(xr, yr, w);
    float sq = 0.0f;
    if (live && vec) {
        for (int j = lane * N; j < cols; j += group * N) {
            const Vec16<T> xv = load16(xr + j);
#pragma unroll
            for (int k = 0; k < N; ++k) sq += to_f32(xv.v[k]) * to_f32(xv.v[k]);
        }
    } else if (live) {
        for (int j = lane; j < cols; j += group) sq += to_f32(xr[j]) * to_f32(xr[j]);
    }
    const float inv_rms = rsqrtf(group_sum(sq, group) / cols + eps);
    if (!live) return;
    if (vec) {
        for (int j = lane * N; j < cols; j += group * N) {
            const Vec16<T> xv = load16(xr + j), wv = load16(w + j);
            Vec16<T> out;
#pragma unroll
            for (int k = 0; k < N; ++k)
                out.v[k] = round_to<T>(to_f32(round_to<T>(to_f32(xv.v[k]) * inv_rms)) * to_f32(wv.v[k]));
            store16(yr + j, out);
        }
    } else {
        for (int j = lane; j < cols; j += group) store(yr + j, to_f32(round_to<T>(to_f32(xr[j]) * inv_rms)) * to_f32(w[j]));
    }
}

template <typename T>
__device__ void rms_norm_backward_short(const T* x, const T* w, const T* dy, const T* res, T* dx, int64_t rows,
                                        int cols, int group, float eps) {
    const int64_t row = ((int64_t)blockIdx.x * THREADS + threadIdx.x) / group;
    const int lane = threadIdx.x % group;
    const bool live = row < rows;
    const int64_t off = (live ? row : 0) * cols;
    float sq = 0.0f, gx = 0.0f;
    if (live) {
        for (int j = lane; j < cols; j += group) {
            const float xv = to_f32(x[off + j]);
            const float g = to_f32(round_to<T>(to_f32(dy[off + j]) * to_f32(w[j])));
            sq += xv * xv;
            gx += g * xv;
        }
    }
    const float r = rsqrtf(group_sum(sq, group) / cols + eps);
    const float coef = r * r * r * group_sum(gx, group) / cols;
    if (!live) return;
    for (int j = lane; j < cols; j += group) {
        const float g = to_f32(round_to<T>(to_f32(dy[off + j]) * to_f32(w[j])));
        store(dx + off + j, norm_grad_out(r * g - to_f32(x[off + j]) * coef, res, off + j));
    }
}

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// The gate activations: 0 silu (SwiGLU), 1 gelu with the tanh approximation (GeGLU, Gemma's
// gelu_pytorch_tanh: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))).
#define GELU_K0 0.7978845608028654f
#define GELU_K1 0.044715f
__device__ __forceinline__ float gate_act(float g, int gelu) {
    if (gelu) return 0.5f * g * (1.0f + tanhf(GELU_K0 * (g + GELU_K1 * g * g * g)));
    return g * sigmoid(g);
}
// d act / d g.
__device__ __forceinline__ float gate_act_grad(float g, int gelu) {
    if (gelu) {
        const float th = tanhf(GELU_K0 * (g + GELU_K1 * g * g * g));
        return 0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * g * g);
    }
    const float sig = sigmoid(g);
    return sig * (1.0f + g * (1.0f - sig));
}
__device__ __forceinline__ float act_mul(float g, float u, int gelu) { return gate_act(g, gelu) * u; }

// Grid-stride over [from, n) one value at a time (the tails and unaligned tensors).
#define FOR_EACH_VALUE(i, from, n) \
    for (int64_t i = (from) + (int64_t)blockIdx.x * THREADS + threadIdx.x; i < (n); i += (int64_t)gridDim.x * THREADS)
// Grid-stride over the 16-byte vectors of [0, n).
#define FOR_EACH_VEC(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < (n) / N; i += (int64_t)gridDim.x * THREADS)

// a = act(g) * u; 16-byte loads and stores where the tensors are aligned.
template <typename T>
__device__ void gated(const T* g, const T* u, T* a, int64_t n, int gelu) {
    constexpr int N = Vec16<T>::N;
    const bool vec = aligned16(g, u, a);
    if (vec) {
        FOR_EACH_VEC(i, n) {
            const Vec16<T> gv = load16(g + i * N), uv = load16(u + i * N);
            Vec16<T> out;
#pragma unroll
            for (int k = 0; k < N; ++k) out.v[k] = round_to<T>(act_mul(to_f32(gv.v[k]), to_f32(uv.v[k]), gelu));
            store16(a + i * N, out);
        }
    }
    FOR_EACH_VALUE(i, vec ? n / N * N : 0, n) store(a + i, act_mul(to_f32(g[i]), to_f32(u[i]), gelu));
}

// d_up = da act(g); d_gate = da u act'(g); a = act(g) u, as `gated` rounds it.
__device__ __forceinline__ void gated_grads(float g, float u, float da, int gelu, float& d_gate, float& d_up,
                                            float& a) {
    const float ga = gate_act(g, gelu);
    d_up = da * ga;
    d_gate = da * u * gate_act_grad(g, gelu);
    a = ga * u;
}

// Both gradients into one buffer: d_gate at [0, n), d_up at [n, 2n). With ACT, the activation
// a = act(g) u too, written over da where each value was read (the backward needs a after da
// for the down projection's A gradient, and this pass reads g and u anyway).
template <typename T, bool ACT>
__device__ void gated_backward(const T* g, const T* u, T* da, T* d_gate_up, int64_t n, int gelu) {
    constexpr int N = Vec16<T>::N;
    T* d_up = d_gate_up + n;
    const bool vec = aligned16(g, u, da, d_gate_up) && aligned16(d_up, d_up, d_up);
    float dg, du, a;
    if (vec) {
        FOR_EACH_VEC(i, n) {
            const Vec16<T> gv = load16(g + i * N), uv = load16(u + i * N), dav = load16(da + i * N);
            Vec16<T> dgv, duv, av;
#pragma unroll
            for (int k = 0; k < N; ++k) {
                gated_grads(to_f32(gv.v[k]), to_f32(uv.v[k]), to_f32(dav.v[k]), gelu, dg, du, a);
                dgv.v[k] = round_to<T>(dg);
                duv.v[k] = round_to<T>(du);
                av.v[k] = round_to<T>(a);
            }
            store16(d_gate_up + i * N, dgv);
            store16(d_up + i * N, duv);
            if (ACT) store16(da + i * N, av);
        }
    }
    FOR_EACH_VALUE(i, vec ? n / N * N : 0, n) {
        gated_grads(to_f32(g[i]), to_f32(u[i]), to_f32(da[i]), gelu, dg, du, a);
        store(d_gate_up + i, dg);
        store(d_up + i, du);
        if (ACT) store(da + i, a);
    }
}

#define ELEMENTWISE_OPS(NAME, T)                                                                             \
    extern "C" __global__ void rms_norm_##NAME(const T* x, const T* w, T* y, int cols, float eps) {          \
        rms_norm<T>(x, w, y, cols, eps);                                                                     \
    }                                                                                                        \
    extern "C" __global__ void rms_norm_backward_##NAME(const T* x, const T* w, const T* dy, const T* res,     \
                                                        T* dx, int cols, float eps) {                        \
        rms_norm_backward<T>(x, w, dy, res, dx, cols, eps);                                                  \
    }                                                                                                        \
    extern "C" __global__ void rms_norm_short_##NAME(const T* x, const T* w, T* y, int64_t rows, int cols,    \
                                                     int group, float eps) {                                 \
        rms_norm_short<T>(x, w, y, rows, cols, group, eps);                                                  \
    }                                                                                                        \
    extern "C" __global__ void rms_norm_backward_short_##NAME(const T* x, const T* w, const T* dy,           \
                                                              const T* res, T* dx, int64_t rows, int cols,   \
                                                              int group, float eps) {                        \
        rms_norm_backward_short<T>(x, w, dy, res, dx, rows, cols, group, eps);                               \
    }                                                                                                        \
    extern "C" __global__ void gated_##NAME(const T* g, const T* u, T* a, int64_t n, int gelu) {             \
        gated<T>(g, u, a, n, gelu);                                                                          \
    }                                                                                                        \
    extern "C" __global__ void gated_backward_##NAME(const T* g, const T* u, const T* da, T* d_gate_up,      \
                                                     int64_t n, int gelu) {                                  \
        gated_backward<T, false>(g, u, const_cast<T*>(da), d_gate_up, n, gelu);                              \
    }                                                                                                        \
    extern "C" __global__ void gated_backward_act_##NAME(const T* g, const T* u, T* da_then_a, T* d_gate_up,  \
                                                         int64_t n, int gelu) {                              \
        gated_backward<T, true>(g, u, da_then_a, d_gate_up, n, gelu);                                        \
    }

ELEMENTWISE_OPS(f32, float)
ELEMENTWISE_OPS(f16, __half)
ELEMENTWISE_OPS(bf16, __nv_bfloat16)
