// One decode step's attention for many sequences at once (flash decoding): each row's single
// query against the keys and values its slot of the engine's cache holds, of its own length
// ([slots, capacity, kv_heads, d]: a position's keys of every head in one run). A block serves
// the G query heads that share one kv head (GQA: each key and value is read once for all of
// them) over one split of the row's positions; the splits (S, chosen on the host from the batch
// and the cache's capacity, never from the lengths, so a recorded CUDA graph stays valid as
// rows grow) write f32 partial results that decode_attention_combine merges, or, with S = 1,
// the output itself. In a block of four warps, a key's d values are spread over d/8 lanes (8
// values a lane, 16 or 32 contiguous bytes), so one warp-load reads several keys; each group of
// lanes walks its own keys four at a time (keys and values of all four loaded before any use)
// keeping its own online softmax (max, sum, weighted values); groups merge by shuffles, warps
// through shared memory. The scores are the composed path's: q·k · scale, then
// cap · tanh(s / cap) where there is a cap, causal by construction (a query is its row's last
// position), and only the last `window` keys where there is a window.
#include <stdint.h>
#include <float.h>
#include "dtype.cuh"

constexpr int WARPS = 4;
// values of a key a lane holds
constexpr int E = 8;
// keys a lane group has in flight
constexpr int KU = 4;

template <typename T>
__device__ __forceinline__ void load8(const T* p, float* out) {
    if constexpr (sizeof(T) == 4) {
        const float4 a = *reinterpret_cast<const float4*>(p);
        const float4 b = *reinterpret_cast<const float4*>(p + 4);
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
        const Vec16<T> raw = load16(p);
#pragma unroll
        for (int i = 0; i < E; i++) out[i] = to_f32(raw.v[i]);
    }
}

// The raw bytes of a key's 8 values, loaded ahead of their conversion.
template <typename T>
struct Raw8 {
    uint4 a, b;
};
template <typename T>
__device__ __forceinline__ Raw8<T> fetch8(const T* p) {
    Raw8<T> r;
    r.a = *reinterpret_cast<const uint4*>(p);
    if constexpr (sizeof(T) == 4) r.b = *reinterpret_cast<const uint4*>(p + 4);
    return r;
}
template <typename T>
__device__ __forceinline__ void unpack8(const Raw8<T>& r, float* out) {
    if constexpr (sizeof(T) == 4) {
        const float* a = reinterpret_cast<const float*>(&r.a);
        const float* b = reinterpret_cast<const float*>(&r.b);
#pragma unroll
        for (int i = 0; i < 4; i++) out[i] = a[i], out[4 + i] = b[i];
    } else {
        const T* a = reinterpret_cast<const T*>(&r.a);
#pragma unroll
        for (int i = 0; i < E; i++) out[i] = to_f32(a[i]);
    }
}

// (m, l, acc) merged with another such state.
template <int G>
__device__ __forceinline__ void merge(float* m, float* l, float (*acc)[E], const float* mo, const float* lo,
                                      const float (*acco)[E]) {
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float mx = fmaxf(m[g], mo[g]);
        const float a = __expf(m[g] - mx), b = __expf(mo[g] - mx);
        l[g] = l[g] * a + lo[g] * b;
#pragma unroll
        for (int e = 0; e < E; e++) acc[g][e] = acc[g][e] * a + acco[g][e] * b;
        m[g] = mx;
    }
}

