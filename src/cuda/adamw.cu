// torch.optim.AdamW's step for all LoRA parameters in one launch: one block per parameter.
// src/optim/adamw.rs keeps the composed step as the CPU path and the tests' reference; the
// formulas follow it (and torch's _single_tensor_adam): decoupled weight decay first, exp_avg by
// torch's lerp, exp_avg_sq += (1-beta2) g g, p -= step_size m / (sqrt(v) / sqrt(bc2) + eps).
// Compiled without fast math (IEEE sqrt and division, as torch).
//
// A parameter is described by 5 u64: p, g, exp_avg, exp_avg_sq (f32), numel.
#include <stdint.h>
#include "dtype.cuh"

#define THREADS 512

struct AdamwHyper {
    float grad_mult;  // unscale and clip coefficient
    float decay;      // 1 - lr wd
    int weight_decay_on;
    float w, one_minus_w;  // lerp weight 1 - beta1, and beta1
    int lerp_low;          // w < 0.5 (torch's lerp branch)
    float beta2, one_minus_beta2;
    float inv_bias_correction2_sqrt;
    float eps;
    float step_size;  // lr / (1 - beta1^t)
};

template <typename G>
__device__ void adamw_step(const uint64_t* desc, const AdamwHyper& h) {
    const uint64_t* d = desc + 5 * blockIdx.x;
    float* p = (float*)d[0];
    const G* g = (const G*)d[1];
    float* exp_avg = (float*)d[2];
    float* exp_avg_sq = (float*)d[3];
    const int64_t numel = (int64_t)d[4];
    for (int64_t k = threadIdx.x; k < numel; k += THREADS) {
        const float gk = to_f32(g[k]) * h.grad_mult;
        float pk = p[k];
        if (h.weight_decay_on) pk = pk * h.decay;
        const float m0 = exp_avg[k];
        const float diff = gk - m0;
        const float m = h.lerp_low ? m0 + diff * h.w : gk - diff * h.one_minus_w;
        const float v = exp_avg_sq[k] * h.beta2 + h.one_minus_beta2 * gk * gk;
        const float denom = sqrtf(v) * h.inv_bias_correction2_sqrt + h.eps;
        p[k] = pk - m / denom * h.step_size;
        exp_avg[k] = m;
        exp_avg_sq[k] = v;
    }
}

#define FOR_GRAD_DTYPE(G, SUFFIX)                                                          \
    extern "C" __global__ void adamw_step_##SUFFIX(const uint64_t* desc, AdamwHyper h) { \
        adamw_step<G>(desc, h);                                                           \
    }
FOR_GRAD_DTYPE(float, f32)
FOR_GRAD_DTYPE(__half, f16)
FOR_GRAD_DTYPE(__nv_bfloat16, bf16)
