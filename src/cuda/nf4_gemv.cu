// NF4 GEMV / skinny GEMM: y[n, out] = x[n, in] · Wᵀ for n = 1..8 rows (a decode batch), reading
// W's packed NF4 codes and its absmax (plain f32 or double-quantized) directly: no 16-bit copy
// of the weight is written, and the weight is read once for all n rows.
//
// Each weight value is decoded exactly as nf4_dequantize (nf4.cu) decodes it — the same
// codebook, the same absmax restore, code * absmax in f32 rounded once to the compute dtype —
// and multiplied with x in f32, so the product is the dequantize + GEMM path's up to summation
// order. Compiled with --use_fast_math, as nf4.cu is, for the same flush-to-zero products.
//
// Layout: a block of 8 warps; each warp owns R consecutive output rows and its lanes stride
// over the row in 32-value chunks (one 16-byte load of 16 packed bytes per row per chunk, all
// inside one 64-value absmax block, whose absmax is decoded once per chunk). x is staged in
// shared memory as f32, a tile of columns at a time when n × in does not fit, and each chunk of
// x read from it serves the R rows of the warp. The lanes' partial sums end in a warp-shuffle
// reduction. src/cuda/nf4_gemv.rs launches these.
#include <stdint.h>

#include "dtype.cuh"
#include "nf4_tables.cuh"

#define GEMV_WARPS 8
#define GEMV_THREADS (GEMV_WARPS * 32)

// Rows per warp and chunks per lane in flight, by batch rows: more rows per warp for larger
// batches (each x chunk read from shared memory then feeds more products), more chunks at once
// for small ones (more bytes in flight per lane). nf4_gemv.rs mirrors ROWS_PER_WARP.
template <int N>
struct GemvShape {
    static constexpr int R = N <= 2 ? 2 : 4;
    static constexpr int U = N <= 2 ? 2 : 1;
};

// The staged x: 4 floats of padding after every 32 columns, so the lanes of a warp (each on
// its own 32-column chunk) read different banks.
__device__ __forceinline__ int padded(int k) { return k + (k >> 5) * 4; }

// The value in the compute dtype, back in f32: what the dequantize kernel stores.
__device__ __forceinline__ float rounded(float v, const __half*) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float rounded(float v, const __nv_bfloat16*) {
    return __bfloat162float(__float2bfloat16_rn(v));
}

__device__ __forceinline__ uint32_t word_of(const uint4& q, int g) {
    return g == 0 ? q.x : g == 1 ? q.y : g == 2 ? q.z : q.w;
}

// `codes == nullptr`: the absmax values are plain f32 (`absmax`); otherwise double-quantized.
// `accumulate`: y += x·Wᵀ (y read in f32, the sum rounded once), else y = x·Wᵀ.
template <typename T, int N>
__device__ void nf4_gemv(const T* __restrict__ x, const uint8_t* __restrict__ packed,
                         const float* __restrict__ absmax, const uint8_t* __restrict__ codes,
                         const float* __restrict__ absmax2, float offset, T* y, int out, int in, int tile,
                         int accumulate) {
    constexpr int R = GemvShape<N>::R, U = GemvShape<N>::U;
    extern __shared__ float4 staged_raw[];
    float* xs = reinterpret_cast<float*>(staged_raw);
    __shared__ float lut[16];
    __shared__ float dmap[256];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < 16) lut[tid] = NF4_CODE[tid];
    if (codes != nullptr && tid < 256) dmap[tid] = DYNAMIC_MAP[tid];
    const int row0 = (blockIdx.x * GEMV_WARPS + warp) * R;
    const int tile_padded = padded(tile);

    float acc[R][N];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.0f;

    for (int k0 = 0; k0 < in; k0 += tile) {
        const int kt = min(tile, in - k0);
        // the previous tile's readers are done (and, the first time, the tables are written)
        __syncthreads();
        const int vecs = kt / 8;
        for (int i = tid; i < N * vecs; i += GEMV_THREADS) {
            const int n = i / vecs, v = i - n * vecs;
            const Vec16<T> raw = load16(x + (int64_t)n * in + k0 + 8 * v);
            float4* dst = reinterpret_cast<float4*>(xs + n * tile_padded + padded(8 * v));
            dst[0] = make_float4(to_f32(raw.v[0]), to_f32(raw.v[1]), to_f32(raw.v[2]), to_f32(raw.v[3]));
            dst[1] = make_float4(to_f32(raw.v[4]), to_f32(raw.v[5]), to_f32(raw.v[6]), to_f32(raw.v[7]));
        }
        __syncthreads();

        const int chunks = kt / 32;
        for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
            // every load of this step first, then the arithmetic
            uint4 q[U][R];
            float amax[U][R];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int c = c0 + 32 * u, row = row0 + r;
                    q[u][r] = make_uint4(0, 0, 0, 0);
                    amax[u][r] = 0.0f;
                    if (c < chunks && row < out) {
                        const int64_t flat = (int64_t)row * in + k0 + 32 * c;
                        q[u][r] = __ldg(reinterpret_cast<const uint4*>(packed + flat / 2));
                        const int64_t block = flat / NF4_BLOCK;
                        amax[u][r] = codes != nullptr
                                         ? restore_absmax(dmap[codes[block]], absmax2[block / DQ_BLOCK], offset)
                                         : absmax[block];
                    }
                }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + 32 * u;
                if (c >= chunks) break;
                const float* xc = xs + padded(32 * c);
