// Causal attention with grouped-query heads and an optional sliding window, forward and backward,
// in the style of FlashAttention-2: scores and probabilities live only in registers, one 16-row
// tile per warp, on the tensor cores (mma.sync m16n8k16, f32 accumulators). The forward keeps the
// row log-sum-exp so that the backward recomputes P exactly; the backward is two kernels (dK/dV
// by key block, looping over the query heads of its kv head, and dQ by query block), so nothing
// needs atomics. src/model/attention.rs keeps the composed version as the reference.
//
// Layout: every tensor is [batch, heads, rows, head_dim] addressed through (b, h, row) strides
// with unit stride along head_dim. Query row i sits at position q_pos0 + i and sees key j when
// j <= pos and, with a window w > 0, pos - j < w (HF Mistral's rule). `lse` is kept in log2 units
// (log2 sum exp2(s * scale * log2 e)).
#include <stdint.h>

#include "../../kernels/dtype.cuh"

#define WARPS 4
#define PAD 8  // smem row padding (elements): spreads a tile's rows over the banks

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
__device__ __forceinline__ uint32_t pair(T lo, T hi) {
    uint16_t l = *reinterpret_cast<uint16_t*>(&lo), h = *reinterpret_cast<uint16_t*>(&hi);
    return (uint32_t)l | ((uint32_t)h << 16);
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

// Fragment of a 16x16 A operand at (r0, k0) of a row-major matrix with leading dimension ld.
// Lane l holds rows l/4 and l/4 + 8, columns 2(l%4) + {0, 1} and + 8.
template <typename T>
__device__ __forceinline__ void load_a(uint32_t a[4], const T* x, int ld, int r0, int k0) {
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    a[0] = *reinterpret_cast<const uint32_t*>(x + (r0 + g) * ld + k0 + c);
    a[1] = *reinterpret_cast<const uint32_t*>(x + (r0 + g + 8) * ld + k0 + c);
    a[2] = *reinterpret_cast<const uint32_t*>(x + (r0 + g) * ld + k0 + c + 8);
    a[3] = *reinterpret_cast<const uint32_t*>(x + (r0 + g + 8) * ld + k0 + c + 8);
}

// B operand (16 k x 8 n) read from a row-major [n][k] matrix: B[k][n] = x[n][k] (contiguous pairs).
template <typename T>
__device__ __forceinline__ void load_b_nk(uint32_t& b0, uint32_t& b1, const T* x, int ld, int n0, int k0) {
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    b0 = *reinterpret_cast<const uint32_t*>(x + (n0 + g) * ld + k0 + c);
    b1 = *reinterpret_cast<const uint32_t*>(x + (n0 + g) * ld + k0 + c + 8);
}

// B operand read from a row-major [k][n] matrix: B[k][n] = x[k][n] (pairs along a column).
template <typename T>
__device__ __forceinline__ void load_b_kn(uint32_t& b0, uint32_t& b1, const T* x, int ld, int k0, int n0) {
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const T* p = x + (k0 + c) * ld + n0 + g;
    b0 = pair<T>(p[0], p[ld]);
    b1 = pair<T>(p[8 * ld], p[9 * ld]);
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

// Copies rows [row0, row0 + ROWS) of one (b, h) slice into smem [ROWS][D + PAD], zeros past `rows`.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void load_tile(T* tile, const T* src, long long stride_row, int row0, int rows) {
    constexpr int VEC = 8;  // 16-byte loads
    for (int i = threadIdx.x; i < ROWS * D / VEC; i += WARPS * 32) {
        const int r = i / (D / VEC), c = i % (D / VEC) * VEC;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row0 + r < rows) v = *reinterpret_cast<const uint4*>(src + (row0 + r) * stride_row + c);
        *reinterpret_cast<uint4*>(tile + r * (D + PAD) + c) = v;
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

constexpr int FWD_Q = WARPS * 16;
constexpr int FWD_K = 64;

// grid (ceil(q_len / 64), heads, batch); block 128.
template <typename T, int D>
__device__ void flash_forward(const T* q, const T* k, const T* v, T* o, float* lse, Dims d, Strides sq, Strides sk,
                              Strides so) {
    __shared__ __align__(16) T ks[FWD_K * (D + PAD)];
    __shared__ __align__(16) T vs[FWD_K * (D + PAD)];
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (d.heads / d.kv_heads);
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int r0 = blockIdx.x * FWD_Q + warp * 16;
    const T* qb = q + b * sq.b + h * sq.h;
    const T* kb = k + b * sk.b + kvh * sk.h;
    const T* vb = v + b * sk.b + kvh * sk.h;

    uint32_t qf[D / 16][4];
    load_rows_a<T, D>(qf, qb, sq.row, r0, d.q_len);
    float acc[D / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int pos[2] = {d.q_pos0 + r0 + g, d.q_pos0 + r0 + g + 8};

    int lo, hi;
    key_range(d, blockIdx.x * FWD_Q, min(blockIdx.x * FWD_Q + FWD_Q, d.q_len) - 1, lo, hi);
    for (int k0 = lo / FWD_K * FWD_K; k0 < hi; k0 += FWD_K) {
        __syncthreads();
        load_tile<T, D, FWD_K>(ks, kb, sk.row, k0, d.kv_len);
        load_tile<T, D, FWD_K>(vs, vb, sk.row, k0, d.kv_len);
        __syncthreads();
        float s[FWD_K / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
            for (int nt = 0; nt < FWD_K / 8; ++nt) {
                uint32_t b0, b1;
                load_b_nk(b0, b1, ks, D + PAD, nt * 8, kk * 16);
                mma<T>(s[nt], qf[kk], b0, b1);
            }
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < FWD_K / 8; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int key = k0 + nt * 8 + c + i % 2;
                const float x = visible(pos[i / 2], key, d.window) ? s[nt][i] * d.scale_log2 : -INFINITY;
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
            for (int nt = 0; nt < FWD_K / 8; ++nt) {
                s[nt][2 * r] = exp2f(s[nt][2 * r] - m_use);
                s[nt][2 * r + 1] = exp2f(s[nt][2 * r + 1] - m_use);
                l[r] += s[nt][2 * r] + s[nt][2 * r + 1];
            }
        }
#pragma unroll
        for (int kt = 0; kt < FWD_K / 16; ++kt) {
            uint32_t pa[4];
            acc_to_a<T>(pa, s[2 * kt], s[2 * kt + 1]);
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                uint32_t b0, b1;
                load_b_kn(b0, b1, vs, D + PAD, kt * 16, nt * 8);
                mma<T>(acc[nt], pa, b0, b1);
            }
        }
    }
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
constexpr int BWD_Q = 16;             // query rows per dK/dV step

// grid (ceil(kv_len / 64), kv_heads, batch); block 128. Each warp owns 16 keys; the block loops
// over the query heads that share its kv head and over the query rows that can see its keys.
template <typename T, int D>
__device__ void flash_backward_dkdv(const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                                    const float* delta, T* dk, T* dv, Dims d, Strides sq, Strides sk, Strides sdo,
                                    Strides sdk) {
    __shared__ __align__(16) T ks[BWD_KEYS * (D + PAD)];
    __shared__ __align__(16) T vs[BWD_KEYS * (D + PAD)];
    __shared__ __align__(16) T qs[BWD_Q * (D + PAD)];
    __shared__ __align__(16) T dos[BWD_Q * (D + PAD)];
    __shared__ float lse_s[BWD_Q], delta_s[BWD_Q];
    const int b = blockIdx.z, kvh = blockIdx.y, n_rep = d.heads / d.kv_heads;
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int key0 = blockIdx.x * BWD_KEYS, wkey0 = warp * 16;
    load_tile<T, D, BWD_KEYS>(ks, k + b * sk.b + kvh * sk.h, sk.row, key0, d.kv_len);
    load_tile<T, D, BWD_KEYS>(vs, v + b * sk.b + kvh * sk.h, sk.row, key0, d.kv_len);
    float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
    const int keys[2] = {key0 + wkey0 + g, key0 + wkey0 + g + 8};

    // Query rows that see any key of the block: pos >= key0 and, with a window, pos < key_last + w.
    const int q_lo = max(0, key0 - d.q_pos0) / BWD_Q * BWD_Q;
    int q_hi = d.q_len;
    if (d.window > 0) q_hi = min(q_hi, key0 + BWD_KEYS - 1 + d.window - d.q_pos0);
    for (int h = kvh * n_rep; h < (kvh + 1) * n_rep; ++h) {
        const T* qb = q + b * sq.b + h * sq.h;
        const T* dob = d_o + b * sdo.b + h * sdo.h;
        const long long stat0 = ((long long)b * d.heads + h) * d.q_len;
        for (int r0 = q_lo; r0 < q_hi; r0 += BWD_Q) {
            __syncthreads();
            load_tile<T, D, BWD_Q>(qs, qb, sq.row, r0, d.q_len);
            load_tile<T, D, BWD_Q>(dos, dob, sdo.row, r0, d.q_len);
            if (threadIdx.x < BWD_Q) {
                const bool in = r0 + threadIdx.x < d.q_len;
                lse_s[threadIdx.x] = in ? lse[stat0 + r0 + threadIdx.x] : INFINITY;
                delta_s[threadIdx.x] = in ? delta[stat0 + r0 + threadIdx.x] : 0.f;
            }
            __syncthreads();
            // S^T (16 keys x 16 queries) = K_w Q^T and dP^T = V_w dO^T.
            float st[2][4] = {}, dpt[2][4] = {};
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                uint32_t ka[4], va[4];
                load_a(ka, ks, D + PAD, wkey0, kk * 16);
                load_a(va, vs, D + PAD, wkey0, kk * 16);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    uint32_t b0, b1;
                    load_b_nk(b0, b1, qs, D + PAD, nt * 8, kk * 16);
                    mma<T>(st[nt], ka, b0, b1);
                    load_b_nk(b0, b1, dos, D + PAD, nt * 8, kk * 16);
                    mma<T>(dpt[nt], va, b0, b1);
                }
            }
            // P^T = exp2(S^T scale - lse), dS^T = P^T (dP^T - delta); element i of tile nt is
            // key keys[i / 2], query r0 + nt * 8 + c + i % 2.
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int qi = nt * 8 + c + i % 2;
                    const bool vis = visible(d.q_pos0 + r0 + qi, keys[i / 2], d.window);
                    const float p = vis ? exp2f(st[nt][i] * d.scale_log2 - lse_s[qi]) : 0.f;
                    st[nt][i] = p;
                    dpt[nt][i] = p * (dpt[nt][i] - delta_s[qi]);
                }
            uint32_t pa[4], dsa[4];
            acc_to_a<T>(pa, st[0], st[1]);
            acc_to_a<T>(dsa, dpt[0], dpt[1]);
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                uint32_t b0, b1;
                load_b_kn(b0, b1, dos, D + PAD, 0, nt * 8);
                mma<T>(dv_acc[nt], pa, b0, b1);
                load_b_kn(b0, b1, qs, D + PAD, 0, nt * 8);
                mma<T>(dk_acc[nt], dsa, b0, b1);
            }
        }
    }
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

