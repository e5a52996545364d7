// Sums and maxima across the threads of a block, every thread getting the result. The including
// file defines THREADS (the block size: a multiple of 32, at most 1024) before including this.
#pragma once

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, off));
    return v;
}

// `combine` of the whole block: each warp reduces, then warp 0's lanes reduce the warp results.
template <typename Combine>
__device__ __forceinline__ float block_reduce(float v, float identity, Combine combine) {
    __shared__ float warp_vals[THREADS / 32];
    v = combine(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // warp_vals may still be read by a previous reduction
    if (lane == 0) warp_vals[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? warp_vals[lane] : identity;
    return combine(v);
}

__device__ float block_sum(float v) {
    return block_reduce(v, 0.0f, [](float x) { return warp_sum(x); });
}

__device__ float block_max(float v) {
    return block_reduce(v, -INFINITY, [](float x) { return warp_max(x); });
}
