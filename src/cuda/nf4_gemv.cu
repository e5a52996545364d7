// The decode batch's projections: y[n, out] = x[n, in] · Wᵀ for n = 1..64 rows, reading W's packed
// NF4 codes and its absmax (plain f32 or double-quantized) directly: no 16-bit copy of the weight
// is written, and the weight is read once for all n rows. One launch takes up to three weights
// that read the same x (q/k/v, gate/up), each a `Nf4Segment` with its own output, and each
// output row may add a bias, a residual and the LoRA term h_n · B_rowᵀ (h = scale · x·Aᵀ, made
// by `lora_down` below), all summed in f32 and rounded once.
//
// Three kernels: nf4_gemv on the CUDA cores (1 to 8 rows, any `in` a multiple of 32), nf4_mma on
// the tensor cores (a diagnostic now), nf4_lut on the tensor cores by codebook lookup (1 to 64
// rows, `in` a multiple of 256; the default where it applies). First nf4_gemv:
//
// Each weight value is code · absmax, exact in f32 (bitsandbytes' codebook value times the
// block's absmax, restored as the dequantize kernel restores it); a lane sums code · x in f32
// over its 32-value chunk and multiplies the block's absmax in once.
//
// Layout: a block of 4 warps (small blocks, many resident on a multiprocessor, so one block's
// waits overlap another's work); each warp owns R consecutive output rows and its lanes stride
// over the row in 32-value chunks (one 16-byte load of 16 packed bytes per row per chunk, all
// inside one 64-value absmax block), U chunks in flight (for one or two batch rows, a 4096-wide
// row in one go). A lane's first loads, and its B values of the LoRA term, are issued before x
// is staged in shared memory (as f32, a tile of columns at a time when n × in does not fit), so
// the latencies overlap. The lanes' partial sums end in a warp-shuffle reduction.
// src/cuda/nf4_gemv.rs launches these.
#include <stdint.h>

#include "dtype.cuh"
#include "mma.cuh"
#include "nf4_segments.cuh"
#include "nf4_tables.cuh"

// Programmatic dependent launch (sm_90 and later): the lookup kernels, launched right after
// lora_down with the programmatic-serialization attribute (nf4_gemv.rs), start while it runs —
// their weights need nothing from it — and wait for it to finish before their epilogue reads its
// h. lora_down lets them start as soon as all its blocks run. Elsewhere both are no-ops.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void let_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#define GEMV_WARPS 4
#define GEMV_THREADS (GEMV_WARPS * 32)

// Rows per warp and chunks per lane in flight, by batch rows: more rows per warp for larger
// batches (each x chunk read from shared memory then feeds more products), more chunks at once
// for small ones (more bytes in flight per lane). nf4_gemv.rs mirrors ROWS_PER_WARP.
template <int N>
struct GemvShape {
    static constexpr int R = N <= 2 ? 2 : 4;
    static constexpr int U = N <= 2 ? 4 : 2;
};


// The staged x (after the pair table in dynamic shared memory): 4 floats of padding after every 32 columns, so the lanes of a warp (each on
// its own 32-column chunk) read different banks.
__device__ __forceinline__ int padded(int k) { return k + (k >> 5) * 4; }

__device__ __forceinline__ uint32_t word_of(const uint4& q, int g) {
    return g == 0 ? q.x : g == 1 ? q.y : g == 2 ? q.z : q.w;
}

// `accumulate`: y += the sum (y read in f32, the whole sum rounded once), else y = the sum.
template <typename T, int N>
__device__ void nf4_gemv(const T* __restrict__ x, int in, int tile, int accumulate, const Nf4Segments& p) {
    constexpr int R = GemvShape<N>::R, U = GemvShape<N>::U;
    extern __shared__ float4 staged_raw[];
    float* xs = reinterpret_cast<float*>(staged_raw);
    __shared__ float lut[16];
    __shared__ float dmap[256];
    // this block's segment
    const Nf4Segment s = segment_of(p, blockIdx.x);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < 16) lut[tid] = NF4_CODE[tid];
    if (s.codes != nullptr)
        for (int i = tid; i < 256; i += GEMV_THREADS) dmap[i] = DYNAMIC_MAP[i];
    const int out = s.out;
    const int row0 = (((int)blockIdx.x - s.block0) * GEMV_WARPS + warp) * R;
    const int tile_padded = padded(tile);

    float acc[R][N];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.0f;

    uint4 q[U][R];
    uint32_t code[U][R];
    float amax[U][R];
    // the packed bytes and absmax (or its code) of chunks c0 + 32u of tile k0, zero past the end
    auto load = [&](int k0, int chunks, int c0) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int c = c0 + 32 * u, row = row0 + r;
                q[u][r] = make_uint4(0, 0, 0, 0);
                code[u][r] = 0;
                amax[u][r] = 0.0f;
                if (c < chunks && row < out) {
                    const int64_t flat = (int64_t)row * in + k0 + 32 * c;
                    q[u][r] = __ldg(reinterpret_cast<const uint4*>(s.packed + flat / 2));
                    const int64_t block = flat / NF4_BLOCK;
                    if (s.codes != nullptr) {
                        code[u][r] = s.codes[block];
                        amax[u][r] = s.absmax2[block / DQ_BLOCK];
                    } else {
                        amax[u][r] = s.absmax[block];
                    }
                }
            }
    };

    // the LoRA term's B values of this lane (column `lane` of B for each of its rows), fetched
    // now so their latency hides behind the weights'
    float bpre[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        bpre[r] = s.rank > 0 && lane < s.rank && row0 + r < out ? s.lora_b[(int64_t)(row0 + r) * s.rank + lane] : 0.0f;

    for (int k0 = 0; k0 < in; k0 += tile) {
        const int kt = min(tile, in - k0);
        const int chunks = kt / 32;
        // the first chunks' loads go out before x is staged
        load(k0, chunks, lane);
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

        for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
            if (c0 != lane) load(k0, chunks, c0);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + 32 * u;
                if (c >= chunks) break;
                const float* xc = xs + padded(32 * c);
                float part[R][N];
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int n = 0; n < N; n++) part[r][n] = 0.0f;
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
                        // a byte holds two values, the first in its high nibble
                        const float w0 = lut[(bytes >> 4) & 15], w1 = lut[bytes & 15];
                        const float w2 = lut[(bytes >> 12) & 15], w3 = lut[(bytes >> 8) & 15];
#pragma unroll
                        for (int n = 0; n < N; n++) {
                            part[r][n] = fmaf(w0, xv[n][0], part[r][n]);
                            part[r][n] = fmaf(w1, xv[n][1], part[r][n]);
                            part[r][n] = fmaf(w2, xv[n][2], part[r][n]);
                            part[r][n] = fmaf(w3, xv[n][3], part[r][n]);
                        }
                    }
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float a = s.codes != nullptr ? restore_absmax(dmap[code[u][r]], amax[u][r], s.offset)
                                                       : amax[u][r];
#pragma unroll
                    for (int n = 0; n < N; n++) acc[r][n] = fmaf(part[r][n], a, acc[r][n]);
                }
            }
        }
    }

    // the LoRA term, spread over the lanes before the reduction: lane j adds h[n][j] · B[row][j]
    if (s.rank > 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = row0 + r;
            if (row >= out) break;
            for (int j = lane; j < s.rank; j += 32) {
                const float b = j == lane ? bpre[r] : s.lora_b[(int64_t)row * s.rank + j];
#pragma unroll
                for (int n = 0; n < N; n++) acc[r][n] = fmaf(s.lora_h[(int64_t)n * s.h_stride + s.h_col + j], b, acc[r][n]);
            }
        }
    }
    T* y = reinterpret_cast<T*>(s.y);
    const T* residual = reinterpret_cast<const T*>(s.residual);
    const T* bias = reinterpret_cast<const T*>(s.bias);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N; n++) {
            float v = acc[r][n];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
            const int row = row0 + r;
            if (lane == 0 && row < out) {
                const int64_t at = (int64_t)n * out + row;
                if (bias != nullptr) v += to_f32(bias[row]);
                if (residual != nullptr) v += to_f32(residual[at]);
                if (accumulate) v += to_f32(y[at]);
                store(y + at, v);
            }
        }
}

#define NF4_GEMV(NAME, T, N)                                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                     \
        nf4_gemv_##NAME##_##N(const T* x, int in, int tile, int accumulate, const Nf4Segments p) { \
        nf4_gemv<T, N>(x, in, tile, accumulate, p);                                                \
    }
