// What the flash attention kernels (flash_attention.cu) share: their launch arguments, which keys
// a query sees, and the tile copies into shared memory.
//
// Layout: every tensor is [batch, heads, rows, head_dim] addressed through (b, h, row) strides
// with unit stride along head_dim. Query row i sits at position q_pos0 + i and sees key j when
// j <= pos and, with a window w > 0, pos - j < w (HF Mistral's rule). `lse` is kept in log2 units
// (log2 sum exp2(s * scale * log2 e)).
//
// Packed rows (data.packing: several sequences back to back in one row, attention never crossing
// from one to the next, as varlen / cu_seqlens attention) pass `spans`, i32 [batch * q_len, 2]:
// the start and the end (exclusive) of each token's sequence in its row; null for rows of one
// sequence. Query i then also needs j >= start(i). Every token lies in some span (padding is one
// more), so every query sees at least itself. Packed rows have q_len == kv_len (q_pos0 = 0).
// Spans only move the first visible key of each row, so they skip whole tiles the same way the
// window does: a forward block starts at the span start of its first row, a backward key block
// ends its query loop at the end of the span of its last key. Each kernel comes twice, PACKED
// (reading spans) and not: rows of one sequence run the code they ran before packing existed.
#pragma once
#include <stdint.h>

#include "mma.cuh"

#define WARPS 4
#define PAD 8  // smem row padding (elements): the 8 rows an ldmatrix reads fall in distinct banks

struct Dims {
    int batch, heads, kv_heads, q_len, kv_len, q_pos0, window;
    float scale_log2;  // softmax scale times log2(e)
};

struct Strides {
    long long b, h, row;
};

// --- rows of one sequence: causal, with an optional window ---
__device__ __forceinline__ bool visible(int pos, int key, int window) {
    return key <= pos && (window <= 0 || pos - key < window);
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

// --- packed rows: the same within each span ---
// The first key query row `row` of batch b sees: its span's start and, with a window,
// pos - w + 1. Non-decreasing in row, past q_len too (the span lookup is clamped to the last
// row), so the first row of a range has the range's smallest and its last row the largest.
__device__ __forceinline__ int first_key(const Dims& d, const int* spans, int b, int row) {
    const int pos = d.q_pos0 + row;
    const int first = d.window > 0 ? max(0, pos - d.window + 1) : 0;
    return max(first, spans[2 * ((long long)b * d.q_len + min(row, d.q_len - 1))]);
}

// Whether a query at `pos` whose first visible key is `first` sees `key`.
__device__ __forceinline__ bool visible_from(int pos, int first, int key) { return key <= pos && key >= first; }

// Queries at positions [pos_lo, pos_hi], first keys [first_lo, first_hi] (of the first and the
// last row), against keys [k_lo, k_hi]: none_visible and some_hidden of packed rows.
__device__ __forceinline__ bool none_visible_from(int pos_hi, int first_lo, int k_lo, int k_hi) {
    return k_lo > pos_hi || k_hi < first_lo;
}
__device__ __forceinline__ bool some_hidden_from(int pos_lo, int first_hi, int k_lo, int k_hi) {
    return k_hi > pos_lo || k_lo < first_hi;
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

