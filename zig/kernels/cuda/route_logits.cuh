// The router's logits of a prompt chunk, apart from tf_route (moe_route.cuh), which then picks each
// row's experts without its gate. Part of glm_forward.cu's module, included after the helpers it uses.
//
// Each (row, expert) is tf_route's own chain: lane l sums the products of float4s l, l + 32, ...
// in ascending order (x, y, z, w), the warp's butterfly sums the lanes, and store_route_scores
// (moe_route.cuh) writes the scores. So either form here gives tf_route's bits.
#pragma once
#include "grid_dependency.cuh"
#include "mma.cuh"

// A warp per expert over kRouteLogitsRows rows: each block reads its experts' weights once for
// those rows where tf_route reads them once a row (a 256-row chunk of GLM-4.5-Air: 4096 blocks of
// 128 KB of weights from L2, 75 us a layer on an H100). The form for hidden sizes that are not a
// multiple of 128.
constexpr int kRouteLogitsRows = 8;

extern "C" __global__ void __launch_bounds__(256) tf_route_logits(const float* __restrict__ x, const float* __restrict__ gate,
                                                                  const float* __restrict__ correction, float* __restrict__ scratch,
                                                                  int rows, int hidden, int experts) {
    tf_wait_prior_grid();
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int e = blockIdx.x * (blockDim.x / kWarp) + warp;
    const int first = blockIdx.y * kRouteLogitsRows;
    if (e >= experts || first >= rows) return;
    const int count = min(kRouteLogitsRows, rows - first);
    const float* w = gate + static_cast<size_t>(e) * hidden;
    const float* in = x + static_cast<size_t>(first) * hidden;
    float dot[kRouteLogitsRows];
#pragma unroll
    for (int r = 0; r < kRouteLogitsRows; ++r) dot[r] = 0.f;
    if (hidden % 4 == 0) {
        const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll 2
        for (int i = lane; i < hidden / 4; i += kWarp) {
            const float4 b = w4[i];
#pragma unroll
            for (int r = 0; r < kRouteLogitsRows; ++r) {
                if (r >= count) break;
                const float4 a = reinterpret_cast<const float4*>(in + static_cast<size_t>(r) * hidden)[i];
                dot[r] = fmaf(a.x, b.x, dot[r]); dot[r] = fmaf(a.y, b.y, dot[r]); dot[r] = fmaf(a.z, b.z, dot[r]); dot[r] = fmaf(a.w, b.w, dot[r]);
            }
        }
    } else {
        for (int i = lane; i < hidden; i += kWarp) {
            const float b = w[i];
#pragma unroll
            for (int r = 0; r < kRouteLogitsRows; ++r) {
                if (r >= count) break;
                dot[r] = fmaf(in[static_cast<size_t>(r) * hidden + i], b, dot[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRouteLogitsRows; ++r) {
        if (r >= count) break;
        const float sum = warp_sum(dot[r]);
        if (lane == 0) store_route_scores(scratch + static_cast<size_t>(first + r) * 2 * experts, experts, e, sum, correction);
    }
}

// The same chains by tiles, for hidden sizes that are a multiple of 128: a block takes 16 rows and
// 16 experts, and a warp 4 rows by 8 experts, so a lane's 12 float4 loads a step serve 32 chains
// where tf_route_logits' 9 served 8. The rows and the experts' weights come through shared memory
// (three stages of one step, 128 floats of each of the 32, by cp.async). A 256-row chunk of
// GLM-4.5-Air is 128 blocks here; tf_route_logits' 4096 warps each read 8 rows from L1 or L2.
constexpr int kRouteTileRows = 16;
constexpr int kRouteTileExperts = 16;
constexpr int kRouteTileStages = 3;

extern "C" __global__ void __launch_bounds__(256) tf_route_logits_tiles(const float* __restrict__ x, const float* __restrict__ gate,
                                                                        const float* __restrict__ correction, float* __restrict__ scratch,
                                                                        int rows, int hidden, int experts) {
    tf_wait_prior_grid();
    constexpr int kTileRows = kRouteTileRows + kRouteTileExperts;  // the stage's rows: inputs, then weights
    __shared__ __align__(16) float4 stage[kRouteTileStages][kTileRows][kWarp];
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int first_row = blockIdx.y * kRouteTileRows;
    const int first_expert = blockIdx.x * kRouteTileExperts;
    const int steps = hidden / (4 * kWarp);

    // Thread t moves 16-byte chunks t, t + 256, t + 512, t + 768 of a step: (tile row, lane's
    // float4). Rows and experts past the ends read zeros and are not written.
    const auto issue = [&](int step) {
        if (step < steps) {
#pragma unroll
            for (int u = 0; u < kTileRows * kWarp / 256; ++u) {
                const int chunk = threadIdx.x + 256 * u;
                const int tile_row = chunk / kWarp;
                const int column = chunk % kWarp;
                const bool input = tile_row < kRouteTileRows;
                const int index = input ? first_row + tile_row : first_expert + tile_row - kRouteTileRows;
                const bool valid = index < (input ? rows : experts);
                const float* source = (input ? x : gate) + static_cast<size_t>(valid ? index : 0) * hidden;
                tf::copy16_async(&stage[step % kRouteTileStages][tile_row][column], source + 4 * (step * kWarp + column), valid);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    constexpr int kWarpRows = 4;
    constexpr int kWarpExperts = 8;
    const int row_base = (warp % (kRouteTileRows / kWarpRows)) * kWarpRows;
    const int expert_base = kRouteTileRows + (warp / (kRouteTileRows / kWarpRows)) * kWarpExperts;
    float dot[kWarpRows][kWarpExperts];
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
        for (int e = 0; e < kWarpExperts; ++e) dot[r][e] = 0.f;

    issue(0);
    issue(1);
    for (int step = 0; step < steps; ++step) {
        asm volatile("cp.async.wait_group 1;\n" ::);
        __syncthreads();  // the step's stage has landed, and every warp is done with step - 1's
        issue(step + 2);  // into step - 1's stage
        const float4 (&s)[kTileRows][kWarp] = stage[step % kRouteTileStages];
        float4 a[kWarpRows], b[kWarpExperts];
#pragma unroll
        for (int r = 0; r < kWarpRows; ++r) a[r] = s[row_base + r][lane];
#pragma unroll
        for (int e = 0; e < kWarpExperts; ++e) b[e] = s[expert_base + e][lane];
#pragma unroll
        for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
            for (int e = 0; e < kWarpExperts; ++e) {
                float d = dot[r][e];
                d = fmaf(a[r].x, b[e].x, d); d = fmaf(a[r].y, b[e].y, d); d = fmaf(a[r].z, b[e].z, d); d = fmaf(a[r].w, b[e].w, d);
                dot[r][e] = d;
            }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

    // Every lane holds each butterfly's sum; lane 8r + e keeps chain (r, e) and writes it.
    float mine = 0.f;
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
        for (int e = 0; e < kWarpExperts; ++e) {
            const float sum = warp_sum(dot[r][e]);
            if (lane == r * kWarpExperts + e) mine = sum;
        }
    const int row = first_row + row_base + lane / kWarpExperts;
    const int e = first_expert + expert_base - kRouteTileRows + lane % kWarpExperts;
    if (row < rows && e < experts) store_route_scores(scratch + static_cast<size_t>(row) * 2 * experts, experts, e, mine, correction);
}
