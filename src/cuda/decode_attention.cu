// One decode step's attention for many sequences at once: each row's single query against the
// keys and values its slot of the engine's cache holds, of its own length ([slots, capacity,
// kv_heads, d]: a position's keys of every head in one run). One block per (head, row), four
// warps; each warp takes every fourth key, a lane DPL = d / 32 of its dimensions, and keeps its own
// running max, sum and weighted values (the online softmax); the warps' partial results are
// merged at the end. The scores are the composed path's: q·k · scale, then cap · tanh(s / cap)
// where there is a cap, causal by construction (a query is its row's last position), and only the
// last `window` keys where there is a window. Reads are 2 · d bytes a key a warp, coalesced.
#include <stdint.h>
#include <float.h>
#include "dtype.cuh"

constexpr int WARPS = 4;

template <typename T, int DPL>
__device__ void decode_attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 T* __restrict__ out, const uint32_t* __restrict__ slots,
                                 const uint32_t* __restrict__ lens, int heads, int kv_heads, int capacity,
                                 float scale, float softcap, int window) {
    constexpr int D = DPL * 32;
    const int h = blockIdx.x, row = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = h / (heads / kv_heads);
    const int len = (int)lens[row];
    const int64_t slot = slots[row];
    const int first = window > 0 && len > window ? len - window : 0;
    float qv[DPL];
    const T* qrow = q + ((int64_t)row * heads + h) * D;
#pragma unroll
    for (int i = 0; i < DPL; ++i) qv[i] = to_f32(qrow[lane + 32 * i]);
    float m = -FLT_MAX, l = 0.f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
    const int64_t stride = (int64_t)kv_heads * D;
    const T* kbase = k + (slot * capacity) * stride + (int64_t)g * D;
    const T* vbase = v + (slot * capacity) * stride + (int64_t)g * D;
    for (int j = first + warp; j < len; j += WARPS) {
        const T* kj = kbase + j * stride;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s += qv[i] * to_f32(kj[lane + 32 * i]);
#pragma unroll
        for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffff, s, o);
        s *= scale;
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        const float m2 = fmaxf(m, s);
        const float c = __expf(m - m2), p = __expf(s - m2);
        l = l * c + p;
        const T* vj = vbase + j * stride;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] = acc[i] * c + p * to_f32(vj[lane + 32 * i]);
        m = m2;
    }
    __shared__ float sm[WARPS], sl[WARPS], sacc[WARPS][D];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) sacc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float mx = -FLT_MAX;
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, sm[w]);
    float total = 0.f;
    float weights[WARPS];
    for (int w = 0; w < WARPS; ++w) {
        weights[w] = sl[w] > 0.f ? __expf(sm[w] - mx) : 0.f;
        total += sl[w] * weights[w];
    }
    T* orow = out + ((int64_t)row * heads + h) * D;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        float o = 0.f;
        for (int w = 0; w < WARPS; ++w) o += sacc[w][lane + 32 * i] * weights[w];
        store(orow + lane + 32 * i, total > 0.f ? o / total : 0.f);
    }
}

#define DECODE_ATTENTION(NAME, T, DPL)                                                                        \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                  \
        NAME(const T* q, const T* k, const T* v, T* out, const uint32_t* slots, const uint32_t* lens,         \
             int heads, int kv_heads, int capacity, float scale, float softcap, int window) {                 \
        decode_attention<T, DPL>(q, k, v, out, slots, lens, heads, kv_heads, capacity, scale, softcap, window); \
    }
#define DECODE_ATTENTION_DTYPES(DPL, D)                                     \
    DECODE_ATTENTION(decode_attention_##D##_f32, float, DPL)               \
    DECODE_ATTENTION(decode_attention_##D##_f16, __half, DPL)              \
    DECODE_ATTENTION(decode_attention_##D##_bf16, __nv_bfloat16, DPL)
DECODE_ATTENTION_DTYPES(2, 64)
DECODE_ATTENTION_DTYPES(4, 128)
DECODE_ATTENTION_DTYPES(8, 256)

// One decode step's new keys and values into the cache: row r's `width` values (kv_heads · d,
// contiguous in `k` and `v`, [b, width]) at position positions[r] of slot slots[r]. One block a
// row; the slots and positions are read on the GPU, so a step's indices are a few bytes a row.
template <typename T>
__device__ void write_slots(const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ kc,
                            T* __restrict__ vc, const uint32_t* __restrict__ slots,
                            const uint32_t* __restrict__ positions, int capacity, int width) {
    const int r = blockIdx.x;
    const size_t at = ((size_t)slots[r] * capacity + positions[r]) * width;
    const T* kr = k + (size_t)r * width;
    const T* vr = v + (size_t)r * width;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        kc[at + j] = kr[j];
        vc[at + j] = vr[j];
    }
}

#define WRITE_SLOTS(NAME, T)                                                                              \
    extern "C" __global__ void NAME(const T* k, const T* v, T* kc, T* vc, const uint32_t* slots,           \
                                    const uint32_t* positions, int capacity, int width) {                 \
        write_slots<T>(k, v, kc, vc, slots, positions, capacity, width);                                   \
    }
WRITE_SLOTS(write_slots_f32, float)
WRITE_SLOTS(write_slots_f16, __half)
WRITE_SLOTS(write_slots_bf16, __nv_bfloat16)
