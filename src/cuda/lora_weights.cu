// A layer's LoRA weights in the compute dtype, for one forward: every adapter's f32 `lora_a`
// and `lora_b` (times its scale) cast in one launch, instead of a concatenation, a scale and a
// cast per adapter (~23 launches of ~2.5 us each per layer, each mostly launch latency).
// src/model/lora/adapter.rs keeps the composed casts as the CPU path and the tests' reference:
// each value is v * scale in f32, rounded once to the output dtype, as candle's affine + cast.
#include <stdint.h>

#include "dtype.cuh"

#define MAX_SEGMENTS 8

// Segment s copies src[s][0 .. start[s+1] - start[s]) times scale[s] into dst[s]; the segments
// are numbered by their place in one index space 0 .. start[count).
struct Segments {
    uint64_t src[MAX_SEGMENTS];
    uint64_t dst[MAX_SEGMENTS];
    int64_t start[MAX_SEGMENTS + 1];
    float scale[MAX_SEGMENTS];
    int count;
};

template <typename T>
__device__ void scaled_cast(const Segments& s) {
    const int64_t total = s.start[s.count];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int seg = 0;
        while (i >= s.start[seg + 1]) ++seg;
        const int64_t j = i - s.start[seg];
        const float v = reinterpret_cast<const float*>(s.src[seg])[j];
        store(reinterpret_cast<T*>(s.dst[seg]) + j, v * s.scale[seg]);
    }
}

extern "C" __global__ void scaled_cast_f32(const Segments s) { scaled_cast<float>(s); }
extern "C" __global__ void scaled_cast_f16(const Segments s) { scaled_cast<__half>(s); }
extern "C" __global__ void scaled_cast_bf16(const Segments s) { scaled_cast<__nv_bfloat16>(s); }
