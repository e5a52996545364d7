// Greedy decoding's choice for every row of the logits `[n, vocab]` in two small launches: each
// row's argmax (ties to the lowest id) and its raw log-prob, logit[id] − logsumexp(row), which is
// −log Σ exp(logit − max) computed in f32. candle's reductions run one block per row, a few
// blocks on a GPU of a hundred multiprocessors; here `greedy_partial` splits each row into
// `chunks` chunks, one block each (enough blocks to fill the GPU at one row), and writes each
// chunk's (max, Σ exp(x − max), argmax) to a workspace that `greedy_combine` folds per row.
// Two kernels and no atomics: the launches depend on the shapes alone, so they can be recorded
// in a CUDA graph and replayed.
//
// Ties go to the lowest id, as `generate::sampling`'s argmax (the host path) and candle's CPU
// argmax take them; candle's CUDA argmax breaks ties between its threads by thread, which is not
// always the lowest id. Rows that `generate::sampling::log_sum_exp` refuses get a NaN log-prob: a
// NaN or +inf logit (the NaN runs through the sum) or a row of -inf. The argmax skips NaNs, and a
// row with nothing above -inf gets id 0, as both candle argmaxes and sampling's give.
#include <stdint.h>

#include "dtype.cuh"

#define THREADS 128

// A running (max, Σ exp(x − max), first id of the max) over some logits. `m` is never NaN
// (NaNs fail every comparison); `s` carries a NaN once one is seen.
struct State {
    float m;
    float s;
    uint32_t id;
};

// exp(x − m) for x ≤ m, with exp(−inf − −inf) read as 0 so that -inf logits add nothing.
__device__ __forceinline__ float exp_rel(float x, float m) { return x == -INFINITY ? 0.0f : expf(x - m); }

// The union of two states: ties of the max go to the lower id, whatever the order of the merge.
__device__ __forceinline__ State merge(State a, State b) {
    const float m = fmaxf(a.m, b.m);
    State r;
    r.m = m;
    r.s = a.s * exp_rel(a.m, m) + b.s * exp_rel(b.m, m);
    r.id = (b.m > a.m || (b.m == a.m && b.id < a.id)) ? b.id : a.id;
    return r;
}

// `count` consecutive logits from id `first`, folded into `st`: their own max and sum first, so
// the state is rescaled once per load rather than once per logit.
template <int COUNT>
__device__ __forceinline__ void fold(State& st, const float (&v)[COUNT], uint32_t first) {
    State c{-INFINITY, 0.0f, first};
#pragma unroll
    for (int k = 0; k < COUNT; k++)
        if (v[k] > c.m) {
            c.m = v[k];
            c.id = first + k;
        }
#pragma unroll
    for (int k = 0; k < COUNT; k++) c.s += exp_rel(v[k], c.m);
    st = merge(st, c);
}

__device__ __forceinline__ State shfl_state(State st, int off) {
    State o;
    o.m = __shfl_xor_sync(0xffffffff, st.m, off);
    o.s = __shfl_xor_sync(0xffffffff, st.s, off);
    o.id = __shfl_xor_sync(0xffffffff, st.id, off);
    return o;
}

// The block's merged state, in thread 0.
__device__ __forceinline__ State block_merge(State st) {
    __shared__ State warp_states[THREADS / 32];
    for (int off = 16; off > 0; off >>= 1) st = merge(st, shfl_state(st, off));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_states[warp] = st;
    __syncthreads();
    if (warp == 0) {
        st = lane < THREADS / 32 ? warp_states[lane] : State{-INFINITY, 0.0f, 0xffffffffu};
        for (int off = 16; off > 0; off >>= 1) st = merge(st, shfl_state(st, off));
    }
    return st;
}

// Block (c, r) folds logits[r, c·chunk .. min((c + 1)·chunk, vocab)) into partial[r · chunks + c];
// `chunk` is a multiple of 16 bytes of T, so with 16-byte-aligned rows every load is a vector.
template <typename T>
__device__ void greedy_partial(const T* logits, State* partial, int vocab, int chunk) {
    constexpr int VEC = 16 / sizeof(T);
    const int row = blockIdx.y, c = blockIdx.x, chunks = gridDim.x;
    const T* x = logits + (int64_t)row * vocab;
    const int begin = c * chunk, end = min(begin + chunk, vocab);
    State st{-INFINITY, 0.0f, 0xffffffffu};
    if (vocab % VEC == 0 && (reinterpret_cast<uintptr_t>(logits) & 15) == 0) {
#pragma unroll 4
        for (int i = begin + threadIdx.x * VEC; i < end; i += THREADS * VEC) {
            const Vec16<T> raw = load16(x + i);
            float v[VEC];
#pragma unroll
            for (int k = 0; k < VEC; k++) v[k] = to_f32(raw.v[k]);
            fold(st, v, i);
        }
    } else {
        for (int i = begin + threadIdx.x; i < end; i += THREADS) {
            const float v[1] = {to_f32(x[i])};
            fold(st, v, i);
        }
    }
    st = block_merge(st);
    if (threadIdx.x == 0) partial[(int64_t)row * chunks + c] = st;
}

// Block r folds row r's `chunks` partials; out[r] is the id, out[n + r] the log-prob's f32 bits
// (one buffer, one copy to the host).
extern "C" __global__ void greedy_combine(const State* partial, uint32_t* out, int n, int chunks) {
    const int row = blockIdx.x;
    State st{-INFINITY, 0.0f, 0xffffffffu};
    for (int c = threadIdx.x; c < chunks; c += THREADS) st = merge(st, partial[(int64_t)row * chunks + c]);
    st = block_merge(st);
    if (threadIdx.x == 0) {
        // a row with nothing above -inf has no logit to take: id 0 and a NaN log-prob
        const bool empty = st.m == -INFINITY;
        out[row] = empty ? 0u : st.id;
        out[n + row] = __float_as_uint(empty ? NAN : -logf(st.s));
    }
}

#define GREEDY_PARTIAL(NAME, T)                                                                        \
    extern "C" __global__ void greedy_partial_##NAME(const T* logits, State* partial, int vocab,       \
                                                     int chunk) {                                      \
        greedy_partial<T>(logits, partial, vocab, chunk);                                              \
    }

GREEDY_PARTIAL(f32, float)
GREEDY_PARTIAL(f16, __half)
GREEDY_PARTIAL(bf16, __nv_bfloat16)