// Grid: (kv_heads · hsplit, rows, splits); a block takes query heads h0 .. h0 + count of the
// kv head, count ≤ G. part_acc [rows, heads, splits, D] and part_ml [rows, heads, splits, 2]
// are written when splits > 1.
template <typename T, int D, int G>
__device__ void decode_attention(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 T* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,
                                 const uint32_t* __restrict__ slots, const uint32_t* __restrict__ lens, int heads,
                                 int kv_heads, int capacity, float scale, float softcap, int window, int splits,
                                 int hsplit) {
    constexpr int LPK = D / E;             // lanes a key
    constexpr int KPW = 32 / LPK;          // keys a warp-load
    constexpr int GROUPS = WARPS * KPW;    // lane groups a block
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int sub = lane % LPK, kg = warp * KPW + lane / LPK;
    const int kvh = blockIdx.x / hsplit, part = blockIdx.x % hsplit;
    const int per_kv = heads / kv_heads;
    const int h0 = kvh * per_kv + part * G;
    const int count = min(G, per_kv - part * G);
    const int row = blockIdx.y, split = blockIdx.z;
    const int len = (int)lens[row];
    const int64_t slot = slots[row];
    const int first = window > 0 && len > window ? len - window : 0;
    const int span = (len - first + splits - 1) / splits;
    const int lo = min(len, first + split * span), hi = min(len, lo + span);

    float qv[G][E];
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (g < count) load8(q + ((int64_t)row * heads + h0 + g) * D + sub * E, qv[g]);
        else
#pragma unroll
            for (int e = 0; e < E; e++) qv[g][e] = 0.f;
    }
    float m[G], l[G], acc[G][E];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -FLT_MAX, l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < E; e++) acc[g][e] = 0.f;
    }
    const int64_t stride = (int64_t)kv_heads * D;
    const T* kbase = k + (slot * capacity) * stride + (int64_t)kvh * D + sub * E;
    const T* vbase = v + (slot * capacity) * stride + (int64_t)kvh * D + sub * E;
    // every lane takes the same trips (the shuffles below need the whole warp)
    for (int base = lo; base < hi; base += GROUPS * KU) {
        const int j0 = base + kg;
        Raw8<T> kr[KU], vr[KU];
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int j = j0 + u * GROUPS;
            const int at = j < hi ? j : lo;   // a key in range, its result unused
            kr[u] = fetch8(kbase + at * stride);
            vr[u] = fetch8(vbase + at * stride);
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int j = j0 + u * GROUPS;
            // j is the same for every lane of a group, so a group's shuffles stay together
            const bool live = j < hi;
            float kf[E];
            unpack8(kr[u], kf);
            float s[G];
#pragma unroll
            for (int g = 0; g < G; g++) {
                float d = 0.f;
#pragma unroll
                for (int e = 0; e < E; e++) d = fmaf(qv[g][e], kf[e], d);
#pragma unroll
                for (int o = LPK / 2; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffff, d, o);
                d *= scale;
                if (softcap > 0.f) d = softcap * tanhf(d / softcap);
                s[g] = d;
            }
            if (!live) continue;
            float vf[E];
            unpack8(vr[u], vf);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float m2 = fmaxf(m[g], s[g]);
                const float c = __expf(m[g] - m2), p = __expf(s[g] - m2);
                l[g] = l[g] * c + p;
#pragma unroll
                for (int e = 0; e < E; e++) acc[g][e] = fmaf(p, vf[e], acc[g][e] * c);
                m[g] = m2;
            }
        }
    }
    // the lane groups of a warp (lanes sub, sub + LPK, ...) merged by shuffles
#pragma unroll
    for (int o = LPK; o < 32; o *= 2) {
        float mo[G], lo2[G], acco[G][E];
#pragma unroll
        for (int g = 0; g < G; g++) {
            mo[g] = __shfl_xor_sync(0xffffffff, m[g], o);
            lo2[g] = __shfl_xor_sync(0xffffffff, l[g], o);
#pragma unroll
            for (int e = 0; e < E; e++) acco[g][e] = __shfl_xor_sync(0xffffffff, acc[g][e], o);
        }
        merge<G>(m, l, acc, mo, lo2, acco);
    }
    // then the warps, through shared memory
    __shared__ float sm_m[WARPS][G], sm_l[WARPS][G], sm_acc[WARPS][G][D];
    if (lane < LPK) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (lane == 0) sm_m[warp][g] = m[g], sm_l[warp][g] = l[g];
#pragma unroll
            for (int e = 0; e < E; e++) sm_acc[warp][g][sub * E + e] = acc[g][e];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < count * D; i += WARPS * 32) {
        const int g = i / D, d = i % D;
        float mx = -FLT_MAX;
#pragma unroll
        for (int w = 0; w < WARPS; w++) mx = fmaxf(mx, sm_m[w][g]);
        float total = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            const float wt = __expf(sm_m[w][g] - mx);
            total += sm_l[w][g] * wt;
            o += sm_acc[w][g][d] * wt;
        }
        const int64_t at = (int64_t)row * heads + h0 + g;
        if (splits == 1) {
            store(out + at * D + d, total > 0.f ? o / total : 0.f);
        } else {
            part_acc[(at * splits + split) * D + d] = o;
            if (d == 0) part_ml[(at * splits + split) * 2] = mx, part_ml[(at * splits + split) * 2 + 1] = total;
        }
    }
}

#define DECODE_ATTENTION(NAME, T, D, G)                                                                         \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                    \
        NAME(const T* q, const T* k, const T* v, T* out, float* part_acc, float* part_ml, const uint32_t* slots, \
             const uint32_t* lens, int heads, int kv_heads, int capacity, float scale, float softcap, int window, \
             int splits, int hsplit) {                                                                          \
        decode_attention<T, D, G>(q, k, v, out, part_acc, part_ml, slots, lens, heads, kv_heads, capacity, scale, \
                                  softcap, window, splits, hsplit);                                            \
    }
