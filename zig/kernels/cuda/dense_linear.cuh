// The unquantized projections (GLM-5.3-Flash's KDA gates, the DSA indexer's keys and weights, an
// unquantized lm_head, the hyper-connections' mixing dots), part of glm_forward.cu's module. Included once, by glm_forward.cu, after
// the helpers it uses.
//
// Checkpoints store these weights as f16; the GPU keeps them so (linear_cuda.zig checks each value
// survives the trip) and runs them on the tensor cores, the f32 inputs split into f16 high and low
// parts (mma.cuh) as the EXL3 kernels do. f32 weights (hyper-connections' mixing matrices, a
// checkpoint's values f16 cannot hold) split the same way. A warp puts 16 outputs of the weight as mma's m and 8
// input rows as its n; since a dot product may take its k in any order as long as both operands
// agree, lane (g, t) reads the four adjacent channels 4t..4t+3 of each operand and lets them stand
// for mma's k = 2t, 2t+1, 2t+8, 2t+9, so every load is contiguous and no shared memory is needed.
//
// A row's sum does not depend on its batch: the k steps are dealt to the 8 warps of a block and to
// `splits` blocks by the shape alone (glm_kernels.zig, denseSplits), each warp walks its steps in
// order, the warps' sums are added in warp order and the splits' in split order.
#pragma once
#include "mma.cuh"
#include "grid_dependency.cuh"

constexpr int kDenseWarps = 8;
constexpr int kDenseOutTiles = 2;  // m16 tiles of outputs per block: 32 outputs
constexpr int kDenseRowGroups = 4;  // n8 groups of input rows per block: 32 rows

// Lane (g, t)'s A fragment for outputs `out`.. +16 at k step `k`: rows g and g + 8, channels
// 4t..4t+3 (zeros past the last output). An f32 weight's come as high and low f16 parts.
__device__ __forceinline__ void dense_weight_fragment(uint32_t (&a)[4], uint32_t (&)[4], const uint16_t* __restrict__ weight, int out,
                                                      int outs, int in_features, int k, int g, int t) {
    uint2 top = make_uint2(0, 0);
    uint2 bottom = make_uint2(0, 0);
    if (out + g < outs) top = __ldg(reinterpret_cast<const uint2*>(weight + static_cast<size_t>(out + g) * in_features + k + 4 * t));
    if (out + g + 8 < outs) bottom = __ldg(reinterpret_cast<const uint2*>(weight + static_cast<size_t>(out + g + 8) * in_features + k + 4 * t));
    a[0] = top.x;
    a[1] = bottom.x;
    a[2] = top.y;
    a[3] = bottom.y;
}

__device__ __forceinline__ void dense_weight_fragment(uint32_t (&hi)[4], uint32_t (&lo)[4], const float* __restrict__ weight, int out, int outs,
                                                      int in_features, int k, int g, int t) {
    float4 top = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 bottom = make_float4(0.f, 0.f, 0.f, 0.f);
    if (out + g < outs) top = __ldg(reinterpret_cast<const float4*>(weight + static_cast<size_t>(out + g) * in_features + k + 4 * t));
    if (out + g + 8 < outs) bottom = __ldg(reinterpret_cast<const float4*>(weight + static_cast<size_t>(out + g + 8) * in_features + k + 4 * t));
    tf::split_pair(top.x, top.y, hi[0], lo[0]);
    tf::split_pair(bottom.x, bottom.y, hi[1], lo[1]);
    tf::split_pair(top.z, top.w, hi[2], lo[2]);
    tf::split_pair(bottom.z, bottom.w, hi[3], lo[3]);
}

