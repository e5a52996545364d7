// Causal attention with grouped-query heads and an optional sliding window, forward and backward,
// in the style of FlashAttention-2: scores and probabilities live only in registers, one 16-row
// tile per warp, on the tensor cores (mma.sync m16n8k16, f32 accumulators). The forward keeps the
// row log-sum-exp so that the backward recomputes P exactly. The backward is one kernel per block
// of keys that loops over the query heads of its kv head (dK and dV stay in registers, dQ is added
// into an f32 buffer with atomics); see `flash_backward`. src/model/attention.rs keeps the
// composed version as the reference.
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

#include "dtype.cuh"

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

// The 16x16 A operand at (r0, k0) of A = X^T, X a row-major [k][r] smem tile: A[r][k] = X[k][r].
template <typename T>
__device__ __forceinline__ void ldsm_a_trans(uint32_t a[4], const T* tile, int ld, int r0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4_trans(a, tile + (k0 + l % 8 + l / 16 * 8) * ld + r0 + l / 8 % 2 * 8);
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
template <typename T, int D, int ROWS, int THREADS = WARPS * 32>
__device__ __forceinline__ void load_tile_async(T* tile, const T* src, long long stride_row, int row0, int rows) {
    constexpr int VEC = 8;  // 16-byte copies
    for (int i = threadIdx.x; i < ROWS * D / VEC; i += THREADS) {
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

constexpr int FWD_WARP_ROWS = 32;              // query rows a forward warp owns (two m16 tiles)
constexpr int FWD_Q = WARPS * FWD_WARP_ROWS;  // query rows per forward block
constexpr int KV_TILE = 32;                   // keys per smem stage of the forward

// Dynamic smem of the forward: the block's Q rows, then 2 stages x (K, V) x KV_TILE rows.
template <int D>
constexpr int fwd_smem_elems() {
    return (FWD_Q + 2 * 2 * KV_TILE) * (D + PAD);
}

// Streams the key tiles [k_first, hi) of one kv head through two smem stages and calls
// body(ks, vs, k0) on each, the next tile's copy in flight meanwhile. Copies the caller issued
// before (uncommitted) land with the first tile.
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

// One key tile of the forward for a warp's 32 rows: S = Q K^T, the online softmax, acc += P V.
// Row state per m16 tile m and half r: running max mx, sum l, and the row's position pos.
template <typename T, int D>
__device__ __forceinline__ void forward_tile(const T* qs, const T* ks, const T* vs, int wrow, int k0, const Dims& d,
                                             bool mask, const int pos[2][2], float mx[2][2], float l[2][2],
                                             float acc[2][D / 8][4]) {
    constexpr int LD = D + PAD, NT = KV_TILE / 8;
    const int c = threadIdx.x % 4 * 2;
    float s[2][NT][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) ldsm_a(qa[m], qs, LD, wrow + m * 16, kk * 16);
#pragma unroll
        for (int np = 0; np < KV_TILE / 16; ++np) {
            uint32_t bk[4];
            ldsm_b_nk(bk, ks, LD, np * 16, kk * 16);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                mma<T>(s[m][2 * np], qa[m], bk[0], bk[1]);
                mma<T>(s[m][2 * np + 1], qa[m], bk[2], bk[3]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int key = k0 + nt * 8 + c + i % 2;
                const bool vis = !mask || visible(pos[m][i / 2], key, d.window);
                const float x = vis ? s[m][nt][i] * d.scale_log2 : -INFINITY;
                s[m][nt][i] = x;
                tile_max[i / 2] = fmaxf(tile_max[i / 2], x);
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float m_new = fmaxf(mx[m][r], quad_max(tile_max[r]));
            const float m_use = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = exp2f(mx[m][r] - m_use);
            mx[m][r] = m_new;
            l[m][r] *= alpha;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                acc[m][nt][2 * r] *= alpha;
                acc[m][nt][2 * r + 1] *= alpha;
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                s[m][nt][2 * r] = exp2f(s[m][nt][2 * r] - m_use);
                s[m][nt][2 * r + 1] = exp2f(s[m][nt][2 * r + 1] - m_use);
                l[m][r] += s[m][nt][2 * r] + s[m][nt][2 * r + 1];
            }
        }
    }
#pragma unroll
    for (int kt = 0; kt < KV_TILE / 16; ++kt) {
        uint32_t pa[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) acc_to_a<T>(pa[m], s[m][2 * kt], s[m][2 * kt + 1]);
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            uint32_t bv[4];
            ldsm_b_kn(bv, vs, LD, kt * 16, np * 16);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                mma<T>(acc[m][2 * np], pa[m], bv[0], bv[1]);
                mma<T>(acc[m][2 * np + 1], pa[m], bv[2], bv[3]);
            }
        }
    }
}