#define DECODE_ATTENTION_GROUPS(D, SUFFIX, T)                       \
    DECODE_ATTENTION(decode_attention_##D##_##SUFFIX##_g1, T, D, 1) \
    DECODE_ATTENTION(decode_attention_##D##_##SUFFIX##_g2, T, D, 2) \
    DECODE_ATTENTION(decode_attention_##D##_##SUFFIX##_g4, T, D, 4) \
    DECODE_ATTENTION(decode_attention_##D##_##SUFFIX##_g8, T, D, 8)
#define DECODE_ATTENTION_DTYPES(D)                       \
    DECODE_ATTENTION_GROUPS(D, f32, float)               \
    DECODE_ATTENTION_GROUPS(D, f16, __half)              \
    DECODE_ATTENTION_GROUPS(D, bf16, __nv_bfloat16)
DECODE_ATTENTION_DTYPES(64)
DECODE_ATTENTION_DTYPES(128)
DECODE_ATTENTION_DTYPES(256)

// The splits' partial results of each (row, head) merged into the output: weights
// exp(m_s − max m), the weighted sums over the weighted softmax sums. One block a (head, row),
// a thread a dimension.
template <typename T>
__device__ void decode_attention_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                         T* __restrict__ out, int heads, int splits, int d) {
    const int64_t at = (int64_t)blockIdx.y * heads + blockIdx.x;
    const float* ml = part_ml + at * splits * 2;
    float mx = -FLT_MAX;
    for (int s = 0; s < splits; s++) mx = fmaxf(mx, ml[2 * s]);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float total = 0.f, o = 0.f;
        for (int s = 0; s < splits; s++) {
            const float wt = __expf(ml[2 * s] - mx);
            total += ml[2 * s + 1] * wt;
            o += part_acc[(at * splits + s) * d + i] * wt;
        }
        store(out + at * d + i, total > 0.f ? o / total : 0.f);
    }
}

#define DECODE_ATTENTION_COMBINE(NAME, T)                                                                   \
    extern "C" __global__ void NAME(const float* part_acc, const float* part_ml, T* out, int heads, int splits, \
                                    int d) {                                                                \
        decode_attention_combine<T>(part_acc, part_ml, out, heads, splits, d);                              \
    }
DECODE_ATTENTION_COMBINE(decode_attention_combine_f32, float)
DECODE_ATTENTION_COMBINE(decode_attention_combine_f16, __half)
DECODE_ATTENTION_COMBINE(decode_attention_combine_bf16, __nv_bfloat16)

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

// One decode step's RoPE and cache write in one launch: row r's q `[b, heads, d]` and k
// `[b, kv_heads, d]` (rows contiguous) rotated at position positions[r] by the tables cos, sin
// `[positions, d/2]` (rope.cu's rotate_half arithmetic, in the dtype), q into `q_out`, k and
// row r of v into position positions[r] of slot slots[r] of the caches. Block (r, y) takes
// heads y · per_block .. of row r's q heads, then k heads, then v heads: a thread a pair of
// values (one block a row, looping over them, left each load's latency exposed in turn).
template <typename T>
__device__ void rope_write_slots(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 const T* __restrict__ cos, const T* __restrict__ sin, T* __restrict__ q_out,
                                 T* __restrict__ kc, T* __restrict__ vc, const uint32_t* __restrict__ slots,
                                 const uint32_t* __restrict__ positions, int heads, int kv_heads, int half,
                                 int capacity, int per_block) {
    const int r = blockIdx.x, d = 2 * half;
    const int h0 = blockIdx.y * per_block, h1 = min(h0 + per_block, heads + 2 * kv_heads);
    const int64_t pos = positions[r];
    const int64_t at = ((int64_t)slots[r] * capacity + pos) * kv_heads * d;
    const T* c = cos + pos * half;
    const T* s = sin + pos * half;
    for (int i = threadIdx.x; i < (h1 - h0) * half; i += blockDim.x) {
        const int h = h0 + i / half, j = i - (h - h0) * half;
        if (h < heads + kv_heads) {
            const T* x = h < heads ? q + ((int64_t)r * heads + h) * d : k + ((int64_t)r * kv_heads + h - heads) * d;
            T* y = h < heads ? q_out + ((int64_t)r * heads + h) * d : kc + at + (int64_t)(h - heads) * d;
            const T a = x[j], b = x[j + half], cj = c[j], sj = s[j];
            y[j] = a * cj - b * sj;
            y[j + half] = a * sj + b * cj;
        } else {
            const int64_t hv = h - heads - kv_heads;
            const T* vr = v + ((int64_t)r * kv_heads + hv) * d;
            T* y = vc + at + hv * d;
            y[j] = vr[j];
            y[j + half] = vr[j + half];
        }
    }
}

#define ROPE_WRITE_SLOTS(NAME, T)                                                                            \
    extern "C" __global__ void NAME(const T* q, const T* k, const T* v, const T* cos, const T* sin, T* q_out,  \
                                    T* kc, T* vc, const uint32_t* slots, const uint32_t* positions, int heads, \
                                    int kv_heads, int half, int capacity, int per_block) {                    \
        rope_write_slots<T>(q, k, v, cos, sin, q_out, kc, vc, slots, positions, heads, kv_heads, half,        \
                            capacity, per_block);                                                             \
    }
ROPE_WRITE_SLOTS(rope_write_slots_f32, float)
ROPE_WRITE_SLOTS(rope_write_slots_f16, __half)
ROPE_WRITE_SLOTS(rope_write_slots_bf16, __nv_bfloat16)