// Each kernel K for 1 to 8 batch rows.
#define ROWS_1_TO_8(K, NAME, T) K(NAME, T, 1) K(NAME, T, 2) K(NAME, T, 3) K(NAME, T, 4) \
    K(NAME, T, 5) K(NAME, T, 6) K(NAME, T, 7) K(NAME, T, 8)

ROWS_1_TO_8(NF4_GEMV, f16, __half)
ROWS_1_TO_8(NF4_GEMV, bf16, __nv_bfloat16)

// ---- The tensor-core path: 1 to 8 rows, `in` a multiple of 256 ----
//
// The same product and epilogue on mma.sync m16n8k16 (16-bit operands, f32 sums): W is the A
// operand (16 output rows a block), x the B operand (8 batch rows), and the f32 accumulators
// are the sums. Each weight is decoded to exactly the 16-bit value the dequantize kernel
// writes (code · absmax in f32, rounded once to T), so the result is the dequantize + GEMM
// path's up to summation order, without the 16-bit copy.
//
// A dot product does not care in which order its k run, as long as both operands agree: lane
// quad c (lane = 4g + c) takes physical k = 64c .. 64c + 63 of each 256-wide super-chunk (one
// absmax block of its two rows g and g + 8, 32 contiguous bytes each, and 64 contiguous values
// of x), and its four k slots of the mma's step s are 64c + 4s .. 64c + 4s + 3. So a lane reads
// whole 16-byte runs of both operands and needs no shuffles.
//
// Decoding without table loads: per row and block, the 16 values code_i · absmax rounded to T
// are two 4-register tables (their low bytes, their high bytes); a packed word's eight nibbles
// are looked up by byte permutes (each nibble's low three bits pick a byte of a table half, its
// high bit the half) and interleaved into four pairs, about 2.5 instructions a value.
//
// A block is 1 to MMA_MAX_WARPS warps (nf4_gemv.rs picks them) over 16 output rows, the warps
// splitting the super-chunks; each warp streams its super-chunks' packed rows and absmax through its
// own ring of MMA_STAGES shared-memory stages (dynamic shared memory) by cp.async, so its next
// loads are in flight while it decodes, and registers hold no loads in flight. The warps' sums
// meet in shared memory; then one thread an output adds the LoRA term (B's 16 rows staged at the
// start), bias, residual (and y with `accumulate`) and rounds once.
#define MMA_KC 256
#define MMA_MAX_WARPS 8
#define MMA_STAGES 3
// a staged W row's 128 bytes and 16 of padding, so rows g and g + 1 fall on different banks
#define MMA_PITCH 144
#define MMA_STAGE_W (16 * MMA_PITCH)
// then the rows' scales: 4 f32 absmax a row, or 4 codes a row and, after them, an absmax2 a row
#define MMA_STAGE (MMA_STAGE_W + 256)
// the largest rank whose B rows are staged in shared memory (past it they are read from global)
#define MMA_MAX_RANK 64

// Row tables: lo[j] and hi[j] hold the low and high bytes of values 4j .. 4j + 3, each code_i ·
// absmax in f32 rounded to T, as nf4_dequantize rounds it.
template <typename T>
__device__ __forceinline__ void value_tables(float amax, uint32_t lo[4], uint32_t hi[4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t p0 = pack2<T>(NF4_CODE[4 * j] * amax, NF4_CODE[4 * j + 1] * amax);
        const uint32_t p1 = pack2<T>(NF4_CODE[4 * j + 2] * amax, NF4_CODE[4 * j + 3] * amax);
        lo[j] = __byte_perm(p0, p1, 0x6420);
        hi[j] = __byte_perm(p0, p1, 0x7531);
    }
}

// A packed word's eight values (byte b: value 2b in its high nibble, 2b + 1 in its low) as the
// pairs {v0, v1}, {v2, v3}, {v4, v5}, {v6, v7} of T, from a row's tables.
__device__ __forceinline__ void decode8(uint32_t q, const uint32_t lo[4], const uint32_t hi[4], uint32_t v[4]) {
    // a selector nibble's high bit is prmt's sign-replicate flag: keep the low three
    const uint32_t idx = q & 0x77777777u, idx16 = idx >> 16;
    const uint32_t half = 0x32103210u | ((q >> 1) & 0x44444444u), half16 = half >> 16;
    // the low (high) bytes of the values in nibble order: 1, 0, 3, 2 (5, 4, 7, 6)
    const uint32_t l0 = __byte_perm(__byte_perm(lo[0], lo[1], idx), __byte_perm(lo[2], lo[3], idx), half);
    const uint32_t h0 = __byte_perm(__byte_perm(hi[0], hi[1], idx), __byte_perm(hi[2], hi[3], idx), half);
    const uint32_t l1 = __byte_perm(__byte_perm(lo[0], lo[1], idx16), __byte_perm(lo[2], lo[3], idx16), half16);
    const uint32_t h1 = __byte_perm(__byte_perm(hi[0], hi[1], idx16), __byte_perm(hi[2], hi[3], idx16), half16);
    v[0] = __byte_perm(l0, h0, 0x4051);
    v[1] = __byte_perm(l0, h0, 0x6273);
    v[2] = __byte_perm(l1, h1, 0x4051);
    v[3] = __byte_perm(l1, h1, 0x6273);
}

