// The GLM class-A forward on the GPU, f32 throughout like the CPU reference
// (zig/src/families/glm/forward_cpu.zig). The host half is zig/src/cuda/glm_kernels.zig.
//
// Every output element is computed by one thread (or one warp with a fixed reduction tree) from its
// own row's inputs, summing in a fixed order: a row's bits do not depend on the other rows of its
// batch, and the tile and block sizes depend on the shape only, never on the number of rows.
#include <cuda_fp16.h>
#include "grid_dependency.cuh"
#include "last_block.cuh"
#include <stdint.h>

#include "attention_prompt.cuh"
#include "exl3_codebook.cuh"
#include "exl3_gemv.cuh"
#include "exl3_hadamard.cuh"
#include "exl3_trellis.cuh"
#include "swiglu.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kHadamard = 128;
using tf::hadamard128;

__device__ __forceinline__ float warp_sum(float v) {
    // A fixed butterfly: the same order every call.
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}

__device__ __forceinline__ float half_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

}  // namespace

// ---- element-wise and row-wise ----

// One block per (row, 256 columns): a decode step's single row is still spread over many blocks.
// The table stays in the checkpoint's dtype (glm_kernels.zig EmbedDtype); f16 and bf16 widen to
// f32 exactly, so the rows are the host's Embedding.row bit for bit.
constexpr int kEmbedF16 = 1;
constexpr int kEmbedBf16 = 2;
extern "C" __global__ void tf_embed(const uint32_t* __restrict__ tokens, const void* __restrict__ table, int dtype,
                                    float* __restrict__ out, int rows, int hidden) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (row >= rows || i >= hidden) return;
    const size_t at = static_cast<size_t>(tokens[row]) * hidden + i;
    float value;
    if (dtype == kEmbedF16) value = __half2float(static_cast<const half*>(table)[at]);
    else if (dtype == kEmbedBf16) value = __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(table)[at]) << 16);
    else value = static_cast<const float*>(table)[at];
    out[static_cast<size_t>(row) * hidden + i] = value;
}

// w ⊙ x / sqrt(mean(x²) + eps), one block of 256 threads per row; out may alias x (each thread
// writes only what it read). With `delta`, first x += delta (the residual add, written back; out
// must not alias x then): one launch instead of an add and a norm. Rows of up to 8192 values, a multiple of 4, are read once as float4
// into registers, all loads issued before any is used: at one row per step the kernel is a single
// block, and a loop of dependent loads made it ~14 us on the H200.
constexpr int kNormCache = 8;

extern "C" __global__ void __launch_bounds__(256) tf_rmsnorm(float* x, const float* __restrict__ delta, const float* __restrict__ weight,
                                                             float* out, int rows, int width, float eps) {
    tf_wait_prior_grid();
    __shared__ float partial[8];
    const int row = blockIdx.x;
    if (row >= rows) return;
    float* in = x + static_cast<size_t>(row) * width;
    const float* add = delta ? delta + static_cast<size_t>(row) * width : nullptr;
    float* target = out + static_cast<size_t>(row) * width;
    const bool cached = width % 4 == 0 && width <= 4 * 256 * kNormCache;
    const int n4 = width / 4;
    float4 v[kNormCache];
    float sum = 0.f;
    if (cached) {
        float4* in4 = reinterpret_cast<float4*>(in);
#pragma unroll
        for (int j = 0; j < kNormCache; ++j) {
            const int i = threadIdx.x + j * 256;
            v[j] = i < n4 ? in4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        if (add) {
            const float4* add4 = reinterpret_cast<const float4*>(add);
#pragma unroll
            for (int j = 0; j < kNormCache; ++j) {
                const int i = threadIdx.x + j * 256;
                if (i >= n4) continue;
                const float4 d = add4[i];
                v[j] = make_float4(v[j].x + d.x, v[j].y + d.y, v[j].z + d.z, v[j].w + d.w);
                in4[i] = v[j];
            }
        }
#pragma unroll
        for (int j = 0; j < kNormCache; ++j) sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    } else {
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            if (add) in[i] += add[i];
            sum += in[i] * in[i];
        }
    }
    sum = warp_sum(sum);
    if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = sum;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < 8; ++w) total += partial[w];
    const float inverse = 1.0f / sqrtf(total / width + eps);
    if (cached) {
        const float4* weight4 = reinterpret_cast<const float4*>(weight);
        float4* target4 = reinterpret_cast<float4*>(target);
#pragma unroll
        for (int j = 0; j < kNormCache; ++j) {
            const int i = threadIdx.x + j * 256;
            if (i >= n4) continue;
            const float4 w = weight4[i];
            target4[i] = make_float4(w.x * (v[j].x * inverse), w.y * (v[j].y * inverse), w.z * (v[j].z * inverse), w.w * (v[j].w * inverse));
        }
    } else {
        __syncthreads();
        for (int i = threadIdx.x; i < width; i += blockDim.x) target[i] = weight[i] * (in[i] * inverse);
    }
}

// out[i] = x[rows[i]]: the rows whose logits are wanted, before a dense lm_head.
extern "C" __global__ void tf_gather_rows(const float* __restrict__ x, const uint32_t* __restrict__ rows_wanted,
                                          float* __restrict__ out, int count, int width) {
    tf_wait_prior_grid();
    const int i = blockIdx.x;
    if (i >= count) return;
    for (int d = threadIdx.x; d < width; d += blockDim.x)
        out[static_cast<size_t>(i) * width + d] = x[static_cast<size_t>(rows_wanted[i]) * width + d];
}

extern "C" __global__ void tf_add(float* __restrict__ target, const float* __restrict__ source, int count) {
    tf_wait_prior_grid();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) target[i] += source[i];
}

extern "C" __global__ void tf_swiglu(float* __restrict__ gate, const float* __restrict__ up, int count) {
    tf_wait_prior_grid();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        gate[i] = tf::swiglu(gate[i], up[i]);
    }
}

#include "exl3_linear.cuh"
#include "group_items.cuh"

// y = x · Wᵀ + b for an unquantized (out, in) f32 weight: one warp per (row, output), lanes stride
// the input and reduce with the fixed butterfly.
extern "C" __global__ void tf_dense_matmul(const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
                                           float* __restrict__ y, int rows, int in_features, int out_features) {
    tf_wait_prior_grid();
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int row = warp / out_features;
    const int out = warp % out_features;
    if (row >= rows) return;
    const float* a = x + static_cast<size_t>(row) * in_features;
    const float* w = weight + static_cast<size_t>(out) * in_features;
    float sum = 0.f;
    for (int i = lane; i < in_features; i += kWarp) sum = fmaf(a[i], w[i], sum);
    sum = warp_sum(sum);
    if (lane == 0) y[static_cast<size_t>(row) * out_features + out] = sum + (bias ? bias[out] : 0.f);
}

#include "attention_decode.cuh"
#include "attention_heads.cuh"
#include "moe_route.cuh"
#include "route_logits.cuh"

#include "dense_linear.cuh"
#include "logits_summary.cuh"
