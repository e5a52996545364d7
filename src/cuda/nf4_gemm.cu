// NF4 skinny GEMM on tensor cores: y[m, n] (+)= x[m, k] · W[n, k]ᵀ for batches of up to 256
// rows (decode steps past the GEMV's 8 rows, short prefills), reading W's packed NF4 codes and
// its absmax (plain f32 or double-quantized) directly: no 16-bit copy of the weight is written.
//
// Each weight value is decoded exactly as nf4_dequantize (nf4.cu) decodes it — the same
// codebook, the same absmax restore, code * absmax in f32 rounded once to the compute dtype —
// and the products are summed in f32 by mma.sync, so the result is the dequantize + GEMM path's
// up to summation order. Compiled with --use_fast_math, as nf4.cu is, for the same flush to zero.
//
// Layout: a block of 8 warps owns GEMM_BN output columns (rows of W) and all m rows of x, padded
// to 16 * MT, over a range of k (the whole of it, or one split of it: then each split writes
// f32 partial sums that nf4_gemm_reduce adds up). It walks its k range in chunks of 64 — one
// absmax block of each W row — through a cp.async pipeline of STAGES chunks: the chunk's packed
// codes (64 rows × 32 bytes) and its x tile (16-bit, as it is in memory) are copied into shared
// memory ahead of use; then the 256 threads decode the chunk's codes (16 values each) into one
// 16-bit W tile in shared memory, and each warp multiplies its 16-column slice of the tile by
// its m tiles with mma.sync m16n8k16 (ldmatrix operands, f32 accumulators in registers).
// src/cuda/nf4_gemm.rs launches these.
#include <stdint.h>

#include "dtype.cuh"
#include "mma.cuh"
#include "nf4_tables.cuh"

#define GEMM_THREADS 256
// output columns (rows of W) per block
#define GEMM_BN 64
// k per pipeline stage: one absmax block of each W row
#define GEMM_KC 64
// shared-memory row pitch in elements: 144 bytes, so the 8 rows an ldmatrix phase reads fall on
// different banks
#define GEMM_LD (GEMM_KC + 8)
// packed bytes of one chunk's W rows
#define GEMM_CODE_BYTES (GEMM_BN * GEMM_KC / 2)

// Pipeline depth by m tiles: four chunks in flight, three for the largest batches, whose x
// tiles would otherwise outgrow an A100's shared memory. nf4_gemm.rs mirrors this (stages()).
template <int MT>
struct GemmShape {
    static constexpr int STAGES = MT <= 8 ? 4 : 3;
    static constexpr int ROWS = 16 * MT;
};

