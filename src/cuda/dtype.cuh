// Loads and stores of the three compute dtypes through f32, shared by the project's kernels.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// 16-byte vectors of a dtype: VEC<T> values per load or store, for bandwidth-bound kernels.
#include <stdint.h>
template <typename T>
struct Vec16 {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};
template <typename T>
__device__ __forceinline__ Vec16<T> load16(const T* p) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    return *reinterpret_cast<const Vec16<T>*>(&raw);
}
template <typename T>
__device__ __forceinline__ void store16(T* p, const Vec16<T>& x) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&x);
}
// Whether every pointer sits on a 16-byte boundary.
__device__ __forceinline__ bool aligned16(const void* a, const void* b, const void* c, const void* d = nullptr) {
    return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | reinterpret_cast<uintptr_t>(c) |
             reinterpret_cast<uintptr_t>(d)) & 15) == 0;
}
