// The Adafactor step and the gradient norm for all LoRA parameters at once: one block per
// parameter, one launch per step instead of ~25 candle kernels per parameter (448 parameters for
// Mistral-7B with r=16 on all seven projections: the composed step was 0.14 s of a 0.67 s step).
// src/optim/adafactor.rs keeps the composed step as the CPU path and the tests' reference; the
// formulas and their rounding order follow it.
//
// A parameter is described by 6 u64: p, g, row, col, exp_avg (0: none), (n << 32) | m, for a
// row-major f32 [n, m] with factored second moment row [n] and col [m]. The smaller of n and m
// ("small") is at most MAX_SMALL: LoRA's A is [r, in] and B is [out, r].
#include <stdint.h>

#define THREADS 512
#include "block_reduce.cuh"
#include "dtype.cuh"
#define MAX_SMALL 1024

struct Param {
    float* p;
    const void* g;  // f32, f16 or bf16: the backward's dtype (its f32 widening is exact)
    float* row;
    float* col;
    float* exp_avg;
    int n, m;
};

__device__ Param load_param(const uint64_t* desc) {
    const uint64_t* d = desc + 6 * blockIdx.x;
    Param P;
    P.p = (float*)d[0];
    P.g = (const void*)d[1];
    P.row = (float*)d[2];
    P.col = (float*)d[3];
    P.exp_avg = (float*)d[4];
    P.n = (int)(d[5] >> 32);
    P.m = (int)(d[5] & 0xffffffffu);
    return P;
}

template <typename G>
__device__ __forceinline__ float grad_at(const Param& P, int64_t i) {
    return to_f32(static_cast<const G*>(P.g)[i]);
}

