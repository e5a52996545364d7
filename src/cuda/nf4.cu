// NF4 + double quantization on the GPU, bit-exact with bitsandbytes 0.50 (csrc/kernels.cu).
//
// Compiled with --use_fast_math like bitsandbytes, so `1.0f / absmax` is the same approximate
// reciprocal their kernels use. Sums and products that bitsandbytes rounds separately (torch ops
// between its kernels) use __fsub_rn/__fmul_rn/__fadd_rn so nvcc cannot fuse them into an FMA.
// src/cuda/nf4.rs launches these; src/quant/{nf4,dynamic,double}.rs are the CPU reference.
#include <stdint.h>

#include "dtype.cuh"
#include "nf4_tables.cuh"

// bitsandbytes' dQuantizeNF4 decision tree (thresholds are the midpoints of the codebook).
__device__ __forceinline__ uint8_t quantize_nf4(float x) {
    if (x > 0.03979014977812767f)
        if (x > 0.3893125355243683f)
            if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 0b1111 : 0b1110;
            else return x > 0.5016634166240692f ? 0b1101 : 0b1100;
        else if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 0b1011 : 0b1010;
        else return x > 0.1202552504837513f ? 0b1001 : 0b1000;
    else if (x > -0.33967943489551544f)
        if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 0b0111 : 0b0110;
        else return x > -0.23460740596055984f ? 0b0101 : 0b0100;
    else if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 0b0011 : 0b0010;
    else return x > -0.8480964004993439f ? 0b0001 : 0b0000;
}

// bitsandbytes' dQuantize<0>: binary search in the 256-entry map, then the nearer neighbour.
__device__ uint8_t quantize_dynamic(float x) {
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = -1.0f, upper = 1.0f;
    float val = DYNAMIC_MAP[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) { lower_pivot = pivot; lower = val; pivot += i; }
        else { upper_pivot = pivot; upper = val; pivot -= i; }
        val = DYNAMIC_MAP[pivot];
    }
    if (upper_pivot == 255) upper = DYNAMIC_MAP[upper_pivot];
    if (lower_pivot == 0) lower = DYNAMIC_MAP[lower_pivot];
    if (x > val) return x > (upper + val) * 0.5f ? upper_pivot : pivot;
    return x < (lower + val) * 0.5f ? lower_pivot : pivot;
}


// One thread per pair of values; a warp covers one 64-value block, so its absmax is a warp max.
// Values past n count as 0, as bitsandbytes pads its loads.
template <typename T>
__device__ void nf4_absmax(const T* x, float* absmax, int64_t n) {
    const int64_t i = 2 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x);
    const float a = i < n ? to_f32(x[i]) : 0.0f;
    const float b = i + 1 < n ? to_f32(x[i + 1]) : 0.0f;
    float amax = fmaxf(fmaxf(-3.402823466e+38f, fabsf(a)), fabsf(b));
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, off));
    if (i < n && (threadIdx.x & 31) == 0) absmax[i / NF4_BLOCK] = amax;
}

// One thread per output byte: the first value in the high nibble. A zero block gives
// 0 * inf = NaN, which the tree maps to code 0, as in bitsandbytes.
template <typename T>
__device__ void nf4_pack(const T* x, const float* absmax, uint8_t* packed, int64_t n) {
    const int64_t byte = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t i = 2 * byte;
    if (i >= n) return;
    const float scale = 1.0f / absmax[i / NF4_BLOCK];
    const float a = to_f32(x[i]);
    const float b = i + 1 < n ? to_f32(x[i + 1]) : 0.0f;
    packed[byte] = (quantize_nf4(a * scale) << 4) | quantize_nf4(b * scale);
}

