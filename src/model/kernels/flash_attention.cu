// Causal attention with grouped-query heads and an optional sliding window, forward and backward,
// in the style of FlashAttention-2: scores and probabilities live only in registers, one 16-row
// tile per warp, on the tensor cores (mma.sync m16n8k16, f32 accumulators). The forward keeps the
// row log-sum-exp so that the backward recomputes P exactly; the backward is two kernels (dK/dV
// by key block, looping over the query heads of its kv head, and dQ by query block), so nothing
// needs atomics. src/model/attention.rs keeps the composed version as the reference.
//
// Tiles reach shared memory by cp.async, two stages deep (the next tile's copy overlaps the
// current tile's math), and the tensor-core operands leave it by ldmatrix (.trans for the [k][n]
// operands V, dO, Q and K), one instruction per pair of 16x8 tiles. Tiles that every row of a
// warp sees whole skip the mask; tiles no row of a warp sees are skipped.
//
// Layout: every tensor is [batch, heads, rows, head_dim] addressed through (b, h, row) strides
// with unit stride along head_dim. Query row i sits at position q_pos0 + i and sees key j when
// j <= pos and, with a window w > 0, pos - j < w (HF Mistral's rule). `lse` is kept in log2 units
// (log2 sum exp2(s * scale * log2 e)).
#include <stdint.h>

#include "../../kernels/dtype.cuh"

#define WARPS 4
#define PAD 8  // smem row padding (elements): the 8 rows an ldmatrix reads fall in distinct banks

struct Dims {
    int batch, heads, kv_heads, q_len, kv_len, q_pos0, window;
    float scale_log2;  // softmax scale times log2(e)
};

struct Strides {
    long long b, h, row;
};

__device__ __forceinline__ bool visible(int pos, int key, int window) {
    return key <= pos && (window <= 0 || pos - key < window);
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__half>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// --- shared memory (sm_80+): asynchronous copies in, ldmatrix out ---
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without a trip through registers; `valid` false writes zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// The 16x16 A operand at (r0, k0) of a row-major smem tile with leading dimension ld.
template <typename T>
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const T* tile, int ld, int r0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4(a, tile + (r0 + l % 16) * ld + k0 + l / 16 * 8);
}

// B operands of the two 16x8 tiles n0 and n0 + 8 at k0, from [n][k] storage (B[k][n] = x[n][k]):
// {b0, b1} of the first tile, then of the second.
template <typename T>
__device__ __forceinline__ void ldsm_b_nk(uint32_t b[4], const T* tile, int ld, int n0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4(b, tile + (n0 + l % 8 + l / 16 * 8) * ld + k0 + l / 8 % 2 * 8);
}

// The same from [k][n] storage (B[k][n] = x[k][n]), transposed on the way out.
template <typename T>
__device__ __forceinline__ void ldsm_b_kn(uint32_t b[4], const T* tile, int ld, int k0, int n0) {
    const int l = threadIdx.x % 32;
    ldsm_x4_trans(b, tile + (k0 + l % 8 + l / 8 % 2 * 8) * ld + n0 + l / 16 * 8);
}

// c0, c1 (two 16x8 tiles) += a (16x16) . B, B the 16 rows n0.. at column k0 of an [n][k] tile.
template <typename T>
__device__ __forceinline__ void mma_nk(float c0[4], float c1[4], const uint32_t a[4], const T* tile, int ld, int n0,
                                       int k0) {
    uint32_t bf[4];
    ldsm_b_nk(bf, tile, ld, n0, k0);
    mma<T>(c0, a, bf[0], bf[1]);
    mma<T>(c1, a, bf[2], bf[3]);
}

// acc (16 x D) += a (16x16) . rows k0 .. k0 + 16 of a [k][D] tile.
template <typename T, int D>
__device__ __forceinline__ void mma_kn_rows(float acc[D / 8][4], const uint32_t a[4], const T* tile, int ld, int k0) {
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
        uint32_t bf[4];
        ldsm_b_kn(bf, tile, ld, k0, np * 16);
        mma<T>(acc[2 * np], a, bf[0], bf[1]);
        mma<T>(acc[2 * np + 1], a, bf[2], bf[3]);
    }
}

