// The weights of one NF4 decode-projection launch (nf4_gemv.cu's kernels) and what each
// output row adds: bias, residual, the LoRA term. nf4_gemv.rs mirrors the structs.
#pragma once
#include <stdint.h>

#include "dtype.cuh"

#define MAX_SEGMENTS 3

// One weight of a launch and where its rows go. Pointers are device addresses; a null one is
// absent. nf4_gemv.rs mirrors the layout (`Segment`).
struct Nf4Segment {
    const uint8_t* packed;    // [out · in / 2], the first value of a byte in its high nibble
    const float* absmax;      // [out · in / 64] plain absmax, or null when double-quantized
    const uint8_t* codes;     // [out · in / 64] 8-bit absmax codes
    const float* absmax2;     // [out · in / 64 / 256] their scales
    void* y;                  // [n, out] of T
    const void* residual;     // [n, out] of T added, or null
    const void* bias;         // [out] of T added, or null
    const float* lora_h;      // [n, h_stride] f32: scale · x·Aᵀ, this segment's columns from h_col
    const float* lora_b;      // [out, rank] f32
    float offset;             // added back to a double-quantized absmax
    int out;
    int block0;               // the first block of the grid computing this segment
    int h_stride;
    int h_col;
    int rank;                 // 0: no LoRA term
};
struct Nf4Segments {
    Nf4Segment s[MAX_SEGMENTS];
    int count;
    int pad;
};

// The segment 16-row group `group` of a launch belongs to.
__device__ __forceinline__ Nf4Segment segment_of(const Nf4Segments& p, int group) {
    Nf4Segment s = p.s[0];
    if (p.count > 1 && group >= p.s[1].block0) s = p.s[1];
    if (p.count > 2 && group >= p.s[2].block0) s = p.s[2];
    return s;
}

// One output of a launch: y[nn, row] = v (the sum of code · x · absmax) + the LoRA term +
// bias + residual (+ y with `accumulate`), rounded once; nothing past the segment's rows or the
// batch.
template <typename T>
__device__ __forceinline__ void segment_output(const Nf4Segment& s, int row, int nn, int n, int accumulate, float v) {
    if (row >= s.out || nn >= n) return;
    if (s.rank > 0) {
        const float* h = s.lora_h + (int64_t)nn * s.h_stride + s.h_col;
        const float* b = s.lora_b + (int64_t)row * s.rank;
        for (int q = 0; q < s.rank; q++) v = fmaf(h[q], b[q], v);
    }
    T* y = reinterpret_cast<T*>(s.y);
    const int64_t at = (int64_t)nn * s.out + row;
    if (s.bias != nullptr) v += to_f32(reinterpret_cast<const T*>(s.bias)[row]);
    if (s.residual != nullptr) v += to_f32(reinterpret_cast<const T*>(s.residual)[at]);
    if (accumulate) v += to_f32(y[at]);
    store(y + at, v);
}
