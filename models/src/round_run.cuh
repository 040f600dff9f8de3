// v rounded as Q8_1 rounds the run of 32 values the calling warp holds
// (one per lane, all lanes active): d = max|x| / 127, x = d * round(x / d).
// Shared by layer_ops.cu and paged/paged_decode.cu: the activations a
// quantized matmul is fed, rounded where they are produced (layer_ops.rs,
// `round_q8`).
#pragma once

__device__ __forceinline__ float round_run(float v) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
    const float d = amax / 127.0f;
    return amax == 0.0f ? 0.0f : d * roundf(v / d);
}