// grid (ceil(q_len / FWD_Q), heads, batch); block 128; dynamic smem fwd_smem_elems<D>() elements.
// Each warp owns 32 query rows, so every K and V operand read from smem feeds two MMAs.
template <typename T, int D>
__device__ void flash_forward(const T* q, const T* k, const T* v, T* o, float* lse, Dims d, Strides sq, Strides sk,
                              Strides so) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    constexpr int LD = D + PAD;
    T* qs = reinterpret_cast<T*>(smem_bytes);
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (d.heads / d.kv_heads);
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int q0 = blockIdx.x * FWD_Q, wrow = warp * FWD_WARP_ROWS, r0 = q0 + wrow;
    load_tile_async<T, D, FWD_Q>(qs, q + b * sq.b + h * sq.h, sq.row, q0, d.q_len);  // lands with the first K/V tile

    float acc[2][D / 8][4] = {};
    float mx[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {};
    int pos[2][2];
#pragma unroll
    for (int m = 0; m < 2; ++m)
        for (int r = 0; r < 2; ++r) pos[m][r] = d.q_pos0 + r0 + m * 16 + g + 8 * r;
    const int pos_lo = d.q_pos0 + r0, pos_hi = pos_lo + FWD_WARP_ROWS - 1;

    int lo, hi;
    key_range(d, q0, min(q0 + FWD_Q, d.q_len) - 1, lo, hi);
    auto tile = [&](const T* ks, const T* vs, int k0) {
        if (none_visible(d, pos_lo, pos_hi, k0, k0 + KV_TILE - 1)) return;
        const bool mask = some_hidden(d, pos_lo, pos_hi, k0, k0 + KV_TILE - 1);
        forward_tile<T, D>(qs, ks, vs, wrow, k0, d, mask, pos, mx, l, acc);
    };
    for_each_kv_tile<T, D>(qs + FWD_Q * LD, k + b * sk.b + kvh * sk.h, v + b * sk.b + kvh * sk.h, sk.row, d.kv_len,
                           lo / KV_TILE * KV_TILE, hi, tile);
    cp_async_wait<0>();  // no tile: the Q copy is still the block's to finish
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = r0 + m * 16 + g + 8 * r;
            const float sum = quad_sum(l[m][r]);
            if (row >= d.q_len) continue;
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            T* orow = o + b * so.b + h * so.h + row * so.row;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt)
                *reinterpret_cast<uint32_t*>(orow + nt * 8 + c) =
                    pack2<T>(acc[m][nt][2 * r] * inv, acc[m][nt][2 * r + 1] * inv);
            if (c == 0) lse[((long long)b * d.heads + h) * d.q_len + row] = mx[m][r] + log2f(sum);
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

// --- backward: one kernel per block of keys, FlashAttention-2's order ---
// Each step takes BWD_Q query rows of one query head of the block's kv head and runs three phases
// between block barriers:
//   A  S^T = K Q^T and dP^T = V dO^T, 32 keys x QW queries a warp, then P^T = exp2(S^T scale -
//      lse) and dS^T = P^T (dP^T - delta) into shared memory;
//   B  dV += P^T dO and dK += dS^T Q, 32 keys x DW columns a warp, in registers for the block;
//   C  dQ += dS K, 16 queries x D/2 columns a warp, added into an f32 buffer with atomics (the key
//      blocks of a query row finish in any order).
// S and dP are computed once for all three gradients, and each warp reuses its operands across
// a 32-row tile. Two shapes: 128 keys a block with Q/dO double-buffered (176 KiB of smem at
// D = 128: H100/A100), and 64 keys single-buffered (88 KiB: the ~100 KiB of RTX 3090/4090,
// A6000, L40S).
constexpr int BWD_WARPS = 8;
constexpr int BWD_THREADS = BWD_WARPS * 32;
constexpr int BWD_Q = 64;          // query rows per step
constexpr int LDP = BWD_Q + PAD;  // row length of the P^T and dS^T tiles