template <typename T, int NT>
__device__ void nf4_mma(const T* __restrict__ x, int n, int in, int accumulate, const Nf4Segments& p) {
    extern __shared__ __align__(16) uint8_t mma_ring[];  // [warps][MMA_STAGES][MMA_STAGE]
    __shared__ __align__(16) float lora_bs[16 * MMA_MAX_RANK];
    __shared__ float dmap[256];
    __shared__ float red[MMA_MAX_WARPS][16][8 * NT];
    const Nf4Segment s = segment_of(p, blockIdx.x);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    if (s.codes != nullptr)
        for (int i = tid; i < 256; i += blockDim.x) dmap[i] = DYNAMIC_MAP[i];
    const int out = s.out;
    const int row0 = ((int)blockIdx.x - s.block0) * 16;
    const int supers = in / MMA_KC;
    const int64_t row_bytes = in / 2, blocks_per_row = in / NF4_BLOCK;
    const bool dq = s.codes != nullptr;
    uint8_t* ring = mma_ring + warp * (MMA_STAGES * MMA_STAGE);

    // super-chunk sc's 16 packed rows and their scales into stage st of this warp's ring, rows
    // past `out` as zeros
    auto issue = [&](int st, int sc) {
        uint8_t* dst = ring + st * MMA_STAGE;
#pragma unroll
        for (int i = lane; i < 128; i += 32) {
            const int r = i >> 3, part = i & 7, row = row0 + r;
            const bool ok = row < out;
            cp_async16(dst + r * MMA_PITCH + 16 * part,
                       s.packed + (int64_t)(ok ? row : 0) * row_bytes + (int64_t)sc * (MMA_KC / 2) + 16 * part, ok);
        }
        if (lane < 16) {
            const int row = row0 + lane;
            const bool ok = row < out;
            const int64_t block = (int64_t)(ok ? row : 0) * blocks_per_row + 4 * sc;
            uint8_t* sd = dst + MMA_STAGE_W;
            if (!dq) {
                cp_async16(sd + 16 * lane, s.absmax + block, ok);
            } else {
                cp_async4(sd + 4 * lane, s.codes + block, ok);
                cp_async4(sd + 64 + 4 * lane, s.absmax2 + block / DQ_BLOCK, ok);
            }
        }
    };

    // the LoRA term's B rows of this block (16 · rank contiguous f32), staged with the first
    // stage's copies so their latency hides behind the weights'
    const bool staged_b = s.rank > 0 && s.rank <= MMA_MAX_RANK;
    if (staged_b) {
        const int64_t first = (int64_t)row0 * s.rank, last = (int64_t)out * s.rank;
        for (int i = tid; i < 4 * s.rank; i += blockDim.x) {
            const int64_t at = first + 4 * i;
            const int64_t left = last - at;
            cp_async16_first(lora_bs + 4 * i, s.lora_b + (left > 0 ? at : 0), 4 * (int)(left < 0 ? 0 : left < 4 ? left : 4));
        }
    }

    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[t][e] = 0.0f;

    // this warp's super-chunks: warp, warp + warps, ...
    const int count = supers > warp ? (supers - warp + warps - 1) / warps : 0;
#pragma unroll
    for (int i = 0; i < MMA_STAGES - 1; i++) {
        if (i < count) issue(i, warp + i * warps);
        cp_async_commit();
    }
    __syncthreads();  // dmap
    for (int i = 0; i < count; i++) {
        cp_async_wait<MMA_STAGES - 2>();
        __syncwarp();
        // the stage read in the previous step is free again: refill it
        const int next = i + MMA_STAGES - 1;
        if (next < count) issue(next % MMA_STAGES, warp + next * warps);
        cp_async_commit();

        const uint8_t* st = ring + (i % MMA_STAGES) * MMA_STAGE;
        const int sc = warp + i * warps;
        const uint4 wa0 = *reinterpret_cast<const uint4*>(st + g * MMA_PITCH + 32 * c);
        const uint4 wa1 = *reinterpret_cast<const uint4*>(st + g * MMA_PITCH + 32 * c + 16);
        const uint4 wb0 = *reinterpret_cast<const uint4*>(st + (g + 8) * MMA_PITCH + 32 * c);
        const uint4 wb1 = *reinterpret_cast<const uint4*>(st + (g + 8) * MMA_PITCH + 32 * c + 16);
        const uint8_t* sd = st + MMA_STAGE_W;
        float amax_a, amax_b;
        if (!dq) {
            amax_a = reinterpret_cast<const float*>(sd)[4 * g + c];
            amax_b = reinterpret_cast<const float*>(sd)[4 * (g + 8) + c];
        } else {
            const float* absmax2 = reinterpret_cast<const float*>(sd + 64);
            amax_a = restore_absmax(dmap[sd[4 * g + c]], absmax2[g], s.offset);
            amax_b = restore_absmax(dmap[sd[4 * (g + 8) + c]], absmax2[g + 8], s.offset);
        }
        uint32_t lo_a[4], hi_a[4], lo_b[4], hi_b[4];
        value_tables<T>(amax_a, lo_a, hi_a);
        value_tables<T>(amax_b, lo_b, hi_b);
        const int64_t k = (int64_t)sc * MMA_KC + 64 * c;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t va[4], vb[4];
            decode8(word_of(j < 4 ? wa0 : wa1, j % 4), lo_a, hi_a, va);
            decode8(word_of(j < 4 ? wb0 : wb1, j % 4), lo_b, hi_b, vb);
            const uint32_t a0[4] = {va[0], vb[0], va[1], vb[1]};
            const uint32_t a1[4] = {va[2], vb[2], va[3], vb[3]};
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const int xr = 8 * t + g;
                const uint4 xv = xr < n ? __ldg(reinterpret_cast<const uint4*>(x + (int64_t)xr * in + k + 8 * j))
                                        : make_uint4(0, 0, 0, 0);
                mma<T>(acc[t], a0, xv.x, xv.y);
                mma<T>(acc[t], a1, xv.z, xv.w);
            }
        }
    }
    cp_async_wait<0>();

    // the warps' sums: accumulator e of tile t is row g + 8 (e / 2), batch row 8t + 2c + e % 2
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[warp][g + 8 * (e / 2)][8 * t + 2 * c + (e % 2)] = acc[t][e];
    __syncthreads();
    T* y = reinterpret_cast<T*>(s.y);
    const T* residual = reinterpret_cast<const T*>(s.residual);
    const T* bias = reinterpret_cast<const T*>(s.bias);
    for (int o = tid; o < 16 * n; o += blockDim.x) {
        const int r = o & 15, nn = o >> 4, row = row0 + r;
        if (row >= out) continue;
        float v = 0.0f;
        for (int w = 0; w < warps; w++) v += red[w][r][nn];
        if (s.rank > 0) {
            const float* h = s.lora_h + (int64_t)nn * s.h_stride + s.h_col;
            const float* b = staged_b ? lora_bs + r * s.rank : s.lora_b + (int64_t)row * s.rank;
            for (int j = 0; j < s.rank; j++) v = fmaf(h[j], b[j], v);
        }
        const int64_t at = (int64_t)nn * out + row;
        if (bias != nullptr) v += to_f32(bias[row]);
        if (residual != nullptr) v += to_f32(residual[at]);
        if (accumulate) v += to_f32(y[at]);
        store(y + at, v);
    }
}

#define NF4_MMA(NAME, T, NT)                                                                       \
    extern "C" __global__ void __launch_bounds__(MMA_MAX_WARPS * 32, 3)                             \
        nf4_mma_##NAME##_##NT(const T* x, int n, int in, int accumulate, const Nf4Segments p) {    \
        nf4_mma<T, NT>(x, n, in, accumulate, p);                                                   \
    }
NF4_MMA(f16, __half, 1)
NF4_MMA(bf16, __nv_bfloat16, 1)

// ---- The codebook-lookup path: 1 to 64 rows, `in` a multiple of 256 ----
//
// The tensor-core product again, with a cheaper decode: each weight is its codebook value
// rounded to T (not code · absmax), so one table serves every block — byte b of the packed
// codes is the pair {code[b >> 4], code[b & 15]} — and the absmax multiplies each block's f32 sum
// of code · x afterwards. The table sits in shared memory, one copy per lane (entry b of lane l
// at 256 b + 4 l, so the 32 lanes' lookups fall on 32 different banks whatever their bytes), and
// a lookup's address is one byte permute of the packed word with the lane's offset: a pair of
// weights costs one permute and one shared load, against about five instructions in nf4_mma.
//
// Because the absmax is applied per block, each mma's 16 k lie in one absmax block: lane quad c
// takes values 16c .. 16c + 15 of each 64-value block (8 contiguous bytes of each of its rows g and
// g + 8, 32 contiguous bytes of x), its k slots of step s being 16c + 4s .. 16c + 4s + 3, in x as
// in W. Each block's four mma sum into fresh registers, then its absmax (one per row) scales them
// into the accumulators. Rounding the code rather than the product changes each weight by at most
// one rounding of T, as dequantize + GEMM does; scripts/bench/nf4_codebook_scale_error.py measures
// both against the exact product.
//
// Shared memory is one 64 KiB region of 256 entries of 256 bytes: the first 128 bytes of entry e
// are the table's entry e (32 lane copies), the other 128 are "slot" e, where the warps' rings
// live: a stage is 18 slots, 16 for the packed rows of its super-chunk and 2 for their scales.
// A row's 16-byte chunks are stored swizzled (chunk p of row r at p ^ 2(r & 3)), so the 8-byte
// reads of rows g = 0..3 (and 4..7), all slots starting on the same bank, land on four different
// 32-byte bank groups. 67 KiB a block (more for the sums of 4 and 8 tiles of batch rows).
//
// The grid is persistent: a block of 4 warps walks 16-row groups blockIdx.x, + gridDim.x, ...
// (over the launch's segments), its warps splitting each group's super-chunks; each warp's ring
// runs on from one group into the next, so only a block's first loads wait on memory with
// nothing in flight, and the table is written once a block. At each group's end the warps' sums
// meet in shared memory (two buffers, alternating), and threads of a different warp each time
// add the LoRA term, bias, residual (and y with `accumulate`) and round once. Batch rows come in
// NT tiles of 8, each the B operand of its own mma on the same decoded weights; x is read by
// every block from L2 (past 8 rows that traffic, not the weights', is what bounds the kernel).
#define LUT_STAGES 3
#define LUT_SLOTS_PER_STAGE 18
#define LUT_BYTES (256 * 256)
#define LUT_WARPS 4

// The lane's copy of the table entry of byte i of `word`: its offset is 256 · byte + lane4
// (lane4 = 4 · lane < 256), built by one permute.
template <int I>
__device__ __forceinline__ uint32_t lut_pair(const uint8_t* table, uint32_t word, uint32_t lane4) {
    return *reinterpret_cast<const uint32_t*>(table + __byte_perm(word, lane4, 0x5504 | (I << 4)));
}

// Slot `i` of the region.
__device__ __forceinline__ uint8_t* lut_slot(uint8_t* region, int i) { return region + 256 * i + 128; }

// The table, written by the block's threads: entry b = {code[b >> 4], code[b & 15]} in T, the same
// word in each lane's copy; and the dynamic map of double-quantized absmax codes.
template <typename T>
__device__ __forceinline__ void lut_fill(uint8_t* region, float* dmap) {
    for (int i = threadIdx.x; i < 256 * 8; i += blockDim.x) {
        const int b = i >> 3;
        const uint32_t v = pack2<T>(NF4_CODE[b >> 4], NF4_CODE[b & 15]);
        *reinterpret_cast<uint4*>(region + 256 * b + 16 * (i & 7)) = make_uint4(v, v, v, v);
    }
    for (int i = threadIdx.x; i < 256; i += blockDim.x) dmap[i] = DYNAMIC_MAP[i];
}