// Accumulators of two neighbouring 16x8 tiles as the A fragment of a 16x16 product (FA-2's
// register reuse: the C layout of tiles n and n+1 is the A layout of one k-step).
template <typename T>
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack2<T>(c0[0], c0[1]);
    a[1] = pack2<T>(c0[2], c0[3]);
    a[2] = pack2<T>(c1[0], c1[1]);
    a[3] = pack2<T>(c1[2], c1[3]);
}

// Starts copying rows [row0, row0 + ROWS) of one (b, h) slice into smem [ROWS][D + PAD]; rows
// past `rows` become zeros. The caller commits the group.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void load_tile_async(T* tile, const T* src, long long stride_row, int row0, int rows) {
    constexpr int VEC = 8;  // 16-byte copies
    for (int i = threadIdx.x; i < ROWS * D / VEC; i += WARPS * 32) {
        const int r = i / (D / VEC), c = i % (D / VEC) * VEC;
        const bool in = row0 + r < rows;
        cp_async16(tile + r * (D + PAD) + c, src + (in ? (row0 + r) * stride_row + c : 0), in);
    }
}

// A fragments of 16 rows x D straight from global memory (rows past `rows` read as zero).
template <typename T, int D>
__device__ __forceinline__ void load_rows_a(uint32_t a[D / 16][4], const T* src, long long stride_row, int r0, int rows) {
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = r0 + g + (i % 2) * 8, col = kk * 16 + c + (i / 2) * 8;
            a[kk][i] = r < rows ? *reinterpret_cast<const uint32_t*>(src + r * stride_row + col) : 0u;
        }
    }
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// Keys a block of query rows [r0, r1] can see: [lo, hi).
__device__ __forceinline__ void key_range(const Dims& d, int r0, int r1, int& lo, int& hi) {
    const int pos_lo = d.q_pos0 + r0, pos_hi = d.q_pos0 + r1;
    lo = d.window > 0 ? max(0, pos_lo - d.window + 1) : 0;
    hi = min(d.kv_len, pos_hi + 1);
}

// Query positions [pos_lo, pos_hi] against keys [k_lo, k_hi]: whether no pair is visible (skip),
// and whether some pair is hidden (mask); otherwise every pair is visible.
__device__ __forceinline__ bool none_visible(const Dims& d, int pos_lo, int pos_hi, int k_lo, int k_hi) {
    return k_lo > pos_hi || (d.window > 0 && pos_lo - k_hi >= d.window);
}
__device__ __forceinline__ bool some_hidden(const Dims& d, int pos_lo, int pos_hi, int k_lo, int k_hi) {
    return k_hi > pos_lo || (d.window > 0 && pos_hi - k_lo >= d.window);
}

constexpr int FWD_Q = WARPS * 16;  // query rows per forward / dQ block
constexpr int KV_TILE = 64;        // keys per smem stage of the forward and dQ kernels

// Dynamic smem of the forward and dQ kernels: 2 stages x (K, V) x KV_TILE rows.
template <int D>
constexpr int kv_stages_elems() {
    return 2 * 2 * KV_TILE * (D + PAD);
}

