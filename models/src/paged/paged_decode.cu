// Paged attention for decoding rows on NVIDIA GPUs: each sequence's one new
// query row against its cached keys and values, read in place from the
// paged pool through the sequence's block table (no gathered copy).
//
// Pool layout (models/src/paged/tensors.rs): keys and values are each
// [num_blocks * 16, num_kv_heads * head_dim] in the storage dtype; position
// p of a sequence is row table[p / 16] * 16 + p % 16.
//
// One thread block (4 warps) per (query head, sequence). The lanes of a warp
// hold head_dim / 32 query elements each; the warps take every fourth key,
// score it with a warp-wide sum, and fold it into their own online softmax
// (running max, running sum, rescaled accumulator). The four partial states
// are merged in shared memory at the end. Arithmetic is in f32, as the CPU
// op's; queries arrive already rounded to the storage dtype.
//
// Built to PTX by models/build.rs with the `cuda` feature.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "../round_run.cuh"

#define WARPS 4
#define MAX_PER_LANE 8  // head_dim up to 256
#define BLOCK_POSITIONS 16

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// A query element rounded to the pool's dtype (as the CPU op rounds it).
template <typename T> __device__ __forceinline__ float rounded(float x);
template <> __device__ __forceinline__ float rounded<float>(float x) { return x; }
template <> __device__ __forceinline__ float rounded<__half>(float x) {
    return __half2float(__float2half_rn(x));
}
template <> __device__ __forceinline__ float rounded<__nv_bfloat16>(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
    return x;
}

// q:    the step's [tokens, num_heads, head_dim] f32 (sequence s's row is
//       meta[seqs + s]), rounded to T as it is loaded
// meta: [seqs] context lengths, [seqs] query rows, [seqs] offsets into the
//       tables that follow, then the block tables one after another (u32)
// out:  [seqs, num_heads, head_dim] f32, each run of 32 rounded to 8 bits
//       when round is 1 (round_run.cuh)
template <typename T, int PER_LANE>
__device__ void paged_decode(const float* __restrict__ q, const T* __restrict__ keys,
                             const T* __restrict__ values, const uint32_t* __restrict__ meta,
                             float* __restrict__ out, int seqs, int num_heads, int num_kv_heads,
                             float scale, int round) {
    const int head_dim = PER_LANE * 32;
    const int h = blockIdx.x;
    const int s = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int group = h / (num_heads / num_kv_heads);
    const uint32_t ctx = meta[s];
    const uint32_t* table = meta + 3 * seqs + meta[2 * seqs + s];
    const size_t width = (size_t)num_kv_heads * head_dim;

    float qv[PER_LANE];
    const float* qrow = q + ((size_t)meta[seqs + s] * num_heads + h) * head_dim;
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) qv[j] = rounded<T>(qrow[lane + 32 * j]);

    float m = -INFINITY, l = 0.f;
    float acc[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) acc[j] = 0.f;

    for (uint32_t t = warp; t < ctx; t += WARPS) {
        const size_t row = (size_t)table[t / BLOCK_POSITIONS] * BLOCK_POSITIONS + t % BLOCK_POSITIONS;
        const T* k = keys + row * width + (size_t)group * head_dim;
        const T* v = values + row * width + (size_t)group * head_dim;
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) dot += qv[j] * to_f32(k[lane + 32 * j]);
        const float score = warp_sum(dot) * scale;
        const float m_new = fmaxf(m, score);
        const float correction = __expf(m - m_new);
        const float p = __expf(score - m_new);
        l = l * correction + p;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) acc[j] = acc[j] * correction + p * to_f32(v[lane + 32 * j]);
        m = m_new;
    }

    __shared__ float s_m[WARPS], s_l[WARPS];
    __shared__ float s_acc[WARPS][MAX_PER_LANE * 32];
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) s_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();

    float big = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) big = fmaxf(big, s_m[w]);
    float weight[WARPS], total = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        // A warp that saw no key (ctx < WARPS) has m = -inf and weight 0.
        weight[w] = s_m[w] == -INFINITY ? 0.f : __expf(s_m[w] - big);
        total += s_l[w] * weight[w];
    }
    float* orow = out + ((size_t)s * num_heads + h) * head_dim;
    for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
        float y = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) y += s_acc[w][e] * weight[w];
        // With round, rounded for the quantized matmul it feeds (a warp
        // holds a whole run: head_dim is a multiple of 32).
        orow[e] = round ? round_run(y / total) : y / total;
    }
}

#define PAGED_DECODE(NAME, T, PER_LANE)                                                          \
    extern "C" __global__ void NAME(const float* q, const T* keys, const T* values,              \
                                    const uint32_t* meta, float* out, int seqs, int num_heads,   \
                                    int num_kv_heads, float scale, int round) {                  \
        paged_decode<T, PER_LANE>(q, keys, values, meta, out, seqs, num_heads, num_kv_heads,     \
                                  scale, round);                                                 \
    }

#define PAGED_DECODE_DIMS(SUFFIX, T)          \
    PAGED_DECODE(paged_decode_##SUFFIX##_d32, T, 1)  \
    PAGED_DECODE(paged_decode_##SUFFIX##_d64, T, 2)  \
    PAGED_DECODE(paged_decode_##SUFFIX##_d96, T, 3)  \
    PAGED_DECODE(paged_decode_##SUFFIX##_d128, T, 4) \
    PAGED_DECODE(paged_decode_##SUFFIX##_d256, T, 8)

PAGED_DECODE_DIMS(f32, float)
PAGED_DECODE_DIMS(f16, __half)
PAGED_DECODE_DIMS(bf16, __nv_bfloat16)