// The mma's A operand of steps 0 .. 3 for rows g (`wa`) and g + 8 (`wb`), the lane's 8 bytes of
// each: step s takes bytes 2s and 2s + 1.
__device__ __forceinline__ void lut_a(const uint8_t* table, uint2 wa, uint2 wb, uint32_t lane4, uint32_t a[4][4]) {
    a[0][0] = lut_pair<0>(table, wa.x, lane4), a[0][2] = lut_pair<1>(table, wa.x, lane4);
    a[1][0] = lut_pair<2>(table, wa.x, lane4), a[1][2] = lut_pair<3>(table, wa.x, lane4);
    a[2][0] = lut_pair<0>(table, wa.y, lane4), a[2][2] = lut_pair<1>(table, wa.y, lane4);
    a[3][0] = lut_pair<2>(table, wa.y, lane4), a[3][2] = lut_pair<3>(table, wa.y, lane4);
    a[0][1] = lut_pair<0>(table, wb.x, lane4), a[0][3] = lut_pair<1>(table, wb.x, lane4);
    a[1][1] = lut_pair<2>(table, wb.x, lane4), a[1][3] = lut_pair<3>(table, wb.x, lane4);
    a[2][1] = lut_pair<0>(table, wb.y, lane4), a[2][3] = lut_pair<1>(table, wb.y, lane4);
    a[3][1] = lut_pair<2>(table, wb.y, lane4), a[3][3] = lut_pair<3>(table, wb.y, lane4);
}

// One 64-value block's sums of code · x for rows g, g + 8 and batch rows 8t + 2c, + 1: the four
// steps' mma on A and the lane's 16 values of x (`x0`, `x1`), into fresh registers (the absmax
// then scales them).
template <typename T>
__device__ __forceinline__ void lut_block(float sum[4], const uint32_t a[4][4], uint4 x0, uint4 x1) {
    sum[0] = sum[1] = sum[2] = sum[3] = 0.0f;
    mma<T>(sum, a[0], x0.x, x0.y);
    mma<T>(sum, a[1], x0.z, x0.w);
    mma<T>(sum, a[2], x1.x, x1.y);
    mma<T>(sum, a[3], x1.z, x1.w);
}

template <typename T, int NT>
__device__ void nf4_lut(const T* __restrict__ x, int n, int in, int groups, int accumulate, const Nf4Segments& p) {
    extern __shared__ __align__(16) uint8_t lut_smem[];
    __shared__ float dmap[256];
    __shared__ float red[2][LUT_WARPS][16][8 * NT];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int supers = in / MMA_KC;
    const int64_t row_bytes = in / 2, blocks_per_row = in / NF4_BLOCK;
    const uint8_t* table = lut_smem;
    const int ring = warp * LUT_STAGES * LUT_SLOTS_PER_STAGE;

    // this warp's items: super-chunks warp, warp + warps, ... of each of the block's groups
    // (blockIdx.x, + gridDim.x, ...)
    const int unit = blockIdx.x, stride = gridDim.x;
    const int my_groups = groups > unit ? (groups - unit + stride - 1) / stride : 0;
    const int count = (supers - warp + warps - 1) / warps;
    const int items = my_groups * count;

    // The rows the issuing side is copying (the warp's group `ig`, its super-chunk slot `ij`),
    // set once a group so that an item's copies cost an add each: this lane's four 16-byte
    // sources in the packed rows at super-chunk 0 (row lane / 8 + 4i; a row past the segment's
    // end reads row 0 and is zero-filled, bit i of `w_ok` clear), and for lanes 0..15 its row's
    // first absmax block (`s_block`), where its scales start and whether that row exists.
    int ig = 0, ij = 0;
    const int part = lane & 7, r_lane = lane >> 3;
    const uint8_t* w_src[4];
    unsigned w_ok = 0;
    int64_t s_block = 0;
    bool s_ok = false;
    const uint8_t* s_src = nullptr;
    const uint8_t* codes = nullptr;
    const float* absmax2 = nullptr;
    auto rows_of = [&](int gi) {
        const int group = unit + gi * stride;
        const Nf4Segment s = segment_of(p, group);
        const int row0 = (group - s.block0) * 16;
        const int rows = s.out - row0;
        const uint8_t* w_rows = s.packed + (int64_t)row0 * row_bytes + 16 * part;
        w_ok = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = r_lane + 4 * i;
            w_ok |= (unsigned)(r < rows) << i;
            w_src[i] = w_rows + (int64_t)(r < rows ? r : 0) * row_bytes;
        }
        s_ok = lane < rows;
        s_block = ((int64_t)row0 + (s_ok ? lane : 0)) * blocks_per_row;
        codes = s.codes, absmax2 = s.absmax2;
        // the row's first scale: its absmax (f32) or its absmax code (double-quantized)
        s_src = codes != nullptr ? codes + s_block : reinterpret_cast<const uint8_t*>(s.absmax + s_block);
    };
    // this lane's first destination in the ring (row lane / 8 of stage 0, its 16-byte chunk
    // swizzled; row lane / 8 + 4i is 4i slots on, with the same swizzle)
    uint8_t* const w_dst = lut_slot(lut_smem, ring + r_lane) + 16 * (part ^ (2 * (r_lane & 3)));
    // the next item's 16 packed rows and their scales into stage st of this warp's ring, rows
    // past the segment's end as zeros
    auto issue = [&](int st) {
        if (ij == count) ij = 0, rows_of(++ig);
        const int sc = warp + ij * warps;
        ij++;
        const int64_t at = (int64_t)sc * (MMA_KC / 2);
        uint8_t* dst = w_dst + st * LUT_SLOTS_PER_STAGE * 256;
#pragma unroll
        for (int i = 0; i < 4; i++) cp_async16(dst + 4 * 256 * i, w_src[i] + at, (w_ok >> i) & 1);
        if (lane < 16) {
            const int slot0 = ring + st * LUT_SLOTS_PER_STAGE;
            if (codes == nullptr) {
                cp_async16(lut_slot(lut_smem, slot0 + 16 + lane / 8) + 16 * (lane & 7), s_src + 16 * sc, s_ok);
            } else {
                uint8_t* sd = lut_slot(lut_smem, slot0 + 16);
                cp_async4(sd + 4 * lane, s_src + 4 * sc, s_ok);
                cp_async4(sd + 64 + 4 * lane, absmax2 + (uint64_t)(s_block + 4 * sc) / DQ_BLOCK, s_ok);
            }
        }
    };

    if (items > 0) rows_of(0);
