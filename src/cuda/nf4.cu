// NF4 + double quantization on the GPU, bit-exact with bitsandbytes 0.50 (csrc/kernels.cu).
//
// Compiled with --use_fast_math like bitsandbytes, so `1.0f / absmax` is the same approximate
// reciprocal their kernels use. Sums and products that bitsandbytes rounds separately (torch ops
// between its kernels) use __fsub_rn/__fmul_rn/__fadd_rn so nvcc cannot fuse them into an FMA.
// src/cuda/nf4.rs launches these; src/quant/{nf4,dynamic,double}.rs are the CPU reference.
#include <stdint.h>

#include "dtype.cuh"

#define NF4_BLOCK 64
#define DQ_BLOCK 256

__constant__ float NF4_CODE[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

// bitsandbytes' signed dynamic map (create_dynamic_map()); a test checks it against
// quant::dynamic::dynamic_map() value for value.
__constant__ float DYNAMIC_MAP[256] = {
    -0.992968738f, -0.978906274f, -0.96484375f, -0.950781226f, -0.936718762f, -0.922656238f, -0.908593774f, -0.89453125f,
    -0.880468726f, -0.866406262f, -0.852343738f, -0.838281274f, -0.82421875f, -0.810156226f, -0.796093762f, -0.782031238f,
    -0.767968774f, -0.75390625f, -0.739843726f, -0.725781262f, -0.711718798f, -0.697656274f, -0.68359375f, -0.669531226f,
    -0.655468762f, -0.641406298f, -0.627343774f, -0.61328125f, -0.599218726f, -0.585156262f, -0.571093798f, -0.557031274f,
    -0.54296875f, -0.528906226f, -0.514843702f, -0.500781238f, -0.486718714f, -0.47265625f, -0.458593726f, -0.444531262f,
    -0.430468738f, -0.416406244f, -0.40234375f, -0.388281226f, -0.374218762f, -0.360156238f, -0.346093744f, -0.33203125f,
    -0.317968726f, -0.303906262f, -0.289843738f, -0.275781274f, -0.26171875f, -0.247656241f, -0.233593747f, -0.219531253f,
    -0.205468744f, -0.19140625f, -0.177343756f, -0.163281247f, -0.149218753f, -0.135156244f, -0.12109375f, -0.107031256f,
    -0.0985937491f, -0.0957812592f, -0.0929687545f, -0.0901562497f, -0.0873437524f, -0.0845312476f, -0.0817187577f, -0.078906253f,
    -0.0760937482f, -0.0732812509f, -0.0704687461f, -0.0676562563f, -0.0648437515f, -0.0620312504f, -0.0592187531f, -0.0564062484f,
    -0.053593751f, -0.05078125f, -0.047968749f, -0.0451562516f, -0.0423437469f, -0.0395312496f, -0.0367187522f, -0.0339062512f,
    -0.0310937501f, -0.028281251f, -0.0254687499f, -0.0226562507f, -0.0198437516f, -0.0170312505f, -0.0142187504f, -0.0114062503f,
    -0.00971874967f, -0.00915624946f, -0.00859375019f, -0.00803124998f, -0.00746874977f, -0.00690625003f, -0.00634374982f, -0.00578125007f,
    -0.00521875033f, -0.00465624966f, -0.00409374991f, -0.00353124971f, -0.00296874996f, -0.00240624999f, -0.00184375001f, -0.00128124992f,
    -0.000943750085f, -0.000831249985f, -0.00071875006f, -0.000606250076f, -0.000493750034f, -0.000381250022f, -0.000268750038f, -0.000156250011f,
    -8.87499991e-05f, -6.62500024e-05f, -4.37499984e-05f, -2.12499981e-05f, -7.7499999e-06f, -3.25000019e-06f, -5.50000038e-07f, 0.0f,
    5.50000038e-07f, 3.25000019e-06f, 7.7499999e-06f, 2.12499981e-05f, 4.37499984e-05f, 6.62500024e-05f, 8.87499991e-05f, 0.000156250011f,
    0.000268750038f, 0.000381250022f, 0.000493750034f, 0.000606250076f, 0.00071875006f, 0.000831249985f, 0.000943750085f, 0.00128124992f,
    0.00184375001f, 0.00240624999f, 0.00296874996f, 0.00353124971f, 0.00409374991f, 0.00465624966f, 0.00521875033f, 0.00578125007f,
    0.00634374982f, 0.00690625003f, 0.00746874977f, 0.00803124998f, 0.00859375019f, 0.00915624946f, 0.00971874967f, 0.0114062503f,
    0.0142187504f, 0.0170312505f, 0.0198437516f, 0.0226562507f, 0.0254687499f, 0.028281251f, 0.0310937501f, 0.0339062512f,
    0.0367187522f, 0.0395312496f, 0.0423437469f, 0.0451562516f, 0.047968749f, 0.05078125f, 0.053593751f, 0.0564062484f,
    0.0592187531f, 0.0620312504f, 0.0648437515f, 0.0676562563f, 0.0704687461f, 0.0732812509f, 0.0760937482f, 0.078906253f,
    0.0817187577f, 0.0845312476f, 0.0873437524f, 0.0901562497f, 0.0929687545f, 0.0957812592f, 0.0985937491f, 0.107031256f,
    0.12109375f, 0.135156244f, 0.149218753f, 0.163281247f, 0.177343756f, 0.19140625f, 0.205468744f, 0.219531253f,
    0.233593747f, 0.247656241f, 0.26171875f, 0.275781274f, 0.289843738f, 0.303906262f, 0.317968726f, 0.33203125f,
    0.346093744f, 0.360156238f, 0.374218762f, 0.388281226f, 0.40234375f, 0.416406244f, 0.430468738f, 0.444531262f,
    0.458593726f, 0.47265625f, 0.486718714f, 0.500781238f, 0.514843702f, 0.528906226f, 0.54296875f, 0.557031274f,
    0.571093798f, 0.585156262f, 0.599218726f, 0.61328125f, 0.627343774f, 0.641406298f, 0.655468762f, 0.669531226f,
    0.68359375f, 0.697656274f, 0.711718798f, 0.725781262f, 0.739843726f, 0.75390625f, 0.767968774f, 0.782031238f,
    0.796093762f, 0.810156226f, 0.82421875f, 0.838281274f, 0.852343738f, 0.866406262f, 0.880468726f, 0.89453125f,
    0.908593774f, 0.922656238f, 0.936718762f, 0.950781226f, 0.96484375f, 0.978906274f, 0.992968738f, 1.0f,
};

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
        amax = codes ? __fadd_rn(__fmul_rn(DYNAMIC_MAP[codes[block]], absmax2[block / DQ_BLOCK]), offset)
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
