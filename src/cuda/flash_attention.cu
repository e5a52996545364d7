// Causal attention with grouped-query heads and an optional sliding window, forward and backward,
// in the style of FlashAttention-2: scores and probabilities live only in registers, one 16-row
// tile per warp, on the tensor cores (mma.sync m16n8k16, f32 accumulators). The forward keeps the
// row log-sum-exp so that the backward recomputes P exactly. The backward is one kernel per block
// of keys that loops over the query heads of its kv head (dK and dV stay in registers, dQ is added
// into an f32 buffer with atomics); see `flash_backward`. src/model/ops/attention/composed.rs keeps the
// composed version as the reference.
//
// Tiles reach shared memory by cp.async, two stages deep (the next tile's copy overlaps the
// current tile's math), and the tensor-core operands leave it by ldmatrix (.trans for the [k][n]
// operands V, dO, Q and K), one instruction per pair of 16x8 tiles. Tiles that every row of a
// warp sees whole skip the mask; tiles no row of a warp sees are skipped.
//
// Layout, the visibility rule and packed rows (varlen attention): see flash_common.cuh.
#include "flash_common.cuh"

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
// Row state per m16 tile m and half r: running max mx, sum l, the row's position pos and its
// first visible key first.
template <typename T, int D, bool PACKED>
__device__ __forceinline__ void forward_tile(const T* qs, const T* ks, const T* vs, int wrow, int k0, const Dims& d,
                                             bool mask, const int pos[2][2], const int first[2][2], float mx[2][2],
                                             float l[2][2], float acc[2][D / 8][4]) {
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
                const bool vis = !mask || (PACKED ? visible_from(pos[m][i / 2], first[m][i / 2], key)
                                                  : visible(pos[m][i / 2], key, d.window));
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
template <typename T, int D, bool PACKED>
__device__ void flash_forward(const T* q, const T* k, const T* v, T* o, float* lse, Dims d, Strides sq, Strides sk,
                              Strides so, const int* spans) {
    extern __shared__ __align__(16) unsigned char smem_bytes[];
    constexpr int LD = D + PAD;
    T* qs = reinterpret_cast<T*>(smem_bytes);
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / (d.heads / d.kv_heads);
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int q0 = blockIdx.x * FWD_Q, wrow = warp * FWD_WARP_ROWS, r0 = q0 + wrow;
    load_tile_async<T, D, FWD_Q>(qs, q + b * sq.b + h * sq.h, sq.row, q0, d.q_len);  // lands with the first K/V tile

    float acc[2][D / 8][4] = {};
    float mx[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}}, l[2][2] = {};
    int pos[2][2], first[2][2] = {};
#pragma unroll
    for (int m = 0; m < 2; ++m)
        for (int r = 0; r < 2; ++r) {
            const int row = r0 + m * 16 + g + 8 * r;
            pos[m][r] = d.q_pos0 + row;
            if (PACKED) first[m][r] = first_key(d, spans, b, row);
        }
    const int pos_lo = d.q_pos0 + r0, pos_hi = pos_lo + FWD_WARP_ROWS - 1;
    int first_lo = 0, first_hi = 0;
    if (PACKED) {
        first_lo = first_key(d, spans, b, r0);
        first_hi = first_key(d, spans, b, r0 + FWD_WARP_ROWS - 1);
    }

    int lo, hi;
    key_range(d, q0, min(q0 + FWD_Q, d.q_len) - 1, lo, hi);
    if (PACKED) lo = first_key(d, spans, b, q0);  // packed, from the span start of the block's first row
    auto tile = [&](const T* ks, const T* vs, int k0) {
        const int k1 = k0 + KV_TILE - 1;
        if (PACKED ? none_visible_from(pos_hi, first_lo, k0, k1) : none_visible(d, pos_lo, pos_hi, k0, k1)) return;
        const bool mask = PACKED ? some_hidden_from(pos_lo, first_hi, k0, k1) : some_hidden(d, pos_lo, pos_hi, k0, k1);
        forward_tile<T, D, PACKED>(qs, ks, vs, wrow, k0, d, mask, pos, first, mx, l, acc);
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

// --- backward: see flash_backward.cuh for its shapes and phases ---
#include "flash_backward.cuh"

// grid (ceil(kv_len / KEYS), kv_heads, batch); block BWD_THREADS; dynamic smem
// bwd_smem_elems<D, KEYS, STAGES>() elements of T plus STAGES * 3 * BWD_Q floats. dq_acc is f32
// [batch, heads, q_len, D], zero on entry; dK and dV are summed over the query heads of each kv head.
template <typename T, int D, int KEYS, int STAGES, bool PACKED>
__device__ void flash_backward(const T* q, const T* k, const T* v, const T* d_o, const float* lse, const float* delta,
                               T* dk, T* dv, float* dq_acc, Dims d, Strides sq, Strides sk, Strides sdo, Strides sdk,
                               const int* spans) {
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

    // Query rows that see any key of the block: pos >= key0 and, with a window, pos < key_last + w;
    // packed, rows before the end of the last key's span.
    const int q_lo = max(0, key0 - d.q_pos0) / BWD_Q * BWD_Q;
    int q_hi = d.q_len;
    if (d.window > 0) q_hi = min(q_hi, key0 + KEYS - 1 + d.window - d.q_pos0);
    if (PACKED) {
        const int key_last = min(key0 + KEYS, d.kv_len) - 1;
        q_hi = min(q_hi, spans[2 * ((long long)b * d.kv_len + key_last) + 1] - d.q_pos0);
    }
    const int n_q = q_lo < q_hi ? (q_hi - q_lo + BWD_Q - 1) / BWD_Q : 0;
    const int steps = n_rep * n_q, h0 = kvh * n_rep;
    if (steps > 0) load_q_step<T, D, PACKED>(stages, stats, q, d_o, lse, delta, spans, d, sq, sdo, b, h0, q_lo);
    for (int i = 0; i < steps; ++i) {
        const int cur = STAGES == 2 ? i % 2 : 0;
        if (STAGES == 2 && i + 1 < steps) {  // the next step's copy overlaps this step's math
            load_q_step<T, D, PACKED>(stages + (1 - cur) * STAGE, stats + (1 - cur) * 3 * BWD_Q, q, d_o, lse, delta,
                                      spans, d, sq, sdo, b, h0 + (i + 1) / n_q, q_lo + (i + 1) % n_q * BWD_Q);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int h = h0 + i / n_q, row0 = q_lo + i % n_q * BWD_Q;
        const T* qs = stages + cur * STAGE;
        const float* lse_s = stats + cur * 3 * BWD_Q;
        const int* first_s = reinterpret_cast<const int*>(lse_s + 2 * BWD_Q);
        const BwdStep<T> st{ks, vs, qs, qs + BWD_Q * LD, pts, dsts, lse_s, lse_s + BWD_Q, first_s, key0,
                            d.q_pos0 + row0};
        bwd_scores<T, D, Shape::QW, PACKED>(st, d, wk, wq_a);
        __syncthreads();
        bwd_dkdv<T, D, Shape::DW, PACKED>(st, d, wk, wd_b, dk_acc, dv_acc);
        bwd_dq<T, D, KEYS, PACKED>(st, d, wq_c, wd_c, dq_acc + ((long long)b * d.heads + h) * d.q_len * D, row0);
        __syncthreads();  // the stage, P^T and dS^T are overwritten next step
        if (STAGES == 1 && i + 1 < steps)
            load_q_step<T, D, PACKED>(stages, stats, q, d_o, lse, delta, spans, d, sq, sdo, b, h0 + (i + 1) / n_q,
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

// Each kernel twice: for rows of one sequence, and `_packed` for packed rows (reads `spans`).
#define FLASH_BACKWARD(NAME, T, D, KEYS, STAGES, TAIL, PACKED)                                                     \
    extern "C" __global__ void __launch_bounds__(BWD_THREADS, 1) flash_backward_##NAME##_##D##_k##KEYS##TAIL(      \
        const T* q, const T* k, const T* v, const T* d_o, const float* lse, const float* delta, T* dk, T* dv,     \
        float* dq_acc, Dims d, Strides sq, Strides sk, Strides sdo, Strides sdk, const int* spans) {              \
        flash_backward<T, D, KEYS, STAGES, PACKED>(q, k, v, d_o, lse, delta, dk, dv, dq_acc, d, sq, sk, sdo, sdk,  \
                                                   spans);                                                         \
    }

#define FLASH_FORWARD(NAME, T, D, TAIL, PACKED)                                                                    \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                                       \
        flash_forward_##NAME##_##D##TAIL(const T* q, const T* k, const T* v, T* o, float* lse, Dims d, Strides sq, \
                                         Strides sk, Strides so, const int* spans) {                               \
        flash_forward<T, D, PACKED>(q, k, v, o, lse, d, sq, sk, so, spans);                                        \
    }

#define FLASH_OPS(NAME, T, D)                       \
    FLASH_FORWARD(NAME, T, D, , false)              \
    FLASH_FORWARD(NAME, T, D, _packed, true)        \
    FLASH_BACKWARD(NAME, T, D, 128, 2, , false)     \
    FLASH_BACKWARD(NAME, T, D, 128, 2, _packed, true) \
    FLASH_BACKWARD(NAME, T, D, 64, 1, , false)      \
    FLASH_BACKWARD(NAME, T, D, 64, 1, _packed, true)

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
