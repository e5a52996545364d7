// Tensor-core building blocks of the attention kernels (sm_80+): mma.sync m16n8k16 with f32
// accumulators, cp.async copies into shared memory and ldmatrix out of it, and the quad
// reductions of the mma accumulator layout (four lanes hold one row).
#pragma once
#include <stdint.h>

#include "dtype.cuh"

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

template <typename T>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__half>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// --- shared memory (sm_80+): asynchronous copies in, ldmatrix out ---
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without a trip through registers; `valid` false writes zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
// 16 bytes global -> shared of which the first `bytes` (0 to 16) are read, the rest zeros.
__device__ __forceinline__ void cp_async16_first(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes));
}
// 4 bytes global -> shared (through L1); `valid` false writes zeros.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// The 16x16 A operand at (r0, k0) of a row-major smem tile with leading dimension ld.
template <typename T>
__device__ __forceinline__ void ldsm_a(uint32_t a[4], const T* tile, int ld, int r0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4(a, tile + (r0 + l % 16) * ld + k0 + l / 16 * 8);
}

// B operands of the two 16x8 tiles n0 and n0 + 8 at k0, from [n][k] storage (B[k][n] = x[n][k]):
// {b0, b1} of the first tile, then of the second.
template <typename T>
__device__ __forceinline__ void ldsm_b_nk(uint32_t b[4], const T* tile, int ld, int n0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4(b, tile + (n0 + l % 8 + l / 16 * 8) * ld + k0 + l / 8 % 2 * 8);
}

// The same from [k][n] storage (B[k][n] = x[k][n]), transposed on the way out.
template <typename T>
__device__ __forceinline__ void ldsm_b_kn(uint32_t b[4], const T* tile, int ld, int k0, int n0) {
    const int l = threadIdx.x % 32;
    ldsm_x4_trans(b, tile + (k0 + l % 8 + l / 8 % 2 * 8) * ld + n0 + l / 16 * 8);
}

// The 16x16 A operand at (r0, k0) of A = X^T, X a row-major [k][r] smem tile: A[r][k] = X[k][r].
template <typename T>
__device__ __forceinline__ void ldsm_a_trans(uint32_t a[4], const T* tile, int ld, int r0, int k0) {
    const int l = threadIdx.x % 32;
    ldsm_x4_trans(a, tile + (k0 + l % 8 + l / 16 * 8) * ld + r0 + l / 8 % 2 * 8);
}

// Accumulators of two neighbouring 16x8 tiles as the A fragment of a 16x16 product (FA-2's
// register reuse: the C layout of tiles n and n+1 is the A layout of one k-step).
template <typename T>
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack2<T>(c0[0], c0[1]);
    a[1] = pack2<T>(c0[2], c0[3]);
    a[2] = pack2<T>(c1[0], c1[1]);
    a[3] = pack2<T>(c1[2], c1[3]);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}