#pragma unroll
                for (int g = 0; g < 8; g++) {
                    // columns 4g .. 4g + 3 of the chunk (bytes 2g, 2g + 1), every batch row
                    float xv[N][4];
#pragma unroll
                    for (int n = 0; n < N; n++) {
                        const float4 a = *reinterpret_cast<const float4*>(xc + n * tile_padded + 4 * g);
                        xv[n][0] = a.x, xv[n][1] = a.y, xv[n][2] = a.z, xv[n][3] = a.w;
                    }
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const uint32_t bytes = word_of(q[u][r], g / 2) >> (16 * (g % 2));
                        float w[4];
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            // a byte holds two values, the first in its high nibble
                            const uint32_t b = bytes >> (8 * j);
                            w[2 * j] = rounded(lut[(b >> 4) & 15] * amax[u][r], x);
                            w[2 * j + 1] = rounded(lut[b & 15] * amax[u][r], x);
                        }
#pragma unroll
                        for (int n = 0; n < N; n++)
#pragma unroll
                            for (int j = 0; j < 4; j++) acc[r][n] = fmaf(w[j], xv[n][j], acc[r][n]);
                    }
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N; n++) {
            float v = acc[r][n];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
            const int row = row0 + r;
            if (lane == 0 && row < out) {
                T* dst = y + (int64_t)n * out + row;
                store(dst, accumulate ? __fadd_rn(v, to_f32(*dst)) : v);
            }
        }
}

#define NF4_GEMV(NAME, T, N)                                                                          \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                        \
        nf4_gemv_##NAME##_##N(const T* x, const uint8_t* packed, const float* absmax,                 \
                              const uint8_t* codes, const float* absmax2, float offset, T* y, int out, \
                              int in, int tile, int accumulate) {                                     \
        nf4_gemv<T, N>(x, packed, absmax, codes, absmax2, offset, y, out, in, tile, accumulate);      \
    }
#define NF4_GEMV_ROWS(NAME, T)                                                                        \
    NF4_GEMV(NAME, T, 1)                                                                              \
    NF4_GEMV(NAME, T, 2)                                                                              \
    NF4_GEMV(NAME, T, 3)                                                                              \
    NF4_GEMV(NAME, T, 4)                                                                              \
    NF4_GEMV(NAME, T, 5)                                                                              \
    NF4_GEMV(NAME, T, 6)                                                                              \
    NF4_GEMV(NAME, T, 7)                                                                              \
    NF4_GEMV(NAME, T, 8)

NF4_GEMV_ROWS(f16, __half)
NF4_GEMV_ROWS(bf16, __nv_bfloat16)
