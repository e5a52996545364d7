// Cross-entropy of rows of logits fused with its gradient: one block per row reads the row (the
// lm_head GEMM's output in the compute dtype) three times from cache — max, sum of exp, then
// softmax − one-hot — in f32, as transformers does after `logits.float()`. The composed version
// (src/model/loss.rs) made five to seven f32 copies of the [rows, vocab] chunk; this writes one
// gradient in the compute dtype and one loss per row, so the loss is read back once per step.
#include <stdint.h>

#include "../../kernels/dtype.cuh"

#define THREADS 512
#include "../../kernels/block_reduce.cuh"

// loss[r] = logsumexp(logits[r]) - logits[r][target[r]]; with d_logits != null also
// d_logits[r] = grad_scale * (softmax(logits[r]) - onehot(target[r])).
template <typename T>
__device__ void cross_entropy_rows(const T* logits, const uint32_t* targets, float* loss, T* d_logits, int vocab,
                                   float grad_scale) {
    const long long offset = (long long)blockIdx.x * vocab;
    const T* x = logits + offset;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < vocab; j += THREADS) m = fmaxf(m, to_f32(x[j]));
    m = block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < vocab; j += THREADS) s += expf(to_f32(x[j]) - m);
    s = block_sum(s);
    const uint32_t t = targets[blockIdx.x];
    if (threadIdx.x == 0) loss[blockIdx.x] = m + logf(s) - to_f32(x[t]);
    if (d_logits == nullptr) return;
    T* d = d_logits + offset;
    const float inv_s = 1.0f / s;
    for (int j = threadIdx.x; j < vocab; j += THREADS) {
        const float p = expf(to_f32(x[j]) - m) * inv_s - (j == (int)t ? 1.0f : 0.0f);
        store(d + j, p * grad_scale);
    }
}

#define CROSS_ENTROPY(NAME, T)                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS) cross_entropy_rows_##NAME(                          \
        const T* logits, const uint32_t* targets, float* loss, T* d_logits, int vocab, float grad_scale) { \
        cross_entropy_rows<T>(logits, targets, loss, d_logits, vocab, grad_scale);                             \
    }

CROSS_ENTROPY(f32, float)
CROSS_ENTROPY(f16, __half)
CROSS_ENTROPY(bf16, __nv_bfloat16)
