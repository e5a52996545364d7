// Cross-entropy of rows of logits fused with its gradient: one block per row reads the row (the
// lm_head GEMM's output in the compute dtype) three times from cache — max, sum of exp, then
// softmax − one-hot — in f32, as transformers does after `logits.float()`. The composed version
// (src/model/ops/loss.rs) made five to seven f32 copies of the [rows, vocab] chunk; this writes one
// gradient in the compute dtype and one loss per row, so the loss is read back once per step.
#include <stdint.h>

#include "dtype.cuh"

#define THREADS 512
#include "block_reduce.cuh"

// Gemma 2's soft cap on the final logits: cap == 0 none; else cap * tanh(x * inv_cap) in f32,
// rounded to the compute dtype, as src/model/ops/softcap.rs's composed ops round it (candle's
// affine is x * mul + add, its tanh tanhf), so the capped logits are those ops' bits.
struct SoftCap {
    float inv_cap, cap;
};

template <typename T>
__device__ __forceinline__ float capped(T raw, SoftCap c) {
    if (c.cap == 0.0f) return to_f32(raw);
    T out;
    // __fmul_rn: each product rounded on its own, never fused into the next addition (in f32
    // the store does not round, and z - m would otherwise become one fma)
    store(&out, __fmul_rn(tanhf(__fmul_rn(to_f32(raw), c.inv_cap)), c.cap));
    return to_f32(out);
}

// loss[r] = logsumexp(z[r]) - z[r][target[r]], z the (capped) logits; with d_logits != null also
// d_logits[r] = grad_scale * (softmax(z[r]) - onehot(target[r])), through the cap's chain rule
// (1 - tanh^2, in f32 on the gradient rounded to the compute dtype first, as the composed ops).
template <typename T>
__device__ void cross_entropy_rows(const T* logits, const uint32_t* targets, float* loss, T* d_logits, int vocab,
                                   float grad_scale, SoftCap c) {
    const long long offset = (long long)blockIdx.x * vocab;
    const T* x = logits + offset;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < vocab; j += THREADS) m = fmaxf(m, capped(x[j], c));
    m = block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < vocab; j += THREADS) s += expf(capped(x[j], c) - m);
    s = block_sum(s);
    const uint32_t t = targets[blockIdx.x];
    if (threadIdx.x == 0) loss[blockIdx.x] = m + logf(s) - capped(x[t], c);
    if (d_logits == nullptr) return;
    T* d = d_logits + offset;
    const float inv_s = 1.0f / s;
    for (int j = threadIdx.x; j < vocab; j += THREADS) {
        const float p = expf(capped(x[j], c) - m) * inv_s - (j == (int)t ? 1.0f : 0.0f);
        if (c.cap == 0.0f) {
            store(d + j, p * grad_scale);
        } else {
            T g;
            store(&g, p * grad_scale);
            const float th = tanhf(__fmul_rn(to_f32(x[j]), c.inv_cap));
            store(d + j, to_f32(g) * fmaf(__fmul_rn(th, th), -1.0f, 1.0f));  // no contraction: t² rounded
        }
    }
}

#define CROSS_ENTROPY(NAME, T)                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS) cross_entropy_rows_##NAME(                          \
        const T* logits, const uint32_t* targets, float* loss, T* d_logits, int vocab, float grad_scale,     \
        SoftCap c) {                                                                                            \
        cross_entropy_rows<T>(logits, targets, loss, d_logits, vocab, grad_scale, c);                          \
    }

CROSS_ENTROPY(f32, float)
CROSS_ENTROPY(f16, __half)
CROSS_ENTROPY(bf16, __nv_bfloat16)

// The same loss with lm_head streamed in vocab chunks (src/model/ops/lm_head.rs): an online
// log-sum-exp over the chunks, as FlashAttention does over keys. Per row, m is the running max
// and s the running sum of exp(logit - m); the chunk's logits become exp(logit - m_new) in place
// (the weights of the chunk's rows of lm_head in the gradient), and alpha = exp(m_old - m_new)
// rescales what was summed before. `target_logit` reads the target's logit out of its chunk
// first, before the exp overwrites it.
template <typename T>
__device__ void online_softmax_chunk(T* logits, float* m, float* s, float* alpha, int chunk, int write_exp) {
    const int r = blockIdx.x;
    T* x = logits + (long long)r * chunk;
    float cm = -INFINITY;
    for (int j = threadIdx.x; j < chunk; j += THREADS) cm = fmaxf(cm, to_f32(x[j]));
    cm = block_max(cm);
    const float m_old = m[r], m_new = fmaxf(m_old, cm);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < chunk; j += THREADS) {
        const float e = expf(to_f32(x[j]) - m_new);
        sum += e;
        if (write_exp) store(x + j, e);
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        const float a = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        s[r] = s[r] * a + sum;
        m[r] = m_new;
        alpha[r] = a;
    }
}

// z_target[r] = the row's target logit, when the target falls in this chunk; one thread per row.
template <typename T>
__device__ void target_logit(const T* logits, const uint32_t* targets, float* z_target, int vocab_start, int chunk,
                             int rows) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const int t = (int)targets[r] - vocab_start;
    if (t >= 0 && t < chunk) z_target[r] = to_f32(logits[(long long)r * chunk + t]);
}

// acc[r, :] = acc[r, :] * alpha[r] + part[r, :] (f32 accumulator, part in the compute dtype).
template <typename T>
__device__ void rescale_add(float* acc, const T* part, const float* alpha, long long n, int cols) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        acc[i] = acc[i] * alpha[i / cols] + to_f32(part[i]);
}

// d_hidden[r, :] = grad_scale * (acc[r, :] / s[r] - w_target[r, :]); loss[r] = m + log s - z_target.
template <typename T>
__device__ void streamed_finish(const float* acc, const T* w_target, const float* s, T* d_hidden, long long n, int cols, float grad_scale) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        store(d_hidden + i, grad_scale * (acc[i] / s[i / cols] - to_f32(w_target[i])));
}

extern "C" __global__ void streamed_loss(const float* m, const float* s, const float* z_target, float* loss, int rows) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) loss[r] = m[r] + logf(s[r]) - z_target[r];
}

#define STREAMED(NAME, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS) online_softmax_chunk_##NAME(                          \
        T* logits, float* m, float* s, float* alpha, int chunk, int write_exp) {                                 \
        online_softmax_chunk<T>(logits, m, s, alpha, chunk, write_exp);                                          \
    }                                                                                                            \
    extern "C" __global__ void target_logit_##NAME(const T* logits, const uint32_t* targets, float* z_target,    \
                                                   int vocab_start, int chunk, int rows) {                       \
        target_logit<T>(logits, targets, z_target, vocab_start, chunk, rows);                                    \
    }                                                                                                            \
    extern "C" __global__ void rescale_add_##NAME(float* acc, const T* part, const float* alpha, long long n,     \
                                                  int cols) {                                                    \
        rescale_add<T>(acc, part, alpha, n, cols);                                                               \
    }                                                                                                            \
    extern "C" __global__ void streamed_finish_##NAME(const float* acc, const T* w_target, const float* s,       \
                                                      T* d_hidden, long long n, int cols, float grad_scale) {    \
        streamed_finish<T>(acc, w_target, s, d_hidden, n, cols, grad_scale);                            \
    }

STREAMED(f32, float)
STREAMED(f16, __half)
STREAMED(bf16, __nv_bfloat16)