template <int D, int KEYS>
struct BwdShape {
    static constexpr int WR = KEYS / 32;       // warp rows (32 keys each) in phases A and B
    static constexpr int WC = BWD_WARPS / WR;  // warp columns
    static constexpr int QW = BWD_Q / WC;      // queries a warp in phase A
    static constexpr int DW = D / WC;          // head-dim columns a warp in phase B
};

// Dynamic smem of the backward kernel in elements of T: K and V of the block, STAGES x (Q, dO),
// P^T and dS^T; then STAGES x (lse, delta) x BWD_Q floats.
template <int D, int KEYS, int STAGES>
constexpr int bwd_smem_elems() {
    return (2 * KEYS + STAGES * 2 * BWD_Q) * (D + PAD) + 2 * KEYS * LDP;
}

// Starts the copies of one step: BWD_Q rows of Q and dO of head h, with their lse and delta.
template <typename T, int D>
__device__ __forceinline__ void load_q_step(T* stage, float* stats, const T* q, const T* d_o, const float* lse,
                                            const float* delta, const Dims& d, const Strides& sq, const Strides& sdo,
                                            int b, int h, int r0) {
    load_tile_async<T, D, BWD_Q, BWD_THREADS>(stage, q + b * sq.b + h * sq.h, sq.row, r0, d.q_len);
    load_tile_async<T, D, BWD_Q, BWD_THREADS>(stage + BWD_Q * (D + PAD), d_o + b * sdo.b + h * sdo.h, sdo.row, r0,
                                              d.q_len);
    cp_async_commit();
    if (threadIdx.x < BWD_Q) {
        const long long row = ((long long)b * d.heads + h) * d.q_len + r0 + threadIdx.x;
        const bool in = r0 + (int)threadIdx.x < d.q_len;
        stats[threadIdx.x] = in ? lse[row] : INFINITY;  // P = exp2(s - inf) = 0 past the rows
        stats[BWD_Q + threadIdx.x] = in ? delta[row] : 0.f;
    }
}

// What one step's phases read: the step's smem tiles and where its queries and keys sit.
template <typename T>
struct BwdStep {
    const T *ks, *vs, *qs, *dos;
    T *pts, *dsts;
    const float *lse, *delta;
    int key0;  // position of the block's first key
    int p0;    // position of the step's first query
};

// Phase A for the warp's 32 keys (wk..) x QW queries (wq..) of the step.
template <typename T, int D, int QW>
__device__ __forceinline__ void bwd_scores(const BwdStep<T>& st, const Dims& d, int wk, int wq) {
    constexpr int LD = D + PAD, NT = QW / 8;
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int kw = st.key0 + wk, qw = st.p0 + wq;
    float s[2][NT][4] = {}, dp[2][NT][4] = {};
    const bool skip = none_visible(d, qw, qw + QW - 1, kw, kw + 31);
    if (!skip) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t ka[2][4], va[2][4];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                ldsm_a(ka[m], st.ks, LD, wk + m * 16, kk * 16);
                ldsm_a(va[m], st.vs, LD, wk + m * 16, kk * 16);
            }
