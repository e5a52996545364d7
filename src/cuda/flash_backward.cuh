// The phases of the flash attention backward (flash_attention.cu's `flash_backward` runs them):
// its block shapes, the per-step copies and the three phases of one step.
#pragma once
#include "flash_common.cuh"

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
// P^T and dS^T; then STAGES x (lse, delta, first key) x BWD_Q floats (the first keys as int).
template <int D, int KEYS, int STAGES>
constexpr int bwd_smem_elems() {
    return (2 * KEYS + STAGES * 2 * BWD_Q) * (D + PAD) + 2 * KEYS * LDP;
}

// Starts the copies of one step: BWD_Q rows of Q and dO of head h, with their lse, delta and
// first visible key.
template <typename T, int D, bool PACKED>
__device__ __forceinline__ void load_q_step(T* stage, float* stats, const T* q, const T* d_o, const float* lse,
                                            const float* delta, const int* spans, const Dims& d, const Strides& sq,
                                            const Strides& sdo, int b, int h, int r0) {
    load_tile_async<T, D, BWD_Q, BWD_THREADS>(stage, q + b * sq.b + h * sq.h, sq.row, r0, d.q_len);
    load_tile_async<T, D, BWD_Q, BWD_THREADS>(stage + BWD_Q * (D + PAD), d_o + b * sdo.b + h * sdo.h, sdo.row, r0,
                                              d.q_len);
    cp_async_commit();
    if (threadIdx.x < BWD_Q) {
        const long long row = ((long long)b * d.heads + h) * d.q_len + r0 + threadIdx.x;
        const bool in = r0 + (int)threadIdx.x < d.q_len;
        stats[threadIdx.x] = in ? lse[row] : INFINITY;  // P = exp2(s - inf) = 0 past the rows
        stats[BWD_Q + threadIdx.x] = in ? delta[row] : 0.f;
        if (PACKED) reinterpret_cast<int*>(stats)[2 * BWD_Q + threadIdx.x] = first_key(d, spans, b, r0 + threadIdx.x);
    }
}

// What one step's phases read: the step's smem tiles and where its queries and keys sit.
template <typename T>
struct BwdStep {
    const T *ks, *vs, *qs, *dos;
    T *pts, *dsts;
    const float *lse, *delta;
    const int* first;  // first visible key of each of the step's queries (packed rows)
    int key0;          // position of the block's first key
    int p0;            // position of the step's first query
};

// Phase A for the warp's 32 keys (wk..) x QW queries (wq..) of the step.
template <typename T, int D, int QW, bool PACKED>
__device__ __forceinline__ void bwd_scores(const BwdStep<T>& st, const Dims& d, int wk, int wq) {
    constexpr int LD = D + PAD, NT = QW / 8;
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    const int kw = st.key0 + wk, qw = st.p0 + wq;
    float s[2][NT][4] = {}, dp[2][NT][4] = {};
    const bool skip = PACKED ? none_visible_from(qw + QW - 1, st.first[wq], kw, kw + 31)
                             : none_visible(d, qw, qw + QW - 1, kw, kw + 31);
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
    const bool mask = PACKED ? some_hidden_from(qw, st.first[wq + QW - 1], kw, kw + 31)
                             : some_hidden(d, qw, qw + QW - 1, kw, kw + 31);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int qi = wq + nt * 8 + c + i % 2, key = kw + m * 16 + g + i / 2 * 8;
                const bool vis = !skip && (!mask || (PACKED ? visible_from(st.p0 + qi, st.first[qi], key)
                                                            : visible(st.p0 + qi, key, d.window)));
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
template <typename T, int D, int DW, bool PACKED>
__device__ __forceinline__ void bwd_dkdv(const BwdStep<T>& st, const Dims& d, int wk, int wd,
                                         float dk_acc[2][DW / 8][4], float dv_acc[2][DW / 8][4]) {
    constexpr int LD = D + PAD;
    const int k_lo = st.key0 + wk, k_hi = k_lo + 31, p_hi = st.p0 + BWD_Q - 1;
    if (PACKED ? none_visible_from(p_hi, st.first[0], k_lo, k_hi) : none_visible(d, st.p0, p_hi, k_lo, k_hi)) return;
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
template <typename T, int D, int KEYS, bool PACKED>
__device__ __forceinline__ void bwd_dq(const BwdStep<T>& st, const Dims& d, int wq, int wd, float* dq_acc_h,
                                       int row0) {
    constexpr int LD = D + PAD;
    const int qw = st.p0 + wq;
    float acc[D / 16][4] = {};
    bool any = false;
#pragma unroll
    for (int kt = 0; kt < KEYS / 16; ++kt) {
        const int k_lo = st.key0 + kt * 16;
        if (PACKED ? none_visible_from(qw + 15, st.first[wq], k_lo, k_lo + 15)
                   : none_visible(d, qw, qw + 15, k_lo, k_lo + 15))
            continue;
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
