// tf_exl3_group_items: a call's items sorted by layer (ties by item index: a stable counting
// sort) and cut into groups of at most `group_size` items of one layer (16 for the GEMV's groups,
// 64 or 32 for the prompt kernels), in layer order. Items of layer -1 belong to the other path and
// are left out. `layers` <= kGroupLayersMax; ranks: items ints of scratch.
//
// One block of eight warps. Warp w ranks a contiguous run of the items, its 32-item chunks in
// order, the ranks within a chunk from __match_any_sync (so nothing depends on timing), and counts
// its run's items per layer. An item's place in its layer is then the count of that layer's items
// in the earlier runs plus its rank in its own run: the order one warp's pass over all the items
// gives, which is how this kernel ran before (37 us for a 256-row chunk's 2304 expert items of
// GLM-4.5-Air on an H100, the chain of one warp's shared counts; docs/measurements.md). The
// layers' starts and groups come from block scans, a thread per four layers.
#pragma once

#include "block_scan.cuh"
#include "grid_dependency.cuh"

namespace tf {

constexpr int kGroupWarps = 8;
constexpr int kGroupThreads = kGroupWarps * 32;
constexpr int kGroupLayersMax = 1024;  // glm_kernels.group_layers_max
constexpr int kGroupLayersPerThread = kGroupLayersMax / kGroupThreads;

}  // namespace tf

extern "C" __global__ void __launch_bounds__(tf::kGroupThreads) tf_exl3_group_items(const int* __restrict__ layer_of_item, int items, int group_items,
                                                                                    int layers, int group_size, int* __restrict__ ranks,
                                                                                    int* __restrict__ sorted_items, int* __restrict__ group_first,
                                                                                    int* __restrict__ group_count, int* __restrict__ group_layer,
                                                                                    int* __restrict__ group_total) {
    using namespace tf;
    tf_wait_prior_grid();
    // A run's count per layer; after the scans, the run's first place within the layer.
    __shared__ int counts[kGroupWarps][kGroupLayersMax];
    __shared__ int starts[kGroupLayersMax];
    __shared__ int warp_sums[kGroupWarps];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    for (int l = threadIdx.x; l < layers; l += kGroupThreads)
#pragma unroll
        for (int w = 0; w < kGroupWarps; ++w) counts[w][l] = 0;
    __syncthreads();

    const int chunks = (items + 31) / 32;
    const int run_chunks = (chunks + kGroupWarps - 1) / kGroupWarps;
    const int begin = warp * run_chunks * 32;
    const int end = min(items, begin + run_chunks * 32);
    int* run_counts = counts[warp];
    const unsigned int below = (1u << lane) - 1u;
    const auto layer_at = [&](int i) { return i < end ? (layer_of_item ? layer_of_item[i] : i / group_items) : -1; };
    // The layers of kBatch chunks loaded at a time: one load a chunk, each waiting on the last
    // chunk's counts, would be a chain of L2 round trips.
    constexpr int kBatch = 8;
    for (int base = begin; base < end; base += kBatch * 32) {
        int layer[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) layer[u] = layer_at(base + u * 32 + lane);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            const int i = base + u * 32 + lane;
            const bool valid = layer[u] >= 0;  // -1: the other path's item (or past the run)
            const unsigned int same = __match_any_sync(0xFFFFFFFFu, layer[u]);
            const int before = valid ? run_counts[layer[u]] : 0;
            __syncwarp();
            if (valid) {
                ranks[i] = before + __popc(same & below);
                if (lane == 31 - __clz(same)) run_counts[layer[u]] = before + __popc(same);
            }
            __syncwarp();
        }
    }
    __syncthreads();

    // Per layer: each run's first place within the layer, and the layer's items and groups; then
    // the layers' first places and first groups by a scan in layer order.
    int layer_items[kGroupLayersPerThread];
    int items_here = 0, groups_here = 0;
#pragma unroll
    for (int j = 0; j < kGroupLayersPerThread; ++j) {
        const int l = threadIdx.x * kGroupLayersPerThread + j;
        int sum = 0;
        if (l < layers)
#pragma unroll
            for (int w = 0; w < kGroupWarps; ++w) {
                const int c = counts[w][l];
                counts[w][l] = sum;
                sum += c;
            }
        layer_items[j] = sum;
        items_here += sum;
        groups_here += (sum + group_size - 1) / group_size;
    }
    int items_total, groups_total;
    items_here = block_scan(items_here, warp_sums, &items_total);
    groups_here = block_scan(groups_here, warp_sums, &groups_total);
#pragma unroll
    for (int j = 0; j < kGroupLayersPerThread; ++j) {
        const int l = threadIdx.x * kGroupLayersPerThread + j;
        if (l >= layers) break;
        starts[l] = items_here;
        for (int offset = 0; offset < layer_items[j]; offset += group_size) {
            group_first[groups_here] = items_here + offset;
            group_count[groups_here] = min(group_size, layer_items[j] - offset);
            group_layer[groups_here] = l;
            ++groups_here;
        }
        items_here += layer_items[j];
    }
    if (threadIdx.x == 0) *group_total = groups_total;
    __syncthreads();

    for (int base = begin; base < end; base += kBatch * 32) {
        int layer[kBatch], rank[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            const int i = base + u * 32 + lane;
            layer[u] = layer_at(i);
            rank[u] = layer[u] >= 0 ? ranks[i] : 0;
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
            if (layer[u] >= 0) sorted_items[starts[layer[u]] + run_counts[layer[u]] + rank[u]] = base + u * 32 + lane;
    }
}