#pragma unroll
            for (int np = 0; np < QW / 16; ++np) {
                uint32_t bq[4], bo[4];
                ldsm_b_nk(bq, st.qs, LD, wq + np * 16, kk * 16);
                ldsm_b_nk(bo, st.dos, LD, wq + np * 16, kk * 16);
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    mma<T>(s[m][2 * np], ka[m], bq[0], bq[1]);
                    mma<T>(s[m][2 * np + 1], ka[m], bq[2], bq[3]);
                    mma<T>(dp[m][2 * np], va[m], bo[0], bo[1]);
                    mma<T>(dp[m][2 * np + 1], va[m], bo[2], bo[3]);
                }
            }
        }
    }
    // element i of tile (m, nt): key wk + m * 16 + g + i / 2 * 8, query wq + nt * 8 + c + i % 2
    const bool mask = some_hidden(d, qw, qw + QW - 1, kw, kw + 31);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int qi = wq + nt * 8 + c + i % 2, key = kw + m * 16 + g + i / 2 * 8;
                const bool vis = !skip && (!mask || visible(st.p0 + qi, key, d.window));
                const float p = vis ? exp2f(s[m][nt][i] * d.scale_log2 - st.lse[qi]) : 0.f;
                s[m][nt][i] = p;
                dp[m][nt][i] = p * (dp[m][nt][i] - st.delta[qi]);
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int at = (wk + m * 16 + g + 8 * r) * LDP + wq + nt * 8 + c;
                *reinterpret_cast<uint32_t*>(st.pts + at) = pack2<T>(s[m][nt][2 * r], s[m][nt][2 * r + 1]);
                *reinterpret_cast<uint32_t*>(st.dsts + at) = pack2<T>(dp[m][nt][2 * r], dp[m][nt][2 * r + 1]);
            }
        }
}

// Phase B: dV (32 keys wk.. x DW columns wd..) += P^T dO and dK += dS^T Q.
template <typename T, int D, int DW>
__device__ __forceinline__ void bwd_dkdv(const BwdStep<T>& st, const Dims& d, int wk, int wd,
                                         float dk_acc[2][DW / 8][4], float dv_acc[2][DW / 8][4]) {
    constexpr int LD = D + PAD;
    if (none_visible(d, st.p0, st.p0 + BWD_Q - 1, st.key0 + wk, st.key0 + wk + 31)) return;
#pragma unroll
    for (int kt = 0; kt < BWD_Q / 16; ++kt) {
        uint32_t pa[2][4], dsa[2][4];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            ldsm_a(pa[m], st.pts, LDP, wk + m * 16, kt * 16);
            ldsm_a(dsa[m], st.dsts, LDP, wk + m * 16, kt * 16);
        }
#pragma unroll
        for (int np = 0; np < DW / 16; ++np) {
            uint32_t bo[4], bq[4];
            ldsm_b_kn(bo, st.dos, LD, kt * 16, wd + np * 16);
            ldsm_b_kn(bq, st.qs, LD, kt * 16, wd + np * 16);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
                mma<T>(dv_acc[m][2 * np], pa[m], bo[0], bo[1]);
                mma<T>(dv_acc[m][2 * np + 1], pa[m], bo[2], bo[3]);
                mma<T>(dk_acc[m][2 * np], dsa[m], bq[0], bq[1]);
                mma<T>(dk_acc[m][2 * np + 1], dsa[m], bq[2], bq[3]);
            }
        }
    }
}

// Phase C: dQ (16 queries wq.. x D/2 columns wd..) += dS K, added into dq_acc rows of head h.
template <typename T, int D, int KEYS>
__device__ __forceinline__ void bwd_dq(const BwdStep<T>& st, const Dims& d, int wq, int wd, float* dq_acc_h,
                                       int row0) {
    constexpr int LD = D + PAD;
    const int qw = st.p0 + wq;
    float acc[D / 16][4] = {};
    bool any = false;
#pragma unroll
    for (int kt = 0; kt < KEYS / 16; ++kt) {
        const int k_lo = st.key0 + kt * 16;
        if (none_visible(d, qw, qw + 15, k_lo, k_lo + 15)) continue;
        any = true;
        uint32_t a[4];
        ldsm_a_trans(a, st.dsts, LDP, wq, kt * 16);
#pragma unroll
        for (int np = 0; np < D / 32; ++np) {
            uint32_t bk[4];
            ldsm_b_kn(bk, st.ks, LD, kt * 16, wd + np * 16);
            mma<T>(acc[2 * np], a, bk[0], bk[1]);
            mma<T>(acc[2 * np + 1], a, bk[2], bk[3]);
        }
    }
    if (!any) return;
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + wq + g + 8 * r;
        if (row >= d.q_len) continue;
        float* out = dq_acc_h + (long long)row * D + wd + c;
#pragma unroll
        for (int nt = 0; nt < D / 16; ++nt) {
            atomicAdd(out + nt * 8, acc[nt][2 * r]);
            atomicAdd(out + nt * 8 + 1, acc[nt][2 * r + 1]);
        }
    }
}