#pragma unroll
    for (int i = 0; i < LUT_STAGES - 1; i++) {
        if (i < items) issue(i);
        cp_async_commit();
    }
    // the table, while the first copies are in flight
    lut_fill<T>(lut_smem, dmap);
    __syncthreads();

    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[t][e] = 0.0f;
    const uint32_t lane4 = 4 * lane;
    // (four tiles and more) the lane's x of the first four tiles for the next 64-value block,
    // loaded a block ahead so those loads wait behind the previous block's products, not in front
    // of this block's; at eight tiles the last four still load in the block itself, behind the
    // first four's products (all eight ahead took 64 registers more and lost, benches/issue38)
    constexpr bool X_AHEAD = NT >= 4;
    constexpr int AHEAD = X_AHEAD ? 4 : 1;
    // the lane's rows of x, 8t + g of tile t, from column 16c, as 32-bit offsets (x holds at most
    // 64 rows); a row past the last reads the last, whose products land in batch columns that are
    // never written. x_at(t, sc) is the lane's first 16 bytes of super-chunk sc in tile t's row,
    // its four blocks 8 uint4 apart.
    const T* x_lane = x + 16 * c;
    uint32_t x_row[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) x_row[t] = (uint32_t)min(8 * t + g, n - 1) * (uint32_t)in;
    auto x_at = [&](int t, int sc) {
        return reinterpret_cast<const uint4*>(x_lane + (x_row[t] + (uint32_t)sc * MMA_KC));
    };
    uint4 x_next[AHEAD][2];
    auto load_x = [&](const uint4* const* at) {
#pragma unroll
        for (int t = 0; t < AHEAD; t++) x_next[t][0] = __ldg(at[t]), x_next[t][1] = __ldg(at[t] + 1);
    };
    // the first item's first block (super-chunk `warp`)
    if (X_AHEAD && items > 0) {
        const uint4* first[AHEAD];
#pragma unroll
        for (int t = 0; t < AHEAD; t++) first[t] = x_at(t, warp);
        load_x(first);
    }
    const int swz = 2 * (g & 3);

    // the computing side: item j is super-chunk slot jj of the block's group gi, in stage st
    int gi = 0, jj = 0, st = 0, group = unit;
    bool dq = false;
    float offset = 0.0f;
    for (int j = 0; j < items; j++) {
        cp_async_wait<LUT_STAGES - 2>();
        __syncwarp();
        if (j + LUT_STAGES - 1 < items) issue(st == 0 ? LUT_STAGES - 1 : st - 1);
        cp_async_commit();

        if (jj == 0) {
            const Nf4Segment s = segment_of(p, group);
            dq = s.codes != nullptr, offset = s.offset;
        }
        const int sc = warp + jj * warps;
        const int slot0 = ring + st * LUT_SLOTS_PER_STAGE;
        st = st + 1 == LUT_STAGES ? 0 : st + 1;
        const uint8_t* row_a = lut_slot(lut_smem, slot0 + g);
        const uint8_t* row_b = lut_slot(lut_smem, slot0 + g + 8);
        const uint8_t* sd = lut_slot(lut_smem, slot0 + 16);
        // the absmax of rows g and g + 8 in each of the super-chunk's four blocks
        float amax_a[4], amax_b[4];
        if (!dq) {
            const float4 va = *reinterpret_cast<const float4*>(sd + 16 * g);
            const float4 vb = *reinterpret_cast<const float4*>(lut_slot(lut_smem, slot0 + 17) + 16 * g);
            amax_a[0] = va.x, amax_a[1] = va.y, amax_a[2] = va.z, amax_a[3] = va.w;
            amax_b[0] = vb.x, amax_b[1] = vb.y, amax_b[2] = vb.z, amax_b[3] = vb.w;
        } else {
            // lane (g, c) restores block c of rows g and g + 8, and its quad's shuffles hand
            // every lane of the quad all four (each restored once, not four times)
            const float* scales2 = reinterpret_cast<const float*>(sd + 64);
            const float mine_a = restore_absmax(dmap[sd[4 * g + c]], scales2[g], offset);
            const float mine_b = restore_absmax(dmap[sd[4 * (g + 8) + c]], scales2[g + 8], offset);
#pragma unroll
            for (int b = 0; b < 4; b++) {
                amax_a[b] = __shfl_sync(0xffffffff, mine_a, 4 * g + b);
                amax_b[b] = __shfl_sync(0xffffffff, mine_b, 4 * g + b);
            }
        }
        // this super-chunk's x in each tile, and (four tiles and more) the next item's for the
        // first four tiles (its super-chunk only depends on jj; past the last item, loads of x
        // that go unused)
        const uint4* x_item[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) x_item[t] = x_at(t, sc);
        const uint4* x_following[AHEAD];
        if (X_AHEAD) {
            const int next_sc = warp + (jj + 1 < count ? jj + 1 : 0) * warps;
#pragma unroll
            for (int t = 0; t < AHEAD; t++) x_following[t] = x_at(t, next_sc);
        }
        // (four tiles and more: one block at a time, so the compiler does not hold every block's
        // x in registers at once)
#pragma unroll(NT >= 4 ? 1 : 4)
        for (int b = 0; b < 4; b++) {
            const float scale_a = b == 0 ? amax_a[0] : b == 1 ? amax_a[1] : b == 2 ? amax_a[2] : amax_a[3];
            const float scale_b = b == 0 ? amax_b[0] : b == 1 ? amax_b[1] : b == 2 ? amax_b[2] : amax_b[3];
            const int at = 16 * ((2 * b + (c >> 1)) ^ swz) + 8 * (c & 1);
            const uint2 wa = *reinterpret_cast<const uint2*>(row_a + at);
            const uint2 wb = *reinterpret_cast<const uint2*>(row_b + at);
            uint32_t a[4][4];
            lut_a(table, wa, wb, lane4, a);
            uint4 x_now[AHEAD][2];
            if (X_AHEAD) {
#pragma unroll
                for (int t = 0; t < AHEAD; t++) x_now[t][0] = x_next[t][0], x_now[t][1] = x_next[t][1];
                // the next block: this super-chunk's, else the next item's first
                const uint4* next[AHEAD];
#pragma unroll
                for (int t = 0; t < AHEAD; t++) next[t] = b < 3 ? x_item[t] + 8 * (b + 1) : x_following[t];
                load_x(next);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                uint4 x0, x1;
                if (X_AHEAD && t < AHEAD) {
                    x0 = x_now[t < AHEAD ? t : 0][0], x1 = x_now[t < AHEAD ? t : 0][1];
                } else {
                    x0 = __ldg(x_item[t] + 8 * b), x1 = __ldg(x_item[t] + 8 * b + 1);
                }
                float sum[4];
                lut_block<T>(sum, a, x0, x1);
                acc[t][0] = fmaf(sum[0], scale_a, acc[t][0]);
                acc[t][1] = fmaf(sum[1], scale_a, acc[t][1]);
                acc[t][2] = fmaf(sum[2], scale_b, acc[t][2]);
                acc[t][3] = fmaf(sum[3], scale_b, acc[t][3]);
            }
        }
        if (++jj < count) continue;

        {
            // the warps' sums meet, then the epilogue, on a different warp each group (accumulator
            // e of tile t is row g + 8 (e / 2), batch row 8t + 2c + e % 2)
            float(*sums)[16][8 * NT] = red[gi & 1];
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    sums[warp][g + 8 * (e / 2)][8 * t + 2 * c + (e % 2)] = acc[t][e];
                    acc[t][e] = 0.0f;
                }
            __syncthreads();
            wait_for_prior_grid();
            const Nf4Segment s = segment_of(p, group);
            const int row0 = (group - s.block0) * 16;
            const int first = 32 * (gi % warps);
            for (int o = (tid + (int)blockDim.x - first) % (int)blockDim.x; o < 16 * n; o += blockDim.x) {
                const int r = o & 15;
                float v = 0.0f;
                for (int w = 0; w < warps; w++) v += sums[w][r][o >> 4];
                segment_output<T>(s, row0 + r, o >> 4, n, accumulate, v);
            }
        }
        jj = 0, gi++, group += stride;
    }
    cp_async_wait<0>();
}

#define NF4_LUT(NAME, T, NT)                                                                       \
    extern "C" __global__ void __launch_bounds__(LUT_WARPS * 32, NT <= 2 ? 3 : 2)                   \
        nf4_lut_##NAME##_##NT(const T* x, int n, int in, int groups, int accumulate,               \
                              const Nf4Segments p) {                                               \
        nf4_lut<T, NT>(x, n, in, groups, accumulate, p);                                           \
    }
// 1, 2, 4 or 8 tiles of 8 rows; three blocks a multiprocessor, two from 4 tiles (whose sums and
// accumulators would not fit the shared memory and registers of three)
#define NF4_LUTS(NAME, T) NF4_LUT(NAME, T, 1) NF4_LUT(NAME, T, 2) NF4_LUT(NAME, T, 4) NF4_LUT(NAME, T, 8)
NF4_LUTS(f16, __half)
NF4_LUTS(bf16, __nv_bfloat16)

// ---- The codebook lookup as a skinny GEMM: 1 to 64 rows, `in` a multiple of 256 ----
//
// nf4_lut's decode and products, with the work cut the other way: the 4 warps of a block own
// 32 weight rows each (two mma row tiles: a 128-row block tile) and walk the same k together, so
// one copy of x's columns in shared memory serves all 128 rows. In nf4_lut every warp reads its
// own k range of x from L2 for its 16 rows, which past 8 batch rows moves more bytes of x than of
// weights and waits on them. Here a stage is one 64-value absmax block: the 128 rows' packed
// bytes (4 KiB) and the batch rows' 64 values of x (128 bytes a row), both copied by cp.async
// S − 1 stages ahead; each row's four absmax of a 256-value quad (or their codes and scale,
// restored once by the quad's first step) come with the quad's first stage into a two-entry ring. A lane's B operand is two 16-byte shared loads a tile and block, its A
// operand the same lookups as nf4_lut.
//
// Few 128-row tiles fill the card only for gate/up, so the grid splits the k as well, stream-K:
// the launch's items (tile, quad) in tile-major order are cut into gridDim.x equal ranges, one a
// block, and a block's pipeline runs on across its tiles. A tile cut between blocks is a
// fragment in each: each writes its f32 sums to the workspace (two slots a block: its first tile
// and its last) and counts itself in; the last to arrive adds the fragments in block order (the
// same sum whoever arrives last), runs the epilogue and resets the count for the next launch.
// A tile inside one block goes straight to the epilogue.
//
// Shared memory is nf4_lut's 64 KiB region (the table in the first half of each 256-byte entry,
// 128-byte slots in the second): a stage's rows in 32 slots (4 rows a slot), the scale ring's two
// entries in 24 slots each, and x's stages after them where they fit, else after the region. x's
// 16-byte chunks are swizzled (chunk q of row r at q ^ (r & 7)) so the lanes of a load, 2 rows ×
// 4 chunks, fall on different banks.
#define LG_WARPS 4
#define LG_ROWS 128