// `codes == nullptr`: the absmax values are plain f32 (`absmax`); otherwise double-quantized.
// `partial == nullptr`: y (+)= the block's sums (`accumulate`: y read in f32, the sum rounded
// once); else the sums of split blockIdx.y go to partial[blockIdx.y][m][n] in f32.
template <typename T, int MT>
__device__ void nf4_gemm(const T* __restrict__ x, const uint8_t* __restrict__ packed,
                         const float* __restrict__ absmax, const uint8_t* __restrict__ codes,
                         const float* __restrict__ absmax2, float offset, T* y, float* partial, int m, int n,
                         int k, int chunks_per_split, int accumulate) {
    constexpr int STAGES = GemmShape<MT>::STAGES, ROWS = GemmShape<MT>::ROWS;
    // m tiles per warp: warps 0-3 take the even ones, 4-7 the odd ones
    constexpr int TILES = (MT + 1) / 2;
    extern __shared__ uint4 gemm_smem[];
    T* xs = reinterpret_cast<T*>(gemm_smem);                                       // [STAGES][ROWS][LD]
    T* ws = xs + STAGES * ROWS * GEMM_LD;                                          // [BN][LD]
    uint8_t* cs = reinterpret_cast<uint8_t*>(ws + GEMM_BN * GEMM_LD);              // [STAGES][BN][32]
    __shared__ float lut[16];
    __shared__ float dmap[256];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n0 = blockIdx.x * GEMM_BN;
    const int chunks = k / GEMM_KC;
    const int c_begin = blockIdx.y * chunks_per_split;
    const int count = min(chunks_per_split, chunks - c_begin);
    if (tid < 16) lut[tid] = NF4_CODE[tid];
    if (codes != nullptr) dmap[tid] = DYNAMIC_MAP[tid];

    // Chunk c's codes and x tile into stage s; rows past n and m are zero-filled.
    auto load = [&](int s, int c) {
        const int k0 = c * GEMM_KC;
        if (tid < GEMM_BN * 2) {
            const int r = tid >> 1, half = tid & 1, row = n0 + r;
            const bool ok = row < n;
            const uint8_t* src = packed + ((int64_t)(ok ? row : 0) * k + k0) / 2 + 16 * half;
            cp_async16(cs + (s * GEMM_BN + r) * (GEMM_KC / 2) + 16 * half, src, ok);
        }
#pragma unroll
        for (int i = tid; i < ROWS * (GEMM_KC / 8); i += GEMM_THREADS) {
            const int r = i / (GEMM_KC / 8), v = i % (GEMM_KC / 8);
            const bool ok = r < m;
            const T* src = x + (int64_t)(ok ? r : 0) * k + k0 + 8 * v;
            cp_async16(xs + (s * ROWS + r) * GEMM_LD + 8 * v, src, ok);
        }
    };

    // The decoding thread's W row and its 16 values of the chunk; the row's absmax for the next
    // chunk is fetched one chunk ahead, raw (restored when its chunk comes).
    const int drow = tid >> 2, dpart = tid & 3;
    const bool dlive = n0 + drow < n;
    const int64_t row_blocks = (int64_t)(n0 + drow) * chunks;
    float raw_scale = 0.0f;
    uint32_t raw_code = 0;
    auto fetch = [&](int c) {
        if (!dlive) return;
        const int64_t block = row_blocks + c;
        if (codes != nullptr) {
            raw_code = __ldg(codes + block);
            raw_scale = __ldg(absmax2 + block / DQ_BLOCK);
        } else {
            raw_scale = __ldg(absmax + block);
        }
    };

    float acc[TILES][2][4];
#pragma unroll
    for (int i = 0; i < TILES; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < count) load(s, c_begin + s);
        cp_async_commit();
    }
    fetch(c_begin);

    const int nt = warp & 3, mt0 = warp >> 2;
    for (int it = 0; it < count; it++) {
        // chunk `it` has landed (this thread's copies, then everyone's), every warp is done with
        // the previous chunk's tiles, and (the first time) the tables are written
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        {
            const int next = it + STAGES - 1;
            if (next < count) load(next % STAGES, c_begin + next);
            cp_async_commit();
        }
        const int s = it % STAGES;
        float amax = 0.0f;
        if (dlive) amax = codes != nullptr ? restore_absmax(dmap[raw_code], raw_scale, offset) : raw_scale;
        if (it + 1 < count) fetch(c_begin + it + 1);
        {
            // a byte holds two values, the first in its high nibble; each value is
            // code * absmax in f32, rounded once to T, as the dequantize kernel stores it
            const uint2 q = *reinterpret_cast<const uint2*>(cs + (s * GEMM_BN + drow) * (GEMM_KC / 2) + 8 * dpart);
            uint32_t w[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t b = ((j < 4 ? q.x : q.y) >> (8 * (j & 3))) & 0xFF;
                w[j] = pack2<T>(lut[b >> 4] * amax, lut[b & 15] * amax);
            }
            uint4* dst = reinterpret_cast<uint4*>(ws + drow * GEMM_LD + 16 * dpart);
            dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
            dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        }
        __syncthreads();
        const T* xst = xs + s * ROWS * GEMM_LD;
#pragma unroll
        for (int kk = 0; kk < GEMM_KC / 16; kk++) {
            uint32_t b[4];
            ldsm_b_nk<T>(b, ws, GEMM_LD, 16 * nt, 16 * kk);
#pragma unroll
            for (int i = 0; i < TILES; i++) {
                const int mt = mt0 + 2 * i;
                if (mt < MT) {
                    uint32_t a[4];
                    ldsm_a<T>(a, xst, GEMM_LD, 16 * mt, 16 * kk);
                    mma<T>(acc[i][0], a, b[0], b[1]);
                    mma<T>(acc[i][1], a, b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    // the m16n8 accumulator layout: c[0], c[1] at row lane / 4, columns 2 * (lane % 4) + 0, 1;
    // c[2], c[3] eight rows below
#pragma unroll
    for (int i = 0; i < TILES; i++) {
        const int mt = mt0 + 2 * i;
        if (mt >= MT) continue;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = 16 * mt + lane / 4 + 8 * h;
                const int col = n0 + 16 * nt + 8 * j + 2 * (lane % 4);
                if (row >= m) continue;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (col + e >= n) continue;
                    const float v = acc[i][j][2 * h + e];
                    const int64_t at = (int64_t)row * n + col + e;
                    if (partial != nullptr) {
                        partial[(int64_t)blockIdx.y * m * n + at] = v;
                    } else {
                        T* dst = y + at;
                        store(dst, accumulate ? __fadd_rn(v, to_f32(*dst)) : v);
                    }
                }
            }
    }
}

// The splits' partial sums of each of `len` outputs, added in split order, then stored to y
// (added to it with `accumulate`, the sum rounded once).
template <typename T>
__device__ void nf4_gemm_reduce(const float* partial, int splits, T* y, int64_t len, int accumulate) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float v = partial[i];
    for (int s = 1; s < splits; s++) v = __fadd_rn(v, partial[s * len + i]);
    store(y + i, accumulate ? __fadd_rn(v, to_f32(y[i])) : v);
}

#define NF4_GEMM(NAME, T, MT)                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS)                                          \
        nf4_gemm_##NAME##_##MT(const T* x, const uint8_t* packed, const float* absmax, const uint8_t* codes, \
                               const float* absmax2, float offset, T* y, float* partial, int m, int n, int k, \
                               int chunks_per_split, int accumulate) {                                  \
        nf4_gemm<T, MT>(x, packed, absmax, codes, absmax2, offset, y, partial, m, n, k, chunks_per_split,   \
                        accumulate);                                                                    \
    }