// dK and dV of the warp's keys, from the block's registers.
template <typename T, int DW>
__device__ __forceinline__ void store_dkdv(T* dk, T* dv, const Dims& d, const Strides& sdk, int b, int kvh, int key_w,
                                           int wd, const float dk_acc[2][DW / 8][4], const float dv_acc[2][DW / 8][4]) {
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const float scale = d.scale_log2 / 1.4426950408889634f;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = key_w + m * 16 + g + 8 * r;
            if (key >= d.kv_len) continue;
            const long long off = b * sdk.b + kvh * sdk.h + key * sdk.row + wd + c;
#pragma unroll
            for (int nt = 0; nt < DW / 8; ++nt) {
                *reinterpret_cast<uint32_t*>(dk + off + nt * 8) =
                    pack2<T>(dk_acc[m][nt][2 * r] * scale, dk_acc[m][nt][2 * r + 1] * scale);
                *reinterpret_cast<uint32_t*>(dv + off + nt * 8) =
                    pack2<T>(dv_acc[m][nt][2 * r], dv_acc[m][nt][2 * r + 1]);
            }
        }
}

// grid (ceil(kv_len / KEYS), kv_heads, batch); block BWD_THREADS; dynamic smem
// bwd_smem_elems<D, KEYS, STAGES>() elements of T plus STAGES * 2 * BWD_Q floats. dq_acc is f32
// [batch, heads, q_len, D], zero on entry; dK and dV are summed over the query heads of each kv head.
template <typename T, int D, int KEYS, int STAGES>
__device__ void flash_backward(const T* q, const T* k, const T* v, const T* d_o, const float* lse, const float* delta,
                               T* dk, T* dv, float* dq_acc, Dims d, Strides sq, Strides sk, Strides sdo, Strides sdk) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    using Shape = BwdShape<D, KEYS>;
    constexpr int LD = D + PAD, STAGE = 2 * BWD_Q * LD;
    T* ks = reinterpret_cast<T*>(smem_bytes);
    T* vs = ks + KEYS * LD;
    T* stages = vs + KEYS * LD;
    T* pts = stages + STAGES * STAGE;
    T* dsts = pts + KEYS * LDP;
    float* stats = reinterpret_cast<float*>(dsts + KEYS * LDP);
    const int b = blockIdx.z, kvh = blockIdx.y, n_rep = d.heads / d.kv_heads, warp = threadIdx.x / 32;
    const int key0 = blockIdx.x * KEYS;
    const int wk = warp / Shape::WC * 32, wq_a = warp % Shape::WC * Shape::QW, wd_b = warp % Shape::WC * Shape::DW;
    const int wq_c = warp / 2 * 16, wd_c = warp % 2 * (D / 2);
    load_tile_async<T, D, KEYS, BWD_THREADS>(ks, k + b * sk.b + kvh * sk.h, sk.row, key0, d.kv_len);
    load_tile_async<T, D, KEYS, BWD_THREADS>(vs, v + b * sk.b + kvh * sk.h, sk.row, key0, d.kv_len);
    cp_async_commit();
    float dk_acc[2][Shape::DW / 8][4] = {}, dv_acc[2][Shape::DW / 8][4] = {};

    // Query rows that see any key of the block: pos >= key0 and, with a window, pos < key_last + w.
    const int q_lo = max(0, key0 - d.q_pos0) / BWD_Q * BWD_Q;
    int q_hi = d.q_len;
    if (d.window > 0) q_hi = min(q_hi, key0 + KEYS - 1 + d.window - d.q_pos0);
    const int n_q = q_lo < q_hi ? (q_hi - q_lo + BWD_Q - 1) / BWD_Q : 0;
    const int steps = n_rep * n_q, h0 = kvh * n_rep;
    if (steps > 0) load_q_step<T, D>(stages, stats, q, d_o, lse, delta, d, sq, sdo, b, h0, q_lo);
    for (int i = 0; i < steps; ++i) {
        const int cur = STAGES == 2 ? i % 2 : 0;
        if (STAGES == 2 && i + 1 < steps) {  // the next step's copy overlaps this step's math
            load_q_step<T, D>(stages + (1 - cur) * STAGE, stats + (1 - cur) * 2 * BWD_Q, q, d_o, lse, delta, d, sq,
                              sdo, b, h0 + (i + 1) / n_q, q_lo + (i + 1) % n_q * BWD_Q);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int h = h0 + i / n_q, row0 = q_lo + i % n_q * BWD_Q;
        const T* qs = stages + cur * STAGE;
        const float* lse_s = stats + cur * 2 * BWD_Q;
        const BwdStep<T> st{ks, vs, qs, qs + BWD_Q * LD, pts, dsts, lse_s, lse_s + BWD_Q, key0, d.q_pos0 + row0};
        bwd_scores<T, D, Shape::QW>(st, d, wk, wq_a);
        __syncthreads();
        bwd_dkdv<T, D, Shape::DW>(st, d, wk, wd_b, dk_acc, dv_acc);
        bwd_dq<T, D, KEYS>(st, d, wq_c, wd_c, dq_acc + ((long long)b * d.heads + h) * d.q_len * D, row0);
        __syncthreads();  // the stage, P^T and dS^T are overwritten next step
        if (STAGES == 1 && i + 1 < steps)
            load_q_step<T, D>(stages, stats, q, d_o, lse, delta, d, sq, sdo, b, h0 + (i + 1) / n_q,
                              q_lo + (i + 1) % n_q * BWD_Q);
    }
    cp_async_wait<0>();  // no step: the K/V copy is still the block's to finish
    store_dkdv<T, Shape::DW>(dk, dv, d, sdk, b, kvh, key0 + wk, wd_b, dk_acc, dv_acc);
}

