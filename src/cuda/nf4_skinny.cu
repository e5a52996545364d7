// The decode batch's projections for more than a few rows as a skinny GEMM: y[n, out] = x[n, in]
// · Wᵀ for up to 64 rows, W read from its packed NF4 codes and absmax (plain or double-quantized)
// with no 16-bit copy, the same segments, LoRA term, bias and residual as nf4_gemv.cu's kernels.
//
// Why another kernel: nf4_lut gives every 16-row group of W all of x, so at 64 batch rows it reads
// x from L2 sixteen times for each byte of weight. Here a block owns a tile of 16 rows a warp (up
// to 128 rows) and stages each 256-column chunk of x once in shared memory for all of them; a warp decodes its rows' A operand by the codebook lookup of nf4_lut (a byte of two
// codes → their two values, rounded to T, from a table in shared memory) and runs it against every
// 8-row tile of x, so one decode feeds up to 16 tensor-core products. Each 64-value block's f32 sum
// is multiplied by its absmax after, as in nf4_lut, so the numerics are nf4_lut's.
//
// A tile's k is split across blocks when the tiles alone would leave multiprocessors idle: each
// split writes its f32 sums to a workspace, and the last split of a tile to arrive (a counter per
// tile, reset by it) adds them in split order — the same sum every run — and does the epilogue.
// The grid is persistent: a block walks units (tile, split), its copies running one 256-column
// stage ahead across units. src/cuda/nf4_skinny.rs launches it.
#include <stdint.h>

#include "dtype.cuh"
#include "mma.cuh"
#include "nf4_segments.cuh"
#include "nf4_tables.cuh"

// columns of a stage: four absmax blocks
#define SKINNY_KC 256
// a staged x row: its 512 bytes and 16 of padding, so the B loads of a quarter warp hit 8 banks
#define SKINNY_X_PITCH 528
// the table: entry b (a byte of two codes) at 128 b, lane l's copy of it at + 4 l
#define SKINNY_TABLE (256 * 128)
// 16-row groups of weight rows a warp owns (one: fewer registers, so eight warps fit a
// multiprocessor beside three stages)
#define SKINNY_GW 1
#define SKINNY_WARP_ROWS (16 * SKINNY_GW)
// batch tiles of 8 rows whose products a warp runs side by side
#define SKINNY_TC(NT) ((NT) < 4 ? (NT) : 4)

// Lane `table_lane` = table + 4 · lane: its copy of the entry of byte I of `word`.
template <int I>
__device__ __forceinline__ uint32_t skinny_pair(const uint8_t* table_lane, uint32_t word) {
    return *reinterpret_cast<const uint32_t*>(table_lane + (__byte_perm(word, 0, 0x4440 | I) << 7));
}

// Waits until at most `pending` (0 to 2) groups of copies are in flight.
__device__ __forceinline__ void skinny_wait(int pending) {
    if (pending >= 2) cp_async_wait<2>();
    else if (pending == 1) cp_async_wait<1>();
    else cp_async_wait<0>();
}