#define NF4_GEMM_TILES(NAME, T)                                                                         \
    NF4_GEMM(NAME, T, 1)                                                                                \
    NF4_GEMM(NAME, T, 2)                                                                                \
    NF4_GEMM(NAME, T, 3)                                                                                \
    NF4_GEMM(NAME, T, 4)                                                                                \
    NF4_GEMM(NAME, T, 5)                                                                                \
    NF4_GEMM(NAME, T, 6)                                                                                \
    NF4_GEMM(NAME, T, 7)                                                                                \
    NF4_GEMM(NAME, T, 8)                                                                                \
    NF4_GEMM(NAME, T, 9)                                                                                \
    NF4_GEMM(NAME, T, 10)                                                                               \
    NF4_GEMM(NAME, T, 11)                                                                               \
    NF4_GEMM(NAME, T, 12)                                                                               \
    NF4_GEMM(NAME, T, 13)                                                                               \
    NF4_GEMM(NAME, T, 14)                                                                               \
    NF4_GEMM(NAME, T, 15)                                                                               \
    NF4_GEMM(NAME, T, 16)                                                                               \
    extern "C" __global__ void nf4_gemm_reduce_##NAME(const float* partial, int splits, T* y, int64_t len,  \
                                                      int accumulate) {                                 \
        nf4_gemm_reduce<T>(partial, splits, y, len, accumulate);                                        \
    }

NF4_GEMM_TILES(f16, __half)
NF4_GEMM_TILES(bf16, __nv_bfloat16)
