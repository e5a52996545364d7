// Embedding lookup from a table in mapped page-locked host memory: the GPU reads a step's rows
// over PCIe itself, so the table (250-313 MiB for 7B/13B) needs no VRAM and the lookup no host
// work. src/model/ops/embedding.rs keeps index_select as the reference.
#include <stdint.h>

// out[i] = table[ids[i]], rows of `row_vecs` 16-byte vectors; one block per id. An id outside the
// table gives a zero row (train checks the tokenizer's ids against the table before it starts).
extern "C" __global__ void embedding_gather(const uint4* table, const uint32_t* ids, uint4* out, int row_vecs,
                                            uint32_t vocab) {
    const uint32_t id = ids[blockIdx.x];
    const bool in = id < vocab;
    const uint4* src = table + (long long)(in ? id : 0) * row_vecs;
    uint4* dst = out + (long long)blockIdx.x * row_vecs;
    for (int j = threadIdx.x; j < row_vecs; j += blockDim.x) dst[j] = in ? src[j] : make_uint4(0, 0, 0, 0);
}