// Streams the key tiles [k_first, hi) of one kv head through two smem stages and calls
// body(ks, vs, k0) on each, the next tile's copy in flight meanwhile.
template <typename T, int D, typename Body>
__device__ __forceinline__ void for_each_kv_tile(T* smem, const T* kb, const T* vb, long long stride_row, int kv_len,
                                                 int k_first, int hi, Body body) {
    constexpr int TILE = KV_TILE * (D + PAD);
    const int n = k_first < hi ? (hi - k_first + KV_TILE - 1) / KV_TILE : 0;
    if (n == 0) return;
    load_tile_async<T, D, KV_TILE>(smem, kb, stride_row, k_first, kv_len);
    load_tile_async<T, D, KV_TILE>(smem + TILE, vb, stride_row, k_first, kv_len);
    cp_async_commit();
    for (int i = 0; i < n; ++i) {
        if (i + 1 < n) {
            T* next = smem + (i + 1) % 2 * 2 * TILE;
            const int k_next = k_first + (i + 1) * KV_TILE;
            load_tile_async<T, D, KV_TILE>(next, kb, stride_row, k_next, kv_len);
            load_tile_async<T, D, KV_TILE>(next + TILE, vb, stride_row, k_next, kv_len);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T* cur = smem + i % 2 * 2 * TILE;
        body(cur, cur + TILE, k_first + i * KV_TILE);
        __syncthreads();  // the stage is overwritten by the copy issued next iteration
    }
}

// grid (ceil(q_len / 64), heads, batch); block 128; dynamic smem kv_stages_elems<D>() elements.
template <typename T, int D>
__device__ void flash_forward(const T* q, const T* k, const T* v, T* o, float* lse, Dims d, Strides sq, Strides sk,
                              Strides so) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    constexpr int LD = D + PAD;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (d.heads / d.kv_heads);
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int r0 = blockIdx.x * FWD_Q + warp * 16;

    uint32_t qf[D / 16][4];
    load_rows_a<T, D>(qf, q + b * sq.b + h * sq.h, sq.row, r0, d.q_len);
    float acc[D / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int pos[2] = {d.q_pos0 + r0 + g, d.q_pos0 + r0 + g + 8};
    const int pos_lo = d.q_pos0 + r0, pos_hi = pos_lo + 15;

    int lo, hi;
    key_range(d, blockIdx.x * FWD_Q, min(blockIdx.x * FWD_Q + FWD_Q, d.q_len) - 1, lo, hi);
    auto tile = [&](const T* ks, const T* vs, int k0) {
        if (none_visible(d, pos_lo, pos_hi, k0, k0 + KV_TILE - 1)) return;
        const bool mask = some_hidden(d, pos_lo, pos_hi, k0, k0 + KV_TILE - 1);
        float s[KV_TILE / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
            for (int np = 0; np < KV_TILE / 16; ++np) mma_nk<T>(s[2 * np], s[2 * np + 1], qf[kk], ks, LD, np * 16, kk * 16);
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < KV_TILE / 8; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int key = k0 + nt * 8 + c + i % 2;
                const bool vis = !mask || visible(pos[i / 2], key, d.window);
                const float x = vis ? s[nt][i] * d.scale_log2 : -INFINITY;
                s[nt][i] = x;
                tile_max[i / 2] = fmaxf(tile_max[i / 2], x);
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
            const float m_use = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = exp2f(m[r] - m_use);
            m[r] = m_new;
            l[r] *= alpha;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                acc[nt][2 * r] *= alpha;
                acc[nt][2 * r + 1] *= alpha;
            }
#pragma unroll
            for (int nt = 0; nt < KV_TILE / 8; ++nt) {
                s[nt][2 * r] = exp2f(s[nt][2 * r] - m_use);
                s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - m_use);
                l[r] += s[nt][2 * r] + s[nt][2 * r + 1];
            }
        }
#pragma unroll
        for (int kt = 0; kt < KV_TILE / 16; ++kt) {
            uint32_t pa[4];
            acc_to_a<T>(pa, s[2 * kt], s[2 * kt + 1]);
            mma_kn_rows<T, D>(acc, pa, vs, LD, kt * 16);
        }
    };
    for_each_kv_tile<T, D>(reinterpret_cast<T*>(smem_bytes), k + b * sk.b + kvh * sk.h, v + b * sk.b + kvh * sk.h,
                           sk.row, d.kv_len, lo / KV_TILE * KV_TILE, hi, tile);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r0 + g + 8 * r;
        const float sum = quad_sum(l[r]);
        if (row >= d.q_len) continue;
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        T* orow = o + b * so.b + h * so.h + row * so.row;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
            *reinterpret_cast<uint32_t*>(orow + nt * 8 + c) = pack2<T>(acc[nt][2 * r] * inv, acc[nt][2 * r + 1] * inv);
        if (c == 0) lse[((long long)b * d.heads + h) * d.q_len + row] = m[r] + log2f(sum);
    }
}

// delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d]: one warp per row.
template <typename T>
__device__ void attention_delta(const T* o, const T* d_o, float* delta, Dims d, int head_dim, Strides so,
                                Strides sdo) {
    const long long row_id = (long long)blockIdx.x * WARPS + threadIdx.x / 32;
    if (row_id >= (long long)d.batch * d.heads * d.q_len) return;
    const int row = row_id % d.q_len, h = row_id / d.q_len % d.heads, b = row_id / d.q_len / d.heads;
    const T* orow = o + b * so.b + h * so.h + row * so.row;
    const T* drow = d_o + b * sdo.b + h * sdo.h + row * sdo.row;
    float sum = 0.f;
    for (int j = threadIdx.x % 32; j < head_dim; j += 32) sum += to_f32(orow[j]) * to_f32(drow[j]);
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, off);
    if (threadIdx.x % 32 == 0) delta[row_id] = sum;
}