// dq = scale * dq_acc in the compute dtype: one thread per pair of columns.
template <typename T>
__device__ void attention_dq_finish(const float* dq_acc, T* dq, Dims d, int head_dim, Strides sdq) {
    const long long pair = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long rows = (long long)d.batch * d.heads * d.q_len;
    if (pair >= rows * head_dim / 2) return;
    const long long row_id = pair / (head_dim / 2);
    const int col = pair % (head_dim / 2) * 2;
    const int row = row_id % d.q_len, h = row_id / d.q_len % d.heads, b = row_id / d.q_len / d.heads;
    const float scale = d.scale_log2 / 1.4426950408889634f;
    const float2 x = *reinterpret_cast<const float2*>(dq_acc + row_id * head_dim + col);
    *reinterpret_cast<uint32_t*>(dq + b * sdq.b + h * sdq.h + row * sdq.row + col) = pack2<T>(x.x * scale, x.y * scale);
}

#define FLASH_BACKWARD(NAME, T, D, KEYS, STAGES)                                                                    \
    extern "C" __global__ void __launch_bounds__(BWD_THREADS, 1) flash_backward_##NAME##_##D##_k##KEYS(            \
        const T* q, const T* k, const T* v, const T* d_o, const float* lse, const float* delta, T* dk, T* dv,     \
        float* dq_acc, Dims d, Strides sq, Strides sk, Strides sdo, Strides sdk) {                                \
        flash_backward<T, D, KEYS, STAGES>(q, k, v, d_o, lse, delta, dk, dv, dq_acc, d, sq, sk, sdo, sdk);         \
    }

#define FLASH_OPS(NAME, T, D)                                                                                      \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                       \
        flash_forward_##NAME##_##D(const T* q, const T* k, const T* v, T* o, float* lse, Dims d, Strides sq,       \
                                   Strides sk, Strides so) {                                                       \
        flash_forward<T, D>(q, k, v, o, lse, d, sq, sk, so);                                                       \
    }                                                                                                              \
    FLASH_BACKWARD(NAME, T, D, 128, 2)                                                                             \
    FLASH_BACKWARD(NAME, T, D, 64, 1)

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
extern "C" __global__ void attention_dq_finish_f16(const float* dq_acc, __half* dq, Dims d, int head_dim, Strides sdq) {
    attention_dq_finish<__half>(dq_acc, dq, d, head_dim, sdq);
}
extern "C" __global__ void attention_dq_finish_bf16(const float* dq_acc, __nv_bfloat16* dq, Dims d, int head_dim,
                                                    Strides sdq) {
    attention_dq_finish<__nv_bfloat16>(dq_acc, dq, d, head_dim, sdq);
}