template <int NT>
struct LutGemmShape {
    static constexpr int S = NT == 1 ? 5 : NT == 2 ? 4 : NT == 4 ? 3 : 4;  // stages (≤ 5: the ring)
    static constexpr int SC_SLOT0 = 32 * S;  // the scale ring: 2 entries of 24 slots
    static constexpr int X_ROWS = 8 * NT;
    static constexpr bool X_IN_REGION = SC_SLOT0 + 48 + S * X_ROWS <= 256;
    static constexpr int X_SLOT0 = SC_SLOT0 + 48;
    static constexpr int X_PITCH = X_IN_REGION ? 256 : 128;
    static constexpr int BYTES = LUT_BYTES + (X_IN_REGION ? 0 : S * X_ROWS * 128);
    // a block's f32 sums: 2 row tiles × NT × 4 accumulators × 128 threads
    static constexpr int SUMS = 2 * NT * 4 * LG_ROWS;
};

// Which block of `blocks` holds item `i` of `items` (block b holds items [b·items/blocks,
// (b+1)·items/blocks)).
__device__ __forceinline__ int lg_block_of(int64_t i, int64_t items, int blocks) {
    return (int)(((i + 1) * blocks + items - 1) / items) - 1;
}

template <typename T, int NT>
__device__ void nf4_lut_gemm(const T* __restrict__ x, int n, int in, int tiles, int accumulate, float* __restrict__ ws,
                             int* __restrict__ counts, const Nf4Segments& p) {
    using Shape = LutGemmShape<NT>;
    constexpr int S = Shape::S;
    extern __shared__ __align__(16) uint8_t lut_smem[];
    __shared__ float dmap[256];
    __shared__ int last_in;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int quads = in / MMA_KC;
    const int64_t row_bytes = in / 2, blocks_per_row = in / NF4_BLOCK;
    const int64_t items = (int64_t)tiles * quads;
    const int G = gridDim.x, b = blockIdx.x;
    const int64_t first = (int64_t)b * items / G, end = (int64_t)(b + 1) * items / G;
    const int K = 4 * (int)(end - first);  // this block's stages
    const uint8_t* table = lut_smem;
    uint8_t* const x_base = Shape::X_IN_REGION ? lut_slot(lut_smem, Shape::X_SLOT0) : lut_smem + LUT_BYTES;

    // The issuing side: the tile and quad of the next stage to copy, and this thread's sources
    // in that tile (W: rows tid / 2 and 64 + tid / 2, 16-byte chunk tid % 2 of each row's 32
    // bytes a block; scales: row tid), set once a tile.
    int i_tile = (int)(first / quads), i_quad = (int)(first % quads);
    const uint8_t* w_src[2] = {nullptr, nullptr};
    bool w_ok[2] = {false, false};
    int64_t s_block = 0;
    bool s_ok = false;
    const uint8_t* codes = nullptr;
    const float* absmax = nullptr;
    const float* absmax2 = nullptr;
    auto rows_of = [&](int tile) {
        const Nf4Segment s = segment_of(p, tile);
        const int row0 = (tile - s.block0) * LG_ROWS;
        const int rows = s.out - row0;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 64 * h + (tid >> 1);
            w_ok[h] = r < rows;
            w_src[h] = s.packed + (int64_t)(row0 + (w_ok[h] ? r : 0)) * row_bytes + 16 * (tid & 1);
        }
        s_ok = tid < rows;
        s_block = (int64_t)(row0 + (s_ok ? tid : 0)) * blocks_per_row;
        codes = s.codes, absmax = s.absmax, absmax2 = s.absmax2;
    };
    auto issue = [&](int j) {
        const int st = j % S;
        const int kb = 4 * i_quad + (j & 3);
        // the 128 rows' 32 bytes of block kb
        uint8_t* w_dst = lut_slot(lut_smem, 32 * st);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 64 * h + (tid >> 1);
            cp_async16(w_dst + 256 * (r >> 2) + 32 * (r & 3) + 16 * (tid & 1), w_src[h] + 32 * kb, w_ok[h]);
        }
        // x's 64 values of block kb, each batch row (zeros past n)
        uint8_t* x_dst = x_base + st * Shape::X_ROWS * Shape::X_PITCH;
#pragma unroll
        for (int i = tid; i < 8 * Shape::X_ROWS; i += LG_WARPS * 32) {
            const int rr = i >> 3, q = i & 7;
            cp_async16(x_dst + rr * Shape::X_PITCH + 16 * (q ^ (rr & 7)),
                       x + (int64_t)(rr < n ? rr : 0) * in + 64 * kb + 8 * q, rr < n);
        }
        // with a quad's first block, its four absmax (or codes and their scale) of each row
        if ((j & 3) == 0) {
            // an entry: the f32 absmax in slots 0 .. 15 (row r at slot r / 8, its four blocks'
            // 16 bytes at 16 (r % 8)); double-quantized, the codes and their scale in slots
            // 16 .. 23, restored into slots 0 .. 15 by the quad's first computing step
            uint8_t* sd = lut_slot(lut_smem, Shape::SC_SLOT0 + 24 * ((j >> 2) & 1));
            if (codes == nullptr) {
                cp_async16(sd + 256 * (tid >> 3) + 16 * (tid & 7), absmax + s_block + 4 * i_quad, s_ok);
            } else {
                cp_async4(sd + 256 * (16 + (tid >> 5)) + 4 * (tid & 31), codes + s_block + 4 * i_quad, s_ok);
                cp_async4(sd + 256 * (20 + (tid >> 5)) + 4 * (tid & 31),
                          absmax2 + (uint64_t)(s_block + 4 * i_quad) / DQ_BLOCK, s_ok);
            }
        }
        // past a quad's last block, the next quad (and at a tile's end, the next tile)
        if ((j & 3) == 3 && ++i_quad == quads) {
            i_quad = 0;
            if (++i_tile < tiles) rows_of(i_tile);
        }
    };

    if (K > 0) rows_of(i_tile);
