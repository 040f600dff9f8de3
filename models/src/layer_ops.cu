// A transformer layer's small steps on NVIDIA GPUs, each one launch where
// candle's operations take two to five: the residual sum with the RMS norm
// after it, SwiGLU's silu(gate) * up, RoPE of the query rows, and the new
// keys (rotated) and values written into the paged pool in its dtype.
//
// Activations are f32. A row-major input is read through its row stride,
// so column slices of one wider output (a narrow view) need no copy.
// models/src/layer_ops.rs holds the CPU versions and the launches; built to
// PTX by models/build.rs with the `cuda` feature.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "round_run.cuh"

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
    return x;
}

// out[r] = x[r] + h[r]; out[rows + r] = out[r] / rms(out[r]) * w, with
// round set each run of 32 of the latter rounded (round_run; cols then a
// multiple of 32, so a warp's lanes hold one whole run per step).
// One block per row; blockDim.x a multiple of 32, at most 1024.
extern "C" __global__ void hearth_add_rms_norm(const float* __restrict__ x, int x_stride,
                                               const float* __restrict__ h, int h_stride,
                                               const float* __restrict__ w,
                                               float* __restrict__ out, int rows, int cols,
                                               float eps, int round) {
    __shared__ float partial[32];
    const int r = blockIdx.x;
    const float* xr = x + (size_t)r * x_stride;
    const float* hr = h + (size_t)r * h_stride;
    float* sum = out + (size_t)r * cols;
    float* norm = out + ((size_t)rows + r) * cols;
    float squares = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = xr[c] + hr[c];
        sum[c] = v;
        squares += v * v;
    }
    squares = warp_sum(squares);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = squares;
    __syncthreads();
    if (warp == 0) {
        squares = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        squares = warp_sum(squares);
        if (lane == 0) partial[0] = squares;
    }
    __syncthreads();
    const float scale = rsqrtf(partial[0] / (float)cols + eps);
    // Each thread reads back only the sums it wrote.
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = sum[c] * scale * w[c];
        norm[c] = round ? round_run(v) : v;
    }
}

// out[r, c] = silu(gate[r, c]) * up[r, c], out contiguous [rows, cols];
// with round set each run of 32 rounded (round_run; cols then a multiple
// of 32, so every warp holds one whole run). blockDim.x a multiple of 32.
extern "C" __global__ void hearth_swiglu(const float* __restrict__ gate, int gate_stride,
                                         const float* __restrict__ up, int up_stride,
                                         float* __restrict__ out, int rows, int cols,
                                         int round) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    const size_t r = i / cols, c = i % cols;
    const float g = gate[r * gate_stride + c];
    const float v = g / (1.0f + expf(-g)) * up[r * up_stride + c];
    out[i] = round ? round_run(v) : v;
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// Token t's heads * head_dim values of x (row stride x_stride), rotated by
// its cos/sin row ([tokens, head_dim / 2]) when rope is 1 (pairs 2i, 2i+1)
// or 2 (halves i, i + head_dim / 2), else copied; to row dst_row[t] of dst
// (row width dst_width), or row t when dst_row is null. One thread per
// (token, head, pair).
template <typename T>
__device__ void rotate_rows(const float* __restrict__ x, int x_stride,
                            const float* __restrict__ cos, const float* __restrict__ sin,
                            const uint32_t* __restrict__ dst_row, T* __restrict__ dst,
                            int dst_width, int tokens, int heads, int head_dim, int rope) {
    const int half_dim = head_dim / 2;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)tokens * heads * half_dim) return;
    const int t = (int)(i / ((size_t)heads * half_dim));
    const int rest = (int)(i % ((size_t)heads * half_dim));
    const int h = rest / half_dim, p = rest % half_dim;
    const float* xr = x + (size_t)t * x_stride + h * head_dim;
    const size_t row = dst_row ? dst_row[t] : (size_t)t;
    T* o = dst + row * dst_width + h * head_dim;
    const int a = rope == 1 ? 2 * p : p;
    const int b = rope == 1 ? 2 * p + 1 : p + half_dim;
    if (rope == 0) {
        store(o + a, xr[a]);
        store(o + b, xr[b]);
        return;
    }
    const float c = cos[(size_t)t * half_dim + p], s = sin[(size_t)t * half_dim + p];
    const float xa = xr[a], xb = xr[b];
    store(o + a, xa * c - xb * s);
    store(o + b, xa * s + xb * c);
}

#define ROTATE_ROWS(suffix, T)                                                               \
    extern "C" __global__ void hearth_rotate_rows_##suffix(                                  \
        const float* x, int x_stride, const float* cos, const float* sin,                    \
        const uint32_t* dst_row, T* dst, int dst_width, int tokens, int heads, int head_dim, \
        int rope) {                                                                          \
        rotate_rows<T>(x, x_stride, cos, sin, dst_row, dst, dst_width, tokens, heads,        \
                       head_dim, rope);                                                      \
    }

ROTATE_ROWS(f32, float)
ROTATE_ROWS(f16, __half)
ROTATE_ROWS(bf16, __nv_bfloat16)

// Each run of 32 values of a row rounded to 8 bits as Q8_1 quantizes them
// (d = max|x| / 127, x = d * round(x / d)), so that a quantized matmul that
// quantizes them again finds the same values and sums its activations'
// quantized values for a block minimum's term instead of the raw ones.
// rows: [rows, cols] f32 contiguous, cols a multiple of 32; one warp per run.
extern "C" __global__ void hearth_round_q8(const float* __restrict__ x, float* __restrict__ out,
                                           int runs) {
    const int run = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (run >= runs) return;
    const int lane = threadIdx.x & 31;
    out[(size_t)run * 32 + lane] = round_run(x[(size_t)run * 32 + lane]);
}
