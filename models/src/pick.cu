// Picks each row's next token where the logits are (a GPU), so only the
// ids are copied back: the argmax when the row's inverse temperature is 0,
// else a draw from softmax(logits * inv_temp) by the Gumbel-max trick
// (the argmax of logits * inv_temp + Gumbel noise is distributed exactly
// so), the noise a hash of the row's seed and the token id. NaN logits
// never win; ties go to the lower id. models/src/pick.rs holds the CPU
// version (the same hash, so the same ids) and the launch.

#include <stdint.h>

__device__ __forceinline__ uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// -log(-log(u)), u uniform in (0, 1) from the top 24 bits of the hash.
__device__ __forceinline__ float gumbel(uint64_t seed, uint32_t id) {
    const uint64_t h = mix(seed ^ ((uint64_t)id * 0xD1B54A32D192ED03ull));
    const float u = ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
    return -logf(-logf(u));
}

// logits: [rows, vocab] f32; params: per row (seed low, seed high, inverse
// temperature's bits); out: [rows] u32. One block of 256 threads per row.
extern "C" __global__ void hearth_pick(const float* __restrict__ logits,
                                       const uint32_t* __restrict__ params,
                                       uint32_t* __restrict__ out, int vocab) {
    __shared__ float best_v[256];
    __shared__ uint32_t best_i[256];
    const int r = blockIdx.x;
    const float* row = logits + (size_t)r * vocab;
    const uint64_t seed = (uint64_t)params[3 * r] | ((uint64_t)params[3 * r + 1] << 32);
    const float inv_temp = __uint_as_float(params[3 * r + 2]);
    float bv = -INFINITY;
    uint32_t bi = 0xFFFFFFFFu;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = row[i];
        if (isnan(v)) continue;
        if (inv_temp != 0.0f) v = v * inv_temp + gumbel(seed, (uint32_t)i);
        if (v > bv || (v == bv && (uint32_t)i < bi)) {
            bv = v;
            bi = (uint32_t)i;
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = best_v[threadIdx.x + s];
            const uint32_t oi = best_i[threadIdx.x + s];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    // Every logit NaN (or -inf): token 0, as the CPU's argmax gives.
    if (threadIdx.x == 0) out[r] = best_i[0] == 0xFFFFFFFFu ? 0u : best_i[0];
}