#pragma unroll
    for (int j = 0; j < S - 1; j++) {
        if (j < K) issue(j);
        cp_async_commit();
    }
    // the table, while the first copies are in flight
    lut_fill<T>(lut_smem, dmap);

    // accumulator e of row tile m, batch tile t: row 32 warp + 16 m + g + 8 (e / 2), batch row
    // 8t + 2c + e % 2
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][t][e] = 0.0f;
    const uint32_t lane4 = 4 * lane;

    // The epilogue of tile `tile` from `acc` (the whole sum of its rows): the LoRA term, bias,
    // residual (and y with `accumulate`), rounded once.
    auto epilogue = [&](int tile) {
        wait_for_prior_grid();
        const Nf4Segment s = segment_of(p, tile);
        const int row0 = (tile - s.block0) * LG_ROWS + 32 * warp + g;
        if (s.rank > 0) {
            // four ranks at a time (one where B's rows or h's columns are not 16-byte aligned):
            // the lane's four rows of B, then each of its batch rows' h against them
            const bool wide = (s.rank & 3) == 0 && (s.h_stride & 3) == 0 && (s.h_col & 3) == 0;
            const float* brow[4];
#pragma unroll
            for (int h = 0; h < 4; h++)
                brow[h] = s.lora_b + (int64_t)min(row0 + 8 * h, s.out - 1) * s.rank;
#pragma unroll 1
            for (int q = 0; q < s.rank; q += wide ? 4 : 1) {
                float4 bq[4];
#pragma unroll
                for (int h = 0; h < 4; h++)
                    bq[h] = wide ? *reinterpret_cast<const float4*>(brow[h] + q) : make_float4(brow[h][q], 0.f, 0.f, 0.f);
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int e2 = 0; e2 < 2; e2++) {
                        const int nn = min(8 * t + 2 * c + e2, n - 1);
                        const float* hrow = s.lora_h + (int64_t)nn * s.h_stride + s.h_col + q;
                        const float4 hq = wide ? *reinterpret_cast<const float4*>(hrow) : make_float4(*hrow, 0.f, 0.f, 0.f);
#pragma unroll
                        for (int h = 0; h < 4; h++) {
                            // row 32 warp + g + 8h is accumulator 2 (h % 2) + e2 of row tile h / 2
                            float& v = acc[h >> 1][t][2 * (h & 1) + e2];
                            v = fmaf(hq.x, bq[h].x, v);
                            v = fmaf(hq.y, bq[h].y, v);
                            v = fmaf(hq.z, bq[h].z, v);
                            v = fmaf(hq.w, bq[h].w, v);
                        }
                    }
            }
        }
        T* y = reinterpret_cast<T*>(s.y);
        const T* residual = reinterpret_cast<const T*>(s.residual);
        const T* bias = reinterpret_cast<const T*>(s.bias);
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = row0 + 16 * m + 8 * (e >> 1);
                if (row >= s.out) continue;
                const float bv = bias != nullptr ? to_f32(bias[row]) : 0.0f;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const int nn = 8 * t + 2 * c + (e & 1);
                    if (nn >= n) continue;
                    const int64_t at = (int64_t)nn * s.out + row;
                    float v = acc[m][t][e] + bv;
                    if (residual != nullptr) v += to_f32(residual[at]);
                    if (accumulate) v += to_f32(y[at]);
                    store(y + at, v);
                }
            }
    };

    // the computing side: stage j is block kb of quad c_quad of tile c_tile
    int c_tile = (int)(first / quads), c_quad = (int)(first % quads);
    const int first_tile = c_tile;
    bool dq = false;
    float offset = 0.0f;
    if (K > 0) {
        const Nf4Segment s = segment_of(p, c_tile);
        dq = s.codes != nullptr, offset = s.offset;
    }
    __syncthreads();
    for (int j = 0; j < K; j++) {
        cp_async_wait<S - 2>();
        __syncthreads();
        if (j + S - 1 < K) issue(j + S - 1);
        cp_async_commit();

        const int st = j % S, bq = j & 3;
        uint8_t* sd = lut_slot(lut_smem, Shape::SC_SLOT0 + 24 * ((j >> 2) & 1));
        if (dq && bq == 0) {
            // thread tid restores row tid's four absmax of the quad
            const uint32_t codes4 = *reinterpret_cast<const uint32_t*>(sd + 256 * (16 + (tid >> 5)) + 4 * (tid & 31));
            const float a2 = *reinterpret_cast<const float*>(sd + 256 * (20 + (tid >> 5)) + 4 * (tid & 31));
            float4 r;
            r.x = restore_absmax(dmap[codes4 & 255], a2, offset);
            r.y = restore_absmax(dmap[(codes4 >> 8) & 255], a2, offset);
            r.z = restore_absmax(dmap[(codes4 >> 16) & 255], a2, offset);
            r.w = restore_absmax(dmap[codes4 >> 24], a2, offset);
            *reinterpret_cast<float4*>(sd + 256 * (tid >> 3) + 16 * (tid & 7)) = r;
            __syncthreads();
        }
        // the absmax of this lane's rows 32 warp + 8h + g, h = 0..3, in block bq of the quad
        const uint8_t* sa = sd + 256 * 4 * warp + 16 * g + 4 * bq;
        float amax[4];
#pragma unroll
        for (int h = 0; h < 4; h++) amax[h] = *reinterpret_cast<const float*>(sa + 256 * h);
        // this lane's 8 bytes (values 16c .. 16c + 15) of rows 32 warp + 8h + g
        const uint8_t* w_st = lut_slot(lut_smem, 32 * st);
        uint2 wr[4];
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const int r = 32 * warp + 8 * h + g;
            wr[h] = *reinterpret_cast<const uint2*>(w_st + 256 * (r >> 2) + 32 * (r & 3) + 8 * c);
        }
        // the mma's A operand of steps 0 .. 3 for row tiles 0 and 1 (rows g, g + 8 of each)
        uint32_t a[2][4][4];
#pragma unroll
        for (int m = 0; m < 2; m++) lut_a(table, wr[2 * m], wr[2 * m + 1], lane4, a[m]);
        // batch row 8t + g, values 16c .. 16c + 15 (chunks 2c and 2c + 1), one tile ahead of
        // its products (the compiler barrier keeps it from holding every tile's x at once)
        const uint8_t* x_st = x_base + st * Shape::X_ROWS * Shape::X_PITCH + g * Shape::X_PITCH;
        const int q0 = 16 * ((2 * c) ^ g), q1 = 16 * ((2 * c + 1) ^ g);
        uint4 x0 = *reinterpret_cast<const uint4*>(x_st + q0);
        uint4 x1 = *reinterpret_cast<const uint4*>(x_st + q1);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            uint4 n0 = x0, n1 = x1;
            if (t + 1 < NT) {
                n0 = *reinterpret_cast<const uint4*>(x_st + 8 * (t + 1) * Shape::X_PITCH + q0);
                n1 = *reinterpret_cast<const uint4*>(x_st + 8 * (t + 1) * Shape::X_PITCH + q1);
            }
            asm volatile("" ::: "memory");
#pragma unroll
            for (int m = 0; m < 2; m++) {
                float sum[4];
                lut_block<T>(sum, a[m], x0, x1);
                acc[m][t][0] = fmaf(sum[0], amax[2 * m], acc[m][t][0]);
                acc[m][t][1] = fmaf(sum[1], amax[2 * m], acc[m][t][1]);
                acc[m][t][2] = fmaf(sum[2], amax[2 * m + 1], acc[m][t][2]);
                acc[m][t][3] = fmaf(sum[3], amax[2 * m + 1], acc[m][t][3]);
            }
            x0 = n0, x1 = n1;
        }
        if (bq != 3) continue;

        // a quad done; at its tile's end or the range's, the tile's sums (a fragment or whole)
        const bool tile_end = ++c_quad == quads;
        if (!tile_end && j != K - 1) continue;
        const int b_first = lg_block_of((int64_t)c_tile * quads, items, G);
        const int b_last = lg_block_of((int64_t)(c_tile + 1) * quads - 1, items, G);
        if (b_first == b_last) {
            epilogue(c_tile);
        } else {
            float* mine = ws + (int64_t)(2 * b + (c_tile == first_tile ? 0 : 1)) * Shape::SUMS;
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) __stcg(mine + ((m * NT + t) * 4 + e) * LG_ROWS + tid, acc[m][t][e]);
            __threadfence();
            __syncthreads();
            if (tid == 0) {
                const bool last = atomicAdd(counts + c_tile, 1) == b_last - b_first;
                if (last) counts[c_tile] = 0;
                last_in = last;
            }
            __syncthreads();
            if (last_in) {
                __threadfence();
#pragma unroll
                for (int m = 0; m < 2; m++)
#pragma unroll
                    for (int t = 0; t < NT; t++)
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[m][t][e] = 0.0f;
                // the fragments in block order: block f's slot is 0 where this tile is its first
#pragma unroll 1
                for (int f = b_first; f <= b_last; f++) {
                    const int f_first_tile = (int)((int64_t)f * items / G / quads);
                    const float* part = ws + (int64_t)(2 * f + (c_tile == f_first_tile ? 0 : 1)) * Shape::SUMS;
#pragma unroll
                    for (int m = 0; m < 2; m++)
#pragma unroll
                        for (int t = 0; t < NT; t++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                acc[m][t][e] += __ldcg(part + ((m * NT + t) * 4 + e) * LG_ROWS + tid);
                }
                epilogue(c_tile);
            }
        }
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[m][t][e] = 0.0f;
        if (tile_end) {
            c_quad = 0;
            if (++c_tile < tiles) {
                const Nf4Segment s = segment_of(p, c_tile);
                dq = s.codes != nullptr, offset = s.offset;
            }
        }
    }
    cp_async_wait<0>();
}

#define NF4_LUT_GEMM(NAME, T, NT)                                                                          \
    extern "C" __global__ void __launch_bounds__(LG_WARPS * 32, NT <= 4 ? 3 : 2)                            \
        nf4_lut_gemm_##NAME##_##NT(const T* x, int n, int in, int tiles, int accumulate, float* ws, int* counts, \
                                   const Nf4Segments p) {                                                   \
        nf4_lut_gemm<T, NT>(x, n, in, tiles, accumulate, ws, counts, p);                                    \
    }
// 1, 2, 4 or 8 tiles of 8 batch rows; three blocks a multiprocessor to four tiles, two at eight
// (whose x stages lie past the region)
#define NF4_LUT_GEMMS(NAME, T) \
    NF4_LUT_GEMM(NAME, T, 1) NF4_LUT_GEMM(NAME, T, 2) NF4_LUT_GEMM(NAME, T, 4) NF4_LUT_GEMM(NAME, T, 8)