constexpr int BWD_KEYS = WARPS * 16;  // keys per dK/dV block
constexpr int BWD_Q = 32;             // query rows per dK/dV step

// Dynamic smem of the dK/dV kernel: K and V of the block, then 2 stages x (Q, dO) x BWD_Q rows
// (elements of T), then 2 stages x (lse, delta) x BWD_Q floats.
template <int D>
constexpr int dkdv_smem_elems() {
    return (2 * BWD_KEYS + 2 * 2 * BWD_Q) * (D + PAD);
}

// Starts the copies of one dK/dV step: BWD_Q rows of Q and dO of head h, with their lse and delta.
template <typename T, int D>
__device__ __forceinline__ void load_q_step(T* stage, float* stats, const T* q, const T* d_o, const float* lse,
                                            const float* delta, const Dims& d, const Strides& sq, const Strides& sdo,
                                            int b, int h, int r0) {
    load_tile_async<T, D, BWD_Q>(stage, q + b * sq.b + h * sq.h, sq.row, r0, d.q_len);
    load_tile_async<T, D, BWD_Q>(stage + BWD_Q * (D + PAD), d_o + b * sdo.b + h * sdo.h, sdo.row, r0, d.q_len);
    cp_async_commit();
    if (threadIdx.x < BWD_Q) {
        const long long row = ((long long)b * d.heads + h) * d.q_len + r0 + threadIdx.x;
        const bool in = r0 + (int)threadIdx.x < d.q_len;
        stats[threadIdx.x] = in ? lse[row] : INFINITY;  // P = exp2(s - inf) = 0 past the rows
        stats[BWD_Q + threadIdx.x] = in ? delta[row] : 0.f;
    }
}