// Shared memory (dynamic): the table, then `stages` stages (2 to 4), each x's 8·NT rows (pitch
// 528), the tile's W rows (128 bytes, 16-byte chunk j of row r at j ^ 2(r & 3)) and its rows'
// scales (16 bytes a row: four f32 absmax, or four 8-bit codes and their absmax2).
template <typename T, int NT>
__device__ void nf4_skinny(const T* __restrict__ x, int n, int in, int groups, int accumulate, const Nf4Segments& p,
                           float* __restrict__ partial, unsigned* __restrict__ arrived, int splits, int per,
                           int stages) {
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float dmap[256];
    __shared__ int last_split;
    const int tid = threadIdx.x, threads = blockDim.x, lane = tid & 31, warp = tid >> 5, warps = threads >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int tile_rows = SKINNY_WARP_ROWS * warps, tile_groups = tile_rows / 16;
    const int supers = in / SKINNY_KC;
    const int64_t row_bytes = in / 2, blocks_per_row = in / NF4_BLOCK;
    const int x_bytes = 8 * NT * SKINNY_X_PITCH, w_bytes = tile_rows * 128;
    const int stage_bytes = x_bytes + w_bytes + tile_rows * 16;
    const int tiles = (groups + tile_groups - 1) / tile_groups;
    const int units = tiles * splits;
    // super-chunks of unit u (split u % splits of tile u / splits)
    auto count_of = [&](int u) { return min(per, supers - (u % splits) * per); };

    // the issuing side's cursor: unit iu, its super-chunk ij
    int iu = blockIdx.x, ij = 0;
    int icount = iu < units ? count_of(iu) : 0;
    // the cursor's stage of x, W and scales into stage st; rows past the batch or a segment as zeros
    auto issue = [&](int st) {
        uint8_t* xs = smem + SKINNY_TABLE + st * stage_bytes;
        uint8_t* ws = xs + x_bytes;
        uint8_t* ss = ws + w_bytes;
        const int tile = iu / splits, sc = (iu % splits) * per + ij;
        for (int i = tid; i < 8 * NT * 32; i += threads) {
            const int r = i >> 5, part = i & 31;
            const bool ok = r < n;
            cp_async16(xs + r * SKINNY_X_PITCH + 16 * part,
                       x + (int64_t)(ok ? r : 0) * in + sc * SKINNY_KC + 8 * part, ok);
        }
        for (int i = tid; i < tile_rows * 8; i += threads) {
            const int r = i >> 3, part = i & 7;
            const int group = tile * tile_groups + (r >> 4);
            const Nf4Segment s = segment_of(p, group);
            const int row = (group - s.block0) * 16 + (r & 15);
            const bool ok = group < groups && row < s.out;
            const int64_t w_at = ok ? (int64_t)row * row_bytes + sc * (SKINNY_KC / 2) + 16 * part : 0;
            cp_async16(ws + r * 128 + 16 * (part ^ (2 * (r & 3))), s.packed + w_at, ok);
            if (part == 0) {
                const int64_t block = ok ? (int64_t)row * blocks_per_row + 4 * sc : 0;
                if (s.codes == nullptr) {
                    cp_async16(ss + 16 * r, s.absmax + block, ok);
                } else {
                    cp_async4(ss + 16 * r, s.codes + block, ok);
                    cp_async4(ss + 16 * r + 4, s.absmax2 + block / DQ_BLOCK, ok);
                }
            }
        }
        if (++ij == icount) {
            ij = 0, iu += gridDim.x;
            icount = iu < units ? count_of(iu) : 0;
        }
    };

    for (int i = 0; i < stages - 1; i++) {
        if (iu < units) issue(i);
        cp_async_commit();
    }
    // the table and the dynamic map while the first stage is in flight
    for (int i = tid; i < 256 * 8; i += threads) {
        const int b = i >> 3;
        const uint32_t v = pack2<T>(NF4_CODE[b >> 4], NF4_CODE[b & 15]);
        *reinterpret_cast<uint4*>(smem + 128 * b + 16 * (i & 7)) = make_uint4(v, v, v, v);
    }
    for (int i = tid; i < 256; i += threads) dmap[i] = DYNAMIC_MAP[i];

    const uint8_t* table = smem + 4 * lane;
    const int swz = 2 * (g & 3);
    float acc[SKINNY_GW][NT][4];
#pragma unroll
    for (int q = 0; q < SKINNY_GW; q++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[q][t][e] = 0.0f;

    // the computing side: unit u, its super-chunk j, in stage st
    int u = blockIdx.x, j = 0, st = 0;
    int count = u < units ? count_of(u) : 0;
    while (u < units) {
        // stage st has landed and every warp is done with the one before it, which takes the next copies
        skinny_wait(stages - 2);
        __syncthreads();
        if (iu < units) issue(st == 0 ? stages - 1 : st - 1);
        cp_async_commit();
        const uint8_t* xs = smem + SKINNY_TABLE + st * stage_bytes;
        const uint8_t* ws = xs + x_bytes;
        const uint8_t* ss = ws + w_bytes;
        st = st + 1 == stages ? 0 : st + 1;
        const int tile = u / splits;

        // the absmax of rows g and g + 8 of the warp's groups in each of the stage's four blocks
        float amax[SKINNY_GW][2][4];
#pragma unroll
        for (int q = 0; q < SKINNY_GW; q++) {
            const Nf4Segment s = segment_of(p, tile * tile_groups + SKINNY_GW * warp + q);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint8_t* sr = ss + 16 * (16 * (SKINNY_GW * warp + q) + g + 8 * h);
                if (s.codes == nullptr) {
                    const float4 v = *reinterpret_cast<const float4*>(sr);
                    amax[q][h][0] = v.x, amax[q][h][1] = v.y, amax[q][h][2] = v.z, amax[q][h][3] = v.w;
                } else {
                    const uint32_t codes = *reinterpret_cast<const uint32_t*>(sr);
                    const float a2 = *reinterpret_cast<const float*>(sr + 4);
#pragma unroll
                    for (int b = 0; b < 4; b++) amax[q][h][b] = restore_absmax(dmap[(codes >> (8 * b)) & 0xFF], a2, s.offset);
                }
            }
        }
        // (four tiles and more: one block at a time, so the compiler does not hold every block's
        // operands at once)
#pragma unroll(NT >= 4 ? 1 : 4)
        for (int b = 0; b < 4; b++) {
            const int at = 16 * ((2 * b + (c >> 1)) ^ swz) + 8 * (c & 1);
            // the mma's A operand of steps 0 .. 3 for each group: bytes 2s and 2s + 1 of the lane's
            // 8 of rows g and g + 8 (quad c takes values 16c .. 16c + 15 of the block, in W and x)
            uint32_t a[SKINNY_GW][4][4];
#pragma unroll
            for (int q = 0; q < SKINNY_GW; q++) {
                const uint8_t* row_a = ws + (16 * (SKINNY_GW * warp + q) + g) * 128;
                const uint2 wa = *reinterpret_cast<const uint2*>(row_a + at);
                const uint2 wb = *reinterpret_cast<const uint2*>(row_a + 8 * 128 + at);
                a[q][0][0] = skinny_pair<0>(table, wa.x), a[q][0][2] = skinny_pair<1>(table, wa.x);
                a[q][1][0] = skinny_pair<2>(table, wa.x), a[q][1][2] = skinny_pair<3>(table, wa.x);
                a[q][2][0] = skinny_pair<0>(table, wa.y), a[q][2][2] = skinny_pair<1>(table, wa.y);
                a[q][3][0] = skinny_pair<2>(table, wa.y), a[q][3][2] = skinny_pair<3>(table, wa.y);
                a[q][0][1] = skinny_pair<0>(table, wb.x), a[q][0][3] = skinny_pair<1>(table, wb.x);
                a[q][1][1] = skinny_pair<2>(table, wb.x), a[q][1][3] = skinny_pair<3>(table, wb.x);
                a[q][2][1] = skinny_pair<0>(table, wb.y), a[q][2][3] = skinny_pair<1>(table, wb.y);
                a[q][3][1] = skinny_pair<2>(table, wb.y), a[q][3][3] = skinny_pair<3>(table, wb.y);
            }
            float sa[SKINNY_GW], sb[SKINNY_GW];
#pragma unroll
            for (int q = 0; q < SKINNY_GW; q++) {
                sa[q] = b == 0 ? amax[q][0][0] : b == 1 ? amax[q][0][1] : b == 2 ? amax[q][0][2] : amax[q][0][3];
                sb[q] = b == 0 ? amax[q][1][0] : b == 1 ? amax[q][1][1] : b == 2 ? amax[q][1][2] : amax[q][1][3];
            }
            // TC tiles at a time, their 2 · TC block sums independent products issued in turn (one
            // sum's four steps back to back would each wait for the last)
#pragma unroll
            for (int t0 = 0; t0 < NT; t0 += SKINNY_TC(NT)) {
                constexpr int TC = SKINNY_TC(NT);
                uint4 xv[TC][2];
#pragma unroll
                for (int tt = 0; tt < TC; tt++) {
                    const uint8_t* xr = xs + (8 * (t0 + tt) + g) * SKINNY_X_PITCH + 128 * b + 32 * c;
                    xv[tt][0] = *reinterpret_cast<const uint4*>(xr);
                    xv[tt][1] = *reinterpret_cast<const uint4*>(xr + 16);
                }
                float sum[TC][SKINNY_GW][4];
#pragma unroll
                for (int tt = 0; tt < TC; tt++)
#pragma unroll
                    for (int q = 0; q < SKINNY_GW; q++)
#pragma unroll
                        for (int e = 0; e < 4; e++) sum[tt][q][e] = 0.0f;
#pragma unroll
                for (int step = 0; step < 4; step++)
#pragma unroll
                    for (int tt = 0; tt < TC; tt++)
#pragma unroll
                        for (int q = 0; q < SKINNY_GW; q++) {
                            const uint4& v = xv[tt][step >> 1];
                            mma<T>(sum[tt][q], a[q][step], step & 1 ? v.z : v.x, step & 1 ? v.w : v.y);
                        }
#pragma unroll
                for (int tt = 0; tt < TC; tt++)
#pragma unroll
                    for (int q = 0; q < SKINNY_GW; q++) {
                        acc[q][t0 + tt][0] = fmaf(sum[tt][q][0], sa[q], acc[q][t0 + tt][0]);
                        acc[q][t0 + tt][1] = fmaf(sum[tt][q][1], sa[q], acc[q][t0 + tt][1]);
                        acc[q][t0 + tt][2] = fmaf(sum[tt][q][2], sb[q], acc[q][t0 + tt][2]);
                        acc[q][t0 + tt][3] = fmaf(sum[tt][q][3], sb[q], acc[q][t0 + tt][3]);
                    }
            }
        }
        if (++j < count) continue;

        // the unit's last stage: accumulator e of tile t, group q is row g + 8 (e / 2) of the
        // group, batch row 8t + 2c + e % 2
        if (splits == 1) {
#pragma unroll
            for (int q = 0; q < SKINNY_GW; q++) {
                const int group = tile * tile_groups + SKINNY_GW * warp + q;
                const Nf4Segment s = segment_of(p, group);
                const int row0 = (group - s.block0) * 16;
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (group < groups)
                            segment_output<T>(s, row0 + g + 8 * (e / 2), 8 * t + 2 * c + (e % 2), n, accumulate, acc[q][t][e]);
                        acc[q][t][e] = 0.0f;
                    }
            }
        } else {
            // this split's sums into the workspace [split][n][16 · groups]; the last split of the
            // tile to arrive adds them all, in split order, and does the epilogue
            const int split = u % splits;
            const int64_t rows_total = (int64_t)groups * 16;
#pragma unroll
            for (int q = 0; q < SKINNY_GW; q++) {
                const int group = tile * tile_groups + SKINNY_GW * warp + q;
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int nn = 8 * t + 2 * c + (e % 2);
                        if (group < groups && nn < n)
                            partial[((int64_t)split * n + nn) * rows_total + group * 16 + g + 8 * (e / 2)] = acc[q][t][e];
                        acc[q][t][e] = 0.0f;
                    }
            }
            __threadfence();
            __syncthreads();
            if (tid == 0) last_split = atomicAdd(arrived + tile, 1u) == (unsigned)(splits - 1);
            __syncthreads();
            if (last_split) {
                __threadfence();
                // four rows a thread, every split's loads issued before the sums
                for (int o = 4 * tid; o < tile_rows * n; o += 4 * threads) {
                    const int r = o % tile_rows, nn = o / tile_rows;
                    const int group = tile * tile_groups + r / 16;
                    if (group >= groups) continue;
                    const float4* at =
                        reinterpret_cast<const float4*>(partial + (int64_t)nn * rows_total + group * 16 + (r & 15));
                    const int64_t split_stride = (int64_t)n * rows_total / 4;
                    float4 v = __ldcg(at);
#pragma unroll 4
                    for (int sp = 1; sp < splits; sp++) {
                        const float4 w = __ldcg(at + sp * split_stride);
                        v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
                    }
                    const Nf4Segment s = segment_of(p, group);
                    const int row = (group - s.block0) * 16 + (r & 15);
                    segment_output<T>(s, row, nn, n, accumulate, v.x);
                    segment_output<T>(s, row + 1, nn, n, accumulate, v.y);
                    segment_output<T>(s, row + 2, nn, n, accumulate, v.z);
                    segment_output<T>(s, row + 3, nn, n, accumulate, v.w);
                }
                if (tid == 0) arrived[tile] = 0;
            }
        }
        j = 0, u += gridDim.x;
        count = u < units ? count_of(u) : 0;
    }
    cp_async_wait<0>();
}

#define NF4_SKINNY(NAME, T, NT)                                                                    \
    extern "C" __global__ void __launch_bounds__(256, 1)                                            \
        nf4_skinny_##NAME##_##NT(const T* x, int n, int in, int groups, int accumulate,            \
                                 const Nf4Segments p, float* partial, unsigned* arrived, int splits, \
                                 int per, int stages) {                                             \
        nf4_skinny<T, NT>(x, n, in, groups, accumulate, p, partial, arrived, splits, per, stages);  \
    }
// 1, 2, 4 or 8 tiles of 8 batch rows
#define NF4_SKINNYS(NAME, T) \
    NF4_SKINNY(NAME, T, 1) NF4_SKINNY(NAME, T, 2) NF4_SKINNY(NAME, T, 4) NF4_SKINNY(NAME, T, 8)
NF4_SKINNYS(f16, __half)
NF4_SKINNYS(bf16, __nv_bfloat16)