// y = x · Wᵀ (+ b) for an (out, in) weight of f16 (uint16_t bits) or f32, in % 16 == 0; x's rows
// `x_stride` floats apart (a multiple of 4), y's `y_stride`. With `squares`, output tile 0 also writes Σ x² of each row at column
// out_features (the hyper-connections' RMS norm, from the same loads). Grid: (output tiles of 32,
// splits, row tiles of 32); 256 threads. With splits > 1 each block leaves its sums in `partial`
// for tf_dense_splits (the last block of a tile adding them behind a __threadfence and a counter
// made GLM-5.3-Flash's decode step 4% slower on the H200 than this second launch). An f32 weight
// takes a third product, its low part by x's high part (low by low is below f32's rounding, as in
// mma.cuh's mma_split).
template <typename Weight>
__device__ __forceinline__ void dense_mma(const float* __restrict__ x, const Weight* __restrict__ weight, const float* __restrict__ bias,
                                          float* __restrict__ y, float* __restrict__ partial, int rows, int in_features, int out_features,
                                          int x_stride, int y_stride, int splits, bool squares) {
    constexpr bool kSplitWeight = sizeof(Weight) == 4;
    constexpr int kRows = 8 * kDenseRowGroups;
    __shared__ float sums[kDenseWarps][kDenseOutTiles * kDenseRowGroups * 4][kWarp];
    __shared__ float square_sums[kDenseWarps][kRows];
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int g = lane / 4;
    const int t = lane % 4;
    const int out0 = blockIdx.x * 16 * kDenseOutTiles;
    const int row0 = blockIdx.z * kRows;
    const int steps = in_features / 16;
    const int first = static_cast<int>(static_cast<long long>(steps) * blockIdx.y / splits);
    const int last = static_cast<int>(static_cast<long long>(steps) * (blockIdx.y + 1) / splits);
    int groups = (rows - row0 + 7) / 8;
    groups = groups < kDenseRowGroups ? groups : kDenseRowGroups;
    const int pitch = out_features + (squares ? 1 : 0);  // a partial row: the outputs, Σ x²
    squares = squares && blockIdx.x == 0;

    float acc[kDenseOutTiles][kDenseRowGroups][4];
    float square[kDenseRowGroups];
#pragma unroll
    for (int j = 0; j < kDenseRowGroups; ++j) {
        square[j] = 0.f;
#pragma unroll
        for (int i = 0; i < kDenseOutTiles; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
    }

    for (int step = first + warp; step < last; step += kDenseWarps) {
        const int k = 16 * step;
        uint32_t a[kDenseOutTiles][4], a_lo[kDenseOutTiles][4];
#pragma unroll
        for (int i = 0; i < kDenseOutTiles; ++i) dense_weight_fragment(a[i], a_lo[i], weight, out0 + 16 * i, out_features, in_features, k, g, t);
#pragma unroll
        for (int j = 0; j < kDenseRowGroups; ++j) {
            if (j >= groups) break;
            const int row = row0 + 8 * j + g;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row < rows) v = __ldg(reinterpret_cast<const float4*>(x + static_cast<size_t>(row) * x_stride + k + 4 * t));
            if (squares) square[j] = fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, square[j]))));
            uint32_t hi[2], lo[2];
            tf::split_pair(v.x, v.y, hi[0], lo[0]);
            tf::split_pair(v.z, v.w, hi[1], lo[1]);
#pragma unroll
            for (int i = 0; i < kDenseOutTiles; ++i) {
                tf::mma_16816(acc[i][j], a[i], hi);
                tf::mma_16816(acc[i][j], a[i], lo);
                if constexpr (kSplitWeight) tf::mma_16816(acc[i][j], a_lo[i], hi);
            }
        }
    }

