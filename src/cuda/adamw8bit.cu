// bitsandbytes' 8-bit blockwise AdamW (bnb.optim.AdamW8bit) for all LoRA parameters in one
// launch: one block of 256 threads per parameter, walking its quantization blocks of 256
// elements (thread t takes element t of each). Parameters below min_8bit_size keep f32 moments
// and take bitsandbytes' 32-bit Adam step. Our own kernel doing the arithmetic of bitsandbytes
// 0.50.2's kOptimizerStatic8bit2StateBlockwise and kOptimizer32bit2State ("adam", gnorm_scale
// = our grad_mult, no max_unorm), written in the same expressions so that nvcc contracts and
// approximates them the same way; compiled, like bitsandbytes, with --use_fast_math (build.rs).
// src/optim/blockwise8.rs is the CPU reference and says what each step does and why.
//
// A parameter is described by 7 u64: p, g, state1, state2 (u8 codes, or f32 moments), absmax1,
// absmax2 (0 for f32 moments), numel.
#include <float.h>
#include <stdint.h>
#include "dtype.cuh"

#define BLOCK 256

struct Adam8Hyper {
    float beta1, beta2, eps, lr, weight_decay, grad_mult;
    int step;
};

// The code of x in the sorted map `code`: seven halvings from 127, then the nearer neighbour
// (bitsandbytes' quantize_2D; its quadrant lookup is code[pivot]).
__device__ __forceinline__ unsigned char quantize(const float* code, bool is_signed, float x) {
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = is_signed ? -1.0f : 0.0f, upper = 1.0f;
    float val = code[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = code[pivot];
    }
    if (x > val) {
        const float midpoint = (upper + val) * 0.5f;
        return x > midpoint ? upper_pivot : pivot;
    }
    const float midpoint = (lower + val) * 0.5f;
    return x < midpoint ? lower_pivot : pivot;
}

__device__ __forceinline__ float block_max256(float v, float* scratch) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, off));
    __syncthreads();
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    float m = scratch[0];
    for (int w = 1; w < BLOCK / 32; ++w) m = fmaxf(m, scratch[w]);
    return m;
}

template <typename G>
__device__ void step_8bit(const uint64_t* d, const float* qmap1, const float* qmap2, const Adam8Hyper& h) {
    float* p = (float*)d[0];
    const G* g = (const G*)d[1];
    unsigned char* state1 = (unsigned char*)d[2];
    unsigned char* state2 = (unsigned char*)d[3];
    float* absmax1 = (float*)d[4];
    float* absmax2 = (float*)d[5];
    const int n = (int)d[6];
    __shared__ float scratch1[BLOCK / 32], scratch2[BLOCK / 32];
    const float beta1 = h.beta1, beta2 = h.beta2, eps = h.eps, lr = h.lr, weight_decay = h.weight_decay;
    const int step = h.step;
    const float correction1 = 1.0f - __powf(beta1, step);
    const float correction2 = sqrtf(1.0f - __powf(beta2, step));
    const float step_size = __fdividef(-lr * correction2, correction1);
    for (int base = 0; base < n; base += BLOCK) {
        const int i = base + threadIdx.x, b = base / BLOCK;
        const bool valid = i < n;
        // past the end: bitsandbytes' padded loads (gradient 0, codes 128 and 0)
        const float g_raw = valid ? to_f32(g[i]) : 0.0f;
        const unsigned char c1 = valid ? state1[i] : 128, c2 = valid ? state2[i] : 0;
        float s1 = 0.0f, s2 = 0.0f;
        if (!isnan(g_raw) && !isinf(g_raw)) {
            float g_val = g_raw;
            g_val *= h.grad_mult;
            s2 = qmap2[c2] * absmax2[b];
            s2 = (s2 * beta2) + (((1.0f - beta2) * g_val * g_val));
            s1 = qmap1[c1] * absmax1[b];
            s1 = (s1 * beta1) + (((1.0f - beta1) * g_val));
        }
        const float max1 = block_max256(fmaxf(-FLT_MAX, fabsf(s1)), scratch1);
        const float max2 = block_max256(fmaxf(-FLT_MAX, fabsf(s2)), scratch2);
        __syncthreads();  // every thread has read the old absmax
        if (threadIdx.x == 0) {
            absmax1[b] = max1;
            absmax2[b] = max2;
        }
        if (!valid) continue;
        if (!isnan(g_raw) && !isinf(g_raw)) {
            float pk = p[i];
            pk = pk + (step_size * (__fdividef(s1, (sqrtf(s2) + (correction2 * eps)))));
            if (weight_decay > 0.0f) pk = pk * (1.0f - (lr * weight_decay));
            p[i] = pk;
        }
        unsigned char q1 = quantize(qmap1, true, __fdividef(s1, max1));
        const unsigned char q2 = quantize(qmap2, false, __fdividef(s2, max2));
        // the first moment keeps its sign through quantization
        if (signbit(qmap1[q1]) != signbit(s1)) {
            if (s1 > 0.0f)
                q1 += 1;
            else
                q1 -= 1;
        }
        state1[i] = q1;
        state2[i] = q2;
    }
}

template <typename G>
__device__ void step_32bit(const uint64_t* d, const Adam8Hyper& h) {
    float* p = (float*)d[0];
    const G* g = (const G*)d[1];
    float* state1 = (float*)d[2];
    float* state2 = (float*)d[3];
    const int n = (int)d[6];
    const float beta1 = h.beta1, beta2 = h.beta2, eps = h.eps, lr = h.lr, weight_decay = h.weight_decay;
    const int step = h.step;
    const float correction1 = 1.0f - powf(beta1, step);
    const float correction2 = sqrtf(1.0f - powf(beta2, step));
    const float step_size = -lr * correction2 / correction1;
    const float update_scale = 1.0f;
    for (int i = threadIdx.x; i < n; i += BLOCK) {
        const float g_val = h.grad_mult * to_f32(g[i]);
        float s1 = state1[i], s2 = state2[i];
        s1 = s1 * beta1 + ((1.0f - beta1) * (g_val));
        s2 = s2 * beta2 + ((1.0f - beta2) * ((g_val) * (g_val)));
        float pk = p[i];
        pk = pk + (update_scale * step_size * (s1 / (sqrtf(s2) + (eps * correction2))));
        if (weight_decay > 0.0f) pk = pk * (1.0f - (lr * weight_decay));
        p[i] = pk;
        state1[i] = s1;
        state2[i] = s2;
    }
}

// qmaps: the signed map (256 f32) followed by the unsigned one.
template <typename G>
__device__ void adamw8bit_step(const uint64_t* desc, const float* qmaps, const Adam8Hyper& h) {
    __shared__ float qmap1[256], qmap2[256];
    qmap1[threadIdx.x] = qmaps[threadIdx.x];
    qmap2[threadIdx.x] = qmaps[256 + threadIdx.x];
    __syncthreads();
    const uint64_t* d = desc + 7 * blockIdx.x;
    if (d[4] != 0)
        step_8bit<G>(d, qmap1, qmap2, h);
    else
        step_32bit<G>(d, h);
}

#define FOR_GRAD_DTYPE(G, SUFFIX)                                                                           \
    extern "C" __global__ void adamw8bit_step_##SUFFIX(const uint64_t* desc, const float* qmaps, Adam8Hyper h) { \
        adamw8bit_step<G>(desc, qmaps, h);                                                                   \
    }
FOR_GRAD_DTYPE(float, f32)
FOR_GRAD_DTYPE(__half, f16)
FOR_GRAD_DTYPE(__nv_bfloat16, bf16)