// The codebook is read by warp shuffle from the lanes that hold it: a
// __constant__ lookup with a different index per lane is serialized. `codes == nullptr`: the
// absmax values are plain f32; otherwise each is restored from its 8-bit code as code * absmax2,
// then + offset, each rounded (bitsandbytes' dequantize_blockwise, then torch's `absmax +=
// offset`). The products are the same f32 multiplications as bitsandbytes'.
__device__ __forceinline__ void store8(float* out, const float (&v)[8]) {
    reinterpret_cast<float4*>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(__half* out, const float (&v)[8]) {
    __half2 h[4];
    for (int j = 0; j < 4; j++) h[j] = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
    *reinterpret_cast<uint4*>(out) = *reinterpret_cast<uint4*>(h);
}
__device__ __forceinline__ void store8(__nv_bfloat16* out, const float (&v)[8]) {
    __nv_bfloat162 h[4];
    for (int j = 0; j < 4; j++) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
    *reinterpret_cast<uint4*>(out) = *reinterpret_cast<uint4*>(h);
}

// Sixteen values (eight packed bytes, one 8-byte load) per thread, stored with two 16-byte
// (f16/bf16) or four (f32) vector stores: twice the bytes in flight per thread of eight, which
// made dequantization faster (benches/code_notes.md). Sixteen values never straddle a 64-value
// block.
template <typename T>
__device__ void nf4_dequantize(const uint8_t* packed, const float* absmax, const uint8_t* codes,
                               const float* absmax2, float offset, T* out, int64_t n) {
    const float lane_code = NF4_CODE[threadIdx.x & 15];
    const int64_t i = 16 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x);
    const bool live = i < n;
    // every lane takes part in the shuffles below
    const int64_t block = live ? i / NF4_BLOCK : 0;
    float amax = 0.0f;
    if (live)
        amax = codes ? restore_absmax(DYNAMIC_MAP[codes[block]], absmax2[block / DQ_BLOCK], offset)
                     : absmax[block];
    uint8_t q[8];
    if (live && i + 16 <= n && (reinterpret_cast<uintptr_t>(packed + i / 2) & 7) == 0) {
        *reinterpret_cast<uint2*>(q) = *reinterpret_cast<const uint2*>(packed + i / 2);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) q[j] = live && i + 2 * j < n ? packed[i / 2 + j] : 0;
    }
    float lo[8], hi[8];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        lo[2 * j] = __shfl_sync(0xffffffff, lane_code, q[j] >> 4) * amax;
        lo[2 * j + 1] = __shfl_sync(0xffffffff, lane_code, q[j] & 0x0F) * amax;
        hi[2 * j] = __shfl_sync(0xffffffff, lane_code, q[4 + j] >> 4) * amax;
        hi[2 * j + 1] = __shfl_sync(0xffffffff, lane_code, q[4 + j] & 0x0F) * amax;
    }
    if (!live) return;
    if (i + 16 <= n) {
        store8(out + i, lo);
        store8(out + i + 8, hi);
    } else {
        for (int j = 0; j < 8 && i + j < n; j++) store(out + i + j, lo[j]);
        for (int j = 0; j < 8 && i + 8 + j < n; j++) store(out + i + 8 + j, hi[j]);
    }
}
#define NF4_OPS(NAME, T)                                                                            \
    extern "C" __global__ void nf4_absmax_##NAME(const T* x, float* absmax, int64_t n) {            \
        nf4_absmax<T>(x, absmax, n);                                                                 \
    }                                                                                                \
    extern "C" __global__ void nf4_pack_##NAME(const T* x, const float* absmax, uint8_t* packed,    \
                                               int64_t n) {                                          \
        nf4_pack<T>(x, absmax, packed, n);                                                           \
    }                                                                                                \
    extern "C" __global__ void nf4_dequantize_##NAME(const uint8_t* packed, const float* absmax,    \
                                                     const uint8_t* codes, const float* absmax2,     \
                                                     float offset, T* out, int64_t n) {              \
        nf4_dequantize<T>(packed, absmax, codes, absmax2, offset, out, n);                           \
    }

NF4_OPS(f32, float)
NF4_OPS(f16, __half)
NF4_OPS(bf16, __nv_bfloat16)

// Double quantization, step 1: one CUDA block of 256 threads per 256 absmax values computes
// max |absmax - offset| (bitsandbytes' quantize_blockwise(absmax - offset, blocksize=256)).
extern "C" __global__ void dq_absmax2(const float* absmax, float offset, float* absmax2, int64_t n) {
    __shared__ float smem_max[DQ_BLOCK];
    const int64_t i = (int64_t)blockIdx.x * DQ_BLOCK + threadIdx.x;
    const float v = i < n ? __fsub_rn(absmax[i], offset) : 0.0f;
    smem_max[threadIdx.x] = fmaxf(-3.402823466e+38f, fabsf(v));
    __syncthreads();
    for (int s = DQ_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem_max[threadIdx.x] = fmaxf(smem_max[threadIdx.x], smem_max[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) absmax2[blockIdx.x] = smem_max[0];
}

// Step 2: one thread per absmax value, its 8-bit code.
extern "C" __global__ void dq_codes(const float* absmax, float offset, const float* absmax2, uint8_t* codes,
                                    int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = __fsub_rn(absmax[i], offset);
    codes[i] = quantize_dynamic(v * (1.0f / absmax2[i / DQ_BLOCK]));
}