// grid (ceil(kv_len / 64), kv_heads, batch); block 128; dynamic smem dkdv_smem_elems<D>() elements
// plus 4 * BWD_Q floats. Each warp owns 16 keys; the block walks the query heads that share its kv
// head and, in steps of BWD_Q, the query rows that can see its keys.
template <typename T, int D>
__device__ void flash_backward_dkdv(const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                                    const float* delta, T* dk, T* dv, Dims d, Strides sq, Strides sk, Strides sdo,
                                    Strides sdk) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    constexpr int LD = D + PAD, STAGE = 2 * BWD_Q * LD;
    T* ks = reinterpret_cast<T*>(smem_bytes);
    T* vs = ks + BWD_KEYS * LD;
    T* stages = vs + BWD_KEYS * LD;
    float* stats = reinterpret_cast<float*>(stages + 2 * STAGE);
    const int b = blockIdx.z, kvh = blockIdx.y, n_rep = d.heads / d.kv_heads;
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int key0 = blockIdx.x * BWD_KEYS, wkey0 = warp * 16, kw0 = key0 + wkey0;
    const int keys[2] = {kw0 + g, kw0 + g + 8};
    load_tile_async<T, D, BWD_KEYS>(ks, k + b * sk.b + kvh * sk.h, sk.row, key0, d.kv_len);
    load_tile_async<T, D, BWD_KEYS>(vs, v + b * sk.b + kvh * sk.h, sk.row, key0, d.kv_len);
    cp_async_commit();
    float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};

    // Query rows that see any key of the block: pos >= key0 and, with a window, pos < key_last + w.
    const int q_lo = max(0, key0 - d.q_pos0) / BWD_Q * BWD_Q;
    int q_hi = d.q_len;
    if (d.window > 0) q_hi = min(q_hi, key0 + BWD_KEYS - 1 + d.window - d.q_pos0);
    const int n_q = q_lo < q_hi ? (q_hi - q_lo + BWD_Q - 1) / BWD_Q : 0;
    const int steps = n_rep * n_q;
    const int h0 = kvh * n_rep;
    if (steps > 0) load_q_step<T, D>(stages, stats, q, d_o, lse, delta, d, sq, sdo, b, h0, q_lo);
    for (int i = 0; i < steps; ++i) {
        if (i + 1 < steps) {
            const int s = (i + 1) % 2;
            load_q_step<T, D>(stages + s * STAGE, stats + s * 2 * BWD_Q, q, d_o, lse, delta, d, sq, sdo, b,
                              h0 + (i + 1) / n_q, q_lo + (i + 1) % n_q * BWD_Q);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T* qs = stages + i % 2 * STAGE;
        const T* dos = qs + BWD_Q * LD;
        const float* lse_s = stats + i % 2 * 2 * BWD_Q;
        const float* delta_s = lse_s + BWD_Q;
        const int p0 = d.q_pos0 + q_lo + i % n_q * BWD_Q;  // position of the step's first query
        if (!none_visible(d, p0, p0 + BWD_Q - 1, kw0, kw0 + 15)) {
            const bool mask = some_hidden(d, p0, p0 + BWD_Q - 1, kw0, kw0 + 15);
            // S^T (16 keys x BWD_Q queries) = K_w Q^T and dP^T = V_w dO^T.
            float st[BWD_Q / 8][4] = {}, dpt[BWD_Q / 8][4] = {};
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                uint32_t ka[4], va[4];
                ldsm_a(ka, ks, LD, wkey0, kk * 16);
                ldsm_a(va, vs, LD, wkey0, kk * 16);
#pragma unroll
                for (int np = 0; np < BWD_Q / 16; ++np) {
                    mma_nk<T>(st[2 * np], st[2 * np + 1], ka, qs, LD, np * 16, kk * 16);
                    mma_nk<T>(dpt[2 * np], dpt[2 * np + 1], va, dos, LD, np * 16, kk * 16);
                }
            }
            // P^T = exp2(S^T scale - lse), dS^T = P^T (dP^T - delta); element i of tile nt is
            // key keys[i / 2], query nt * 8 + c + i % 2 of the step.
#pragma unroll
            for (int nt = 0; nt < BWD_Q / 8; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int qi = nt * 8 + c + i % 2;
                    const bool vis = !mask || visible(p0 + qi, keys[i / 2], d.window);
                    const float p = vis ? exp2f(st[nt][i] * d.scale_log2 - lse_s[qi]) : 0.f;
                    st[nt][i] = p;
                    dpt[nt][i] = p * (dpt[nt][i] - delta_s[qi]);
                }
#pragma unroll
            for (int kt = 0; kt < BWD_Q / 16; ++kt) {
                uint32_t pa[4], dsa[4];
                acc_to_a<T>(pa, st[2 * kt], st[2 * kt + 1]);
                acc_to_a<T>(dsa, dpt[2 * kt], dpt[2 * kt + 1]);
                mma_kn_rows<T, D>(dv_acc, pa, dos, LD, kt * 16);
                mma_kn_rows<T, D>(dk_acc, dsa, qs, LD, kt * 16);
            }
        }
        __syncthreads();  // the stage is overwritten by the copy issued next iteration
    }
    cp_async_wait<0>();  // no step: the K/V copy is still the block's to finish
    const float scale = d.scale_log2 / 1.4426950408889634f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (keys[r] >= d.kv_len) continue;
        const long long off = b * sdk.b + kvh * sdk.h + keys[r] * sdk.row;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            *reinterpret_cast<uint32_t*>(dk + off + nt * 8 + c) =
                pack2<T>(dk_acc[nt][2 * r] * scale, dk_acc[nt][2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(dv + off + nt * 8 + c) = pack2<T>(dv_acc[nt][2 * r], dv_acc[nt][2 * r + 1]);
        }
    }
}