NF4_LUT_GEMMS(f16, __half)
NF4_LUT_GEMMS(bf16, __nv_bfloat16)

// LoRA's first product for the decode rows: h[n, c] = scale_i · x[n] · A_i[j] for column c, row j
// of adapter i (up to three adapters reading the same x, their A stacked: c runs over Σ r_i).
// One block a column (and 8 rows: blockIdx.y takes the next 8), its threads striding over `in`
// with 16-byte loads of A (f32), the sum in f32. h feeds nf4_gemv's LoRA term.
#define LORA_THREADS 256

struct LoraDown {
    const float* a[MAX_SEGMENTS];   // [r_i, in] f32, contiguous
    float scale[MAX_SEGMENTS];
    int rank[MAX_SEGMENTS];
    int count;
};

template <typename T, int N>
__device__ void lora_down(const T* __restrict__ x, int rows, int in, float* __restrict__ h, int h_stride, const LoraDown& p) {
    // rows N · blockIdx.y on (a batch of more than N rows takes several blocks a column)
    let_dependents_launch();
    const int r0 = N * (int)blockIdx.y, live = min(N, rows - r0);
    x += (int64_t)r0 * in;
    h += (int64_t)r0 * h_stride;
    int c = blockIdx.x, i = 0;
    const float* a = p.a[0];
    float scale = p.scale[0];
    if (p.count > 1 && c >= p.rank[0]) {
        c -= p.rank[0], i = 1, a = p.a[1], scale = p.scale[1];
        if (p.count > 2 && c >= p.rank[1]) c -= p.rank[1], i = 2, a = p.a[2], scale = p.scale[2];
    }
    const float* arow = a + (int64_t)c * in;
    float acc[N];
#pragma unroll
    for (int n = 0; n < N; n++) acc[n] = 0.0f;
    // four float4 loads of A in flight a thread, then their products with each row of x
    for (int k0 = 4 * threadIdx.x; k0 < in; k0 += 4 * 4 * LORA_THREADS) {
        float4 av[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int k = k0 + 4 * LORA_THREADS * u;
            av[u] = k < in ? *reinterpret_cast<const float4*>(arow + k) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int k = k0 + 4 * LORA_THREADS * u;
            if (k >= in) break;
#pragma unroll
            for (int n = 0; n < N; n++) {
                if (n >= live) break;
                // four values of x in one 8-byte load
                const uint2 raw = *reinterpret_cast<const uint2*>(x + (int64_t)n * in + k);
                const T* xr = reinterpret_cast<const T*>(&raw);
                acc[n] = fmaf(av[u].x, to_f32(xr[0]), acc[n]);
                acc[n] = fmaf(av[u].y, to_f32(xr[1]), acc[n]);
                acc[n] = fmaf(av[u].z, to_f32(xr[2]), acc[n]);
                acc[n] = fmaf(av[u].w, to_f32(xr[3]), acc[n]);
            }
        }
    }
    __shared__ float partial[LORA_THREADS / 32][N];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int n = 0; n < N; n++) {
        float v = acc[n];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
        if (lane == 0) partial[warp][n] = v;
    }
    __syncthreads();
    if ((int)threadIdx.x < live) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < LORA_THREADS / 32; w++) v += partial[w][threadIdx.x];
        h[(int64_t)threadIdx.x * h_stride + blockIdx.x] = scale * v;
    }
}

#define LORA_DOWN(NAME, T, N)                                                                                   \
    extern "C" __global__ void __launch_bounds__(LORA_THREADS)                                                  \
        lora_down_##NAME##_##N(const T* x, int rows, int in, float* h, int h_stride, const LoraDown p) {      \
        lora_down<T, N>(x, rows, in, h, h_stride, p);                                                           \
    }
ROWS_1_TO_8(LORA_DOWN, f16, __half)
ROWS_1_TO_8(LORA_DOWN, bf16, __nv_bfloat16)

// LoRA's first product for 9 to 64 rows, split along the k: block (cg, sp) takes columns
// 8 cg .. 8 cg + 7 of h (across the adapters, as lora_down) over k range sp of gridDim.y, its 256
// threads (batch row r = tid / 4, column pair tid % 4) each summing two columns of one row, x
// and A read by 16-byte loads (the row's four threads share x's, a column's 64 threads A's, in
// L1). Each block writes its 64 × 8 sums to the workspace and counts itself in; the last of a
// column group adds the splits in order (the same sum whichever arrives last), scales them and
// writes h, and resets the count for the next launch. In lora_down one block a column reads the
// whole row of A and 8 rows of x in a loop of dependent loads: at 64 rows, 8 blocks a column.
template <typename T>
__device__ void lora_down_split(const T* __restrict__ x, int rows, int in, int k_chunk, float* __restrict__ h,
                                int h_stride, float* __restrict__ ws, int* __restrict__ counts, const LoraDown& p) {
    let_dependents_launch();
    __shared__ int last_in;
    const int tid = threadIdx.x, r = tid >> 2, cg = blockIdx.x, sp = blockIdx.y, splits = gridDim.y;
    int width = 0;
    for (int i = 0; i < p.count; i++) width += p.rank[i];
    // this thread's two columns: adapter and row of A (or none past the width)
    const float* arow[2];
    float scale[2];
    bool live[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        int c = 8 * cg + 2 * (tid & 3) + e, i = 0;
        live[e] = c < width;
        while (i + 1 < p.count && c >= p.rank[i]) c -= p.rank[i], i++;
        arow[e] = p.a[i] + (int64_t)(live[e] ? c : 0) * in;
        scale[e] = p.scale[i];
    }
    const int k0 = sp * k_chunk, k1 = min(in, k0 + k_chunk);
    float acc[2] = {0.0f, 0.0f};
    if (r < rows) {
        const T* xr = x + (int64_t)r * in;
#pragma unroll 4
        for (int k = k0; k < k1; k += 8) {
            const Vec16<T> xv = load16(xr + k);
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if (!live[e]) continue;
                const float4 a0 = *reinterpret_cast<const float4*>(arow[e] + k);
                const float4 a1 = *reinterpret_cast<const float4*>(arow[e] + k + 4);
                float v = acc[e];
                v = fmaf(a0.x, to_f32(xv.v[0]), v);
                v = fmaf(a0.y, to_f32(xv.v[1]), v);
                v = fmaf(a0.z, to_f32(xv.v[2]), v);
                v = fmaf(a0.w, to_f32(xv.v[3]), v);
                v = fmaf(a1.x, to_f32(xv.v[4]), v);
                v = fmaf(a1.y, to_f32(xv.v[5]), v);
                v = fmaf(a1.z, to_f32(xv.v[6]), v);
                v = fmaf(a1.w, to_f32(xv.v[7]), v);
                acc[e] = v;
            }
        }
    }
    // this split's sums, then the count; the last split of the group sums them all in order
    float* mine = ws + ((int64_t)cg * splits + sp) * 512;
    *reinterpret_cast<float2*>(mine + 2 * tid) = make_float2(acc[0], acc[1]);
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const bool last = atomicAdd(counts + cg, 1) == splits - 1;
        if (last) counts[cg] = 0;
        last_in = last;
    }
    __syncthreads();
    if (!last_in) return;
    __threadfence();
    // (sixteen splits' loads in flight at a time)
    float2 sum = make_float2(0.0f, 0.0f);
    const float* group = ws + (int64_t)cg * splits * 512 + 2 * tid;
#pragma unroll 16
    for (int q = 0; q < splits; q++) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(group + (int64_t)q * 512));
        sum.x += v.x, sum.y += v.y;
    }
    if (r >= rows) return;
    const int c = 8 * cg + 2 * (tid & 3);
    if (live[0]) h[(int64_t)r * h_stride + c] = scale[0] * sum.x;
    if (live[1]) h[(int64_t)r * h_stride + c + 1] = scale[1] * sum.y;
}

#define LORA_DOWN_SPLIT(NAME, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                                            \
        lora_down_split_##NAME(const T* x, int rows, int in, int k_chunk, float* h, int h_stride, float* ws,   \
                               int* counts, const LoraDown p) {                                                  \
        lora_down_split<T>(x, rows, in, k_chunk, h, h_stride, ws, counts, p);                                    \
    }
LORA_DOWN_SPLIT(f16, __half)
LORA_DOWN_SPLIT(bf16, __nv_bfloat16)