constexpr int BWD_DQ_K = 64;  // keys per dQ step

// grid (ceil(q_len / 64), heads, batch); block 128. Each warp owns 16 query rows.
template <typename T, int D>
__device__ void flash_backward_dq(const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                                  const float* delta, T* dq, Dims d, Strides sq, Strides sk, Strides sdo, Strides sdq) {
    __shared__ __align__(16) T ks[BWD_DQ_K * (D + PAD)];
    __shared__ __align__(16) T vs[BWD_DQ_K * (D + PAD)];
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
    float acc[D / 8][4] = {};
    const T* kb = k + b * sk.b + kvh * sk.h;
    const T* vb = v + b * sk.b + kvh * sk.h;
    int lo, hi;
    key_range(d, blockIdx.x * FWD_Q, min(blockIdx.x * FWD_Q + FWD_Q, d.q_len) - 1, lo, hi);
    for (int k0 = lo / BWD_DQ_K * BWD_DQ_K; k0 < hi; k0 += BWD_DQ_K) {
        __syncthreads();
        load_tile<T, D, BWD_DQ_K>(ks, kb, sk.row, k0, d.kv_len);
        load_tile<T, D, BWD_DQ_K>(vs, vb, sk.row, k0, d.kv_len);
        __syncthreads();
#pragma unroll
        for (int sub = 0; sub < BWD_DQ_K / 16; ++sub) {
            float s[2][4] = {}, dp[2][4] = {};
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    uint32_t b0, b1;
                    load_b_nk(b0, b1, ks, D + PAD, sub * 16 + nt * 8, kk * 16);
                    mma<T>(s[nt], qf[kk], b0, b1);
                    load_b_nk(b0, b1, vs, D + PAD, sub * 16 + nt * 8, kk * 16);
                    mma<T>(dp[nt], dof[kk], b0, b1);
                }
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int key = k0 + sub * 16 + nt * 8 + c + i % 2, r = i / 2;
                    const float p =
                        visible(pos[r], key, d.window) ? exp2f(s[nt][i] * d.scale_log2 - row_lse[r]) : 0.f;
                    dp[nt][i] = p * (dp[nt][i] - row_delta[r]);
                }
            uint32_t dsa[4];
            acc_to_a<T>(dsa, dp[0], dp[1]);
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                uint32_t b0, b1;
                load_b_kn(b0, b1, ks, D + PAD, sub * 16, nt * 8);
                mma<T>(acc[nt], dsa, b0, b1);
            }
        }
    }
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