#pragma unroll
    for (int j = 0; j < kDenseRowGroups; ++j) {
        square[j] += __shfl_xor_sync(0xFFFFFFFFu, square[j], 1);
        square[j] += __shfl_xor_sync(0xFFFFFFFFu, square[j], 2);
        if (t == 0) square_sums[warp][8 * j + g] = square[j];
#pragma unroll
        for (int i = 0; i < kDenseOutTiles; ++i)
#pragma unroll
            for (int c = 0; c < 4; ++c) sums[warp][(i * kDenseRowGroups + j) * 4 + c][lane] = acc[i][j][c];
    }
    __syncthreads();

    // Thread → (fragment entry, lane) of the block's 32 x 32 outputs, C's (row, col) being (output
    // g or g + 8, input row 2t or 2t + 1); then, with squares, 32 more entries: the rows' Σ x².
    constexpr int kEntries = kDenseOutTiles * kDenseRowGroups * 4 * kWarp;
    const int entries = kEntries + (squares ? kRows : 0);
    const auto place = [&](int e, int& out, int& row) {
        if (e >= kEntries) {
            out = out_features;
            row = row0 + e - kEntries;
            return;
        }
        const int entry = e / kWarp;
        const int l = e % kWarp;
        const int c = entry % 4;
        out = out0 + 16 * (entry / (kDenseRowGroups * 4)) + l / 4 + (c >= 2 ? 8 : 0);
        row = row0 + 8 * ((entry / 4) % kDenseRowGroups) + 2 * (l % 4) + (c & 1);
    };
    for (int e = threadIdx.x; e < entries; e += blockDim.x) {
        int out, row;
        place(e, out, row);
        if ((out >= out_features && e < kEntries) || row >= rows) continue;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kDenseWarps; ++w) sum += e < kEntries ? sums[w][e / kWarp][e % kWarp] : square_sums[w][e - kEntries];
        const float b = bias && e < kEntries ? bias[out] : 0.f;
        if (splits == 1) {
            y[static_cast<size_t>(row) * y_stride + out] = sum + b;
        } else {
            partial[(static_cast<size_t>(row) * pitch + out) * splits + blockIdx.y] = sum;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 2) tf_dense_half(const float* __restrict__ x, const uint16_t* __restrict__ weight,
                                                                const float* __restrict__ bias, float* __restrict__ y, float* __restrict__ partial,
                                                                int rows, int in_features, int out_features, int x_stride, int y_stride, int splits,
                                                                int squares) {
    tf_wait_prior_grid();
    dense_mma(x, weight, bias, y, partial, rows, in_features, out_features, x_stride, y_stride, splits, squares != 0);
}

extern "C" __global__ void __launch_bounds__(256, 2) tf_dense_f32(const float* __restrict__ x, const float* __restrict__ weight,
                                                               const float* __restrict__ bias, float* __restrict__ y, float* __restrict__ partial,
                                                               int rows, int in_features, int out_features, int x_stride, int y_stride, int splits,
                                                               int squares) {
    tf_wait_prior_grid();
    dense_mma(x, weight, bias, y, partial, rows, in_features, out_features, x_stride, y_stride, splits, squares != 0);
}

// The splits' sums (tf_dense_half / tf_dense_f32's partial: per row, `pitch` values (the outputs,
// then Σ x² when asked) of `splits` sums each) added, a warp per value: lane l takes splits l,
// l + 32, .. in order, then the fixed butterfly; the order depends on `splits` alone. (A thread
// per value walking 64 splits one load at a time took ~5 us for the 25 values of a decode row.)
extern "C" __global__ void __launch_bounds__(256) tf_dense_splits(const float* __restrict__ partial, const float* __restrict__ bias,
                                                                  float* __restrict__ y, int rows, int pitch, int out_features, int y_stride,
                                                                  int splits) {
    tf_wait_prior_grid();
    const size_t value = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (value >= static_cast<size_t>(rows) * pitch) return;
    const float* sums = partial + value * splits;
    float sum = 0.f;
    for (int s = lane; s < splits; s += kWarp) sum += sums[s];
    sum = warp_sum(sum);
    const size_t row = value / pitch, out = value % pitch;
    if (lane == 0) y[row * y_stride + out] = sum + (bias && out < static_cast<size_t>(out_features) ? bias[out] : 0.f);
}