// out[b] = sum((g * inv_scale)^2) of parameter b's gradient (the unscaled squared norm).
template <typename G>
__device__ void grad_sumsq(const uint64_t* desc, float inv_scale, float* out) {
    const Param P = load_param(desc);
    const int64_t numel = (int64_t)P.n * P.m;
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < numel; i += THREADS) {
        const float g = grad_at<G>(P, i) * inv_scale;
        acc += g * g;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

struct Hyper {
    int hf;              // 1: transformers' Adafactor, 0: torch.optim.Adafactor
    float grad_mult;     // unscale and clip coefficient, applied to every gradient
    float w, one_minus_w;  // torch: lerp weight; hf: beta2t
    int lerp_low;        // torch: w < 0.5 (lerp's branch)
    float eps1, eps1_sq, eps2;
    float step_size;     // torch: rho; hf: the step size before parameter scaling
    int scale_parameter; // hf
    float inv_clip;
    int weight_decay_on;
    float decay;         // torch: 1 - lr * wd; hf: -wd
    int beta1_on;
    float beta1, one_minus_beta1;
};

// The running mean of g^2: hf's ema or torch's lerp.
__device__ __forceinline__ float second_moment(float avg, float x, const Hyper& h) {
    if (h.hf) return avg * h.w + x * h.one_minus_w;
    const float diff = x - avg;
    return h.lerp_low ? avg + diff * h.w : x - diff * h.one_minus_w;
}

// The normalized update of element (i, j) before clipping.
__device__ __forceinline__ float scaled_update(float g, float row, float col, float row_mean, const Hyper& h) {
    if (h.hf) return (1.0f / sqrtf(row / row_mean)) * (1.0f / sqrtf(col)) * g;
    const float var = row * col / row_mean;
    return (1.0f / sqrtf(fmaxf(var, h.eps1_sq))) * g;
}

// Pass 1: the row and col statistics of g^2 and sum(p^2). Threads walk the large dim; the small
// dim's sums are reduced per warp, then added in shared memory.
template <typename G>
__device__ float update_second_moment(const Param& P, const Hyper& h) {
    __shared__ float small_sums[MAX_SMALL];
    const bool rows_small = P.n <= P.m;
    const int S = rows_small ? P.n : P.m, L = rows_small ? P.m : P.n;
    for (int s = threadIdx.x; s < S; s += THREADS) small_sums[s] = 0.0f;
    __syncthreads();
    const float sq_eps = h.hf ? h.eps1 : 0.0f;
    float p_sq = 0.0f;
    for (int base = 0; base < L; base += THREADS) {
        const int l = base + threadIdx.x;
        const bool active = l < L;
        float large_sum = 0.0f;
        for (int s = 0; s < S; ++s) {
            float sq = 0.0f;
            if (active) {
                const int64_t idx = rows_small ? (int64_t)s * P.m + l : (int64_t)l * P.m + s;
                const float g = grad_at<G>(P, idx) * h.grad_mult, p = P.p[idx];
                sq = g * g + sq_eps;
                p_sq += p * p;
            }
            large_sum += sq;
            const float w = warp_sum(sq);
            if (threadIdx.x % 32 == 0) atomicAdd(&small_sums[s], w);
        }
        if (active) {
            float* stat = rows_small ? P.col : P.row;
            stat[l] = second_moment(stat[l], large_sum / S, h);
        }
    }
    __syncthreads();
    float* small_stat = rows_small ? P.row : P.col;
    for (int s = threadIdx.x; s < S; s += THREADS) small_stat[s] = second_moment(small_stat[s], small_sums[s] / L, h);
    __syncthreads();
    return block_sum(p_sq);
}

template <typename G>
__device__ void adafactor_step(const uint64_t* desc, const Hyper& h) {
    const Param P = load_param(desc);
    const int64_t numel = (int64_t)P.n * P.m;
    const float rms_p = sqrtf(update_second_moment<G>(P, h) / numel);
    float row_sum = 0.0f;
    for (int i = threadIdx.x; i < P.n; i += THREADS) row_sum += P.row[i];
    float row_mean = block_sum(row_sum) / P.n;
    if (!h.hf) row_mean = fmaxf(row_mean, h.eps1);

    // The host sends only parameters of fewer than 2^31 elements: int indexing from here on.
    float u_sq = 0.0f;
    for (int k = threadIdx.x; k < numel; k += THREADS) {
        const int i = k / P.m, j = k % P.m;
        const float u = scaled_update(grad_at<G>(P, k) * h.grad_mult, P.row[i], P.col[j], row_mean, h);
        u_sq += u * u;
    }
    const float denom = fmaxf(sqrtf(block_sum(u_sq) / numel) * h.inv_clip, 1.0f);

    // torch: p * (1 - lr wd) - u * (alpha / denom); hf: p + p * (-wd lr_t) - ema1(u / denom * lr_t).
    const float scaled_rms = fmaxf(h.eps2, rms_p) * h.step_size;
    const float lr_t = h.scale_parameter ? scaled_rms : h.step_size;
    const float torch_step = scaled_rms / denom;
    const float hf_decay = h.decay * lr_t;
    for (int k = threadIdx.x; k < numel; k += THREADS) {
        const int i = k / P.m, j = k % P.m;
        const float u = scaled_update(grad_at<G>(P, k) * h.grad_mult, P.row[i], P.col[j], row_mean, h);
        float p = P.p[k];
        if (h.hf) {
            float upd = u / denom * lr_t;
            if (h.beta1_on) {
                upd = P.exp_avg[k] * h.beta1 + upd * h.one_minus_beta1;
                P.exp_avg[k] = upd;
            }
            if (h.weight_decay_on) p = p + p * hf_decay;
            P.p[k] = p - upd;
        } else {
            if (h.weight_decay_on) p = p * h.decay;
            P.p[k] = p - u * torch_step;
        }
    }
}

#define FOR_GRAD_DTYPE(G, SUFFIX)                                                                \
    extern "C" __global__ void grad_sumsq_##SUFFIX(const uint64_t* desc, float inv_scale, float* out) { \
        grad_sumsq<G>(desc, inv_scale, out);                                                     \
    }                                                                                            \
    extern "C" __global__ void adafactor_step_##SUFFIX(const uint64_t* desc, Hyper h) {          \
        adafactor_step<G>(desc, h);                                                              \
    }
FOR_GRAD_DTYPE(float, f32)
FOR_GRAD_DTYPE(__half, f16)
FOR_GRAD_DTYPE(__nv_bfloat16, bf16)