// grid (ceil(q_len / 64), heads, batch); block 128; dynamic smem kv_stages_elems<D>() elements.
// Each warp owns 16 query rows.
template <typename T, int D>
__device__ void flash_backward_dq(const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                                  const float* delta, T* dq, Dims d, Strides sq, Strides sk, Strides sdo, Strides sdq) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    constexpr int LD = D + PAD;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (d.heads / d.kv_heads);
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int r0 = blockIdx.x * FWD_Q + warp * 16;
    uint32_t qf[D / 16][4], dof[D / 16][4];
    load_rows_a<T, D>(qf, q + b * sq.b + h * sq.h, sq.row, r0, d.q_len);
    load_rows_a<T, D>(dof, d_o + b * sdo.b + h * sdo.h, sdo.row, r0, d.q_len);
    const long long stat0 = ((long long)b * d.heads + h) * d.q_len;
    float row_lse[2], row_delta[2];
    int pos[2];
    for (int r = 0; r < 2; ++r) {
        const int row = r0 + g + 8 * r;
        row_lse[r] = row < d.q_len ? lse[stat0 + row] : INFINITY;
        row_delta[r] = row < d.q_len ? delta[stat0 + row] : 0.f;
        pos[r] = d.q_pos0 + row;
    }
    const int pos_lo = d.q_pos0 + r0, pos_hi = pos_lo + 15;
    float acc[D / 8][4] = {};
    int lo, hi;
    key_range(d, blockIdx.x * FWD_Q, min(blockIdx.x * FWD_Q + FWD_Q, d.q_len) - 1, lo, hi);
    auto tile = [&](const T* ks, const T* vs, int k0) {
#pragma unroll
        for (int sub = 0; sub < KV_TILE / 16; ++sub) {
            const int key_lo = k0 + sub * 16;
            if (none_visible(d, pos_lo, pos_hi, key_lo, key_lo + 15)) continue;
            const bool mask = some_hidden(d, pos_lo, pos_hi, key_lo, key_lo + 15);
            float s[2][4] = {}, dp[2][4] = {};
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                mma_nk<T>(s[0], s[1], qf[kk], ks, LD, sub * 16, kk * 16);
                mma_nk<T>(dp[0], dp[1], dof[kk], vs, LD, sub * 16, kk * 16);
            }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int key = key_lo + nt * 8 + c + i % 2, r = i / 2;
                    const bool vis = !mask || visible(pos[r], key, d.window);
                    const float p = vis ? exp2f(s[nt][i] * d.scale_log2 - row_lse[r]) : 0.f;
                    dp[nt][i] = p * (dp[nt][i] - row_delta[r]);
                }
            uint32_t dsa[4];
            acc_to_a<T>(dsa, dp[0], dp[1]);
            mma_kn_rows<T, D>(acc, dsa, ks, LD, sub * 16);
        }
    };
    for_each_kv_tile<T, D>(reinterpret_cast<T*>(smem_bytes), k + b * sk.b + kvh * sk.h, v + b * sk.b + kvh * sk.h,
                           sk.row, d.kv_len, lo / KV_TILE * KV_TILE, hi, tile);
    const float scale = d.scale_log2 / 1.4426950408889634f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r0 + g + 8 * r;
        if (row >= d.q_len) continue;
        T* out = dq + b * sdq.b + h * sdq.h + row * sdq.row;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
            *reinterpret_cast<uint32_t*>(out + nt * 8 + c) = pack2<T>(acc[nt][2 * r] * scale, acc[nt][2 * r + 1] * scale);
    }
}

#define FLASH_OPS(NAME, T, D)                                                                                      \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                       \
        flash_forward_##NAME##_##D(const T* q, const T* k, const T* v, T* o, float* lse, Dims d, Strides sq,       \
                                   Strides sk, Strides so) {                                                       \
        flash_forward<T, D>(q, k, v, o, lse, d, sq, sk, so);                                                       \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) flash_backward_dkdv_##NAME##_##D(                     \
        const T* q, const T* k, const T* v, const T* d_o, const float* lse, const float* delta, T* dk, T* dv,     \
        Dims d, Strides sq, Strides sk, Strides sdo, Strides sdk) {                                               \
        flash_backward_dkdv<T, D>(q, k, v, d_o, lse, delta, dk, dv, d, sq, sk, sdo, sdk);                          \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) flash_backward_dq_##NAME##_##D(                       \
        const T* q, const T* k, const T* v, const T* d_o, const float* lse, const float* delta, T* dq, Dims d,    \
        Strides sq, Strides sk, Strides sdo, Strides sdq) {                                                       \
        flash_backward_dq<T, D>(q, k, v, d_o, lse, delta, dq, d, sq, sk, sdo, sdq);                                \
    }

FLASH_OPS(f16, __half, 64)
FLASH_OPS(f16, __half, 128)
FLASH_OPS(bf16, __nv_bfloat16, 64)
FLASH_OPS(bf16, __nv_bfloat16, 128)

extern "C" __global__ void attention_delta_f16(const __half* o, const __half* d_o, float* delta, Dims d, int head_dim,
                                               Strides so, Strides sdo) {
    attention_delta<__half>(o, d_o, delta, d, head_dim, so, sdo);
}
extern "C" __global__ void attention_delta_bf16(const __nv_bfloat16* o, const __nv_bfloat16* d_o, float* delta, Dims d,
                                                int head_dim, Strides so, Strides sdo) {
    attention_delta<__nv_bfloat16>(o, d_o, delta, d, head_dim, so, sdo);
}
