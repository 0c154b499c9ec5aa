// Decode attention of class A (GQA), part of glm_forward.cu's module: the q/k norms, rope and cache
// store, the row kernel over splits and its combine. Included once, by glm_forward.cu, after the
// helpers it uses (warp_sum, warp_max, the online softmax of mma.cuh).
#pragma once

#include "split_fold.cuh"
#include "grid_dependency.cuh"

// ---- attention ----

// Per-head RMSNorm (optional), partial rotate-half RoPE on the first rotary_dim dims (GLM.md §3.4),
// then keys and values into the paged cache in its dtype (kv_store.cuh; exp_k/exp_v: fp8's
// exponents). A warp per (row, head), 8 per block.
extern "C" __global__ void tf_qk_rope_store(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                                            const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                            const float* __restrict__ cos_sin, const uint32_t* __restrict__ positions,
                                            const uint32_t* __restrict__ tables, const uint32_t* __restrict__ table_offsets,
                                            void* __restrict__ cache_k, void* __restrict__ cache_v, int8_t* __restrict__ exp_k,
                                            int8_t* __restrict__ exp_v, int kv_dtype, int rows, int heads, int kv_heads, int head_dim,
                                            int rotary_dim, float eps, int layers, int layer, int page_tokens) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (row >= rows) return;
    const float* cs = cos_sin + static_cast<size_t>(row) * rotary_dim;
    const int half = rotary_dim / 2;
    const int warps = blockDim.x / kWarp;
    for (int h = blockIdx.y * warps + warp; h < heads + kv_heads; h += gridDim.y * warps) {
        const bool is_q = h < heads;
        float* head = is_q ? q + (static_cast<size_t>(row) * heads + h) * head_dim
                           : k + (static_cast<size_t>(row) * kv_heads + (h - heads)) * head_dim;
        const float* norm = is_q ? q_norm : k_norm;
        if (norm) {
            float sum = 0.f;
            for (int i = lane; i < head_dim; i += kWarp) sum += head[i] * head[i];
            const float inverse = 1.0f / sqrtf(warp_sum(sum) / head_dim + eps);
            for (int i = lane; i < head_dim; i += kWarp) head[i] = norm[i] * (head[i] * inverse);
            __syncwarp();
        }
        for (int j = lane; j < half; j += kWarp) {
            const float a = head[j], b = head[j + half], c = cs[j], s = cs[half + j];
            head[j] = a * c - b * s;
            head[j + half] = b * c + a * s;
        }
        __syncwarp();
        if (!is_q) {
            const int kv = h - heads;
            const uint32_t position = positions[row];
            const uint32_t page = tables[table_offsets[row] + position / page_tokens];
            const size_t at = (((static_cast<size_t>(page) * layers + layer) * kv_heads + kv) * page_tokens + position % page_tokens) * head_dim;
            const float* value = v + (static_cast<size_t>(row) * kv_heads + kv) * head_dim;
            tf::kv_store_warp(cache_k, exp_k, kv_dtype, at, head, head_dim, lane);
            tf::kv_store_warp(cache_v, exp_v, kv_dtype, at, value, head_dim, lane);
        }
    }
}

// softmax(q·kᵀ/sqrt(d))·v over positions 0..pos of the row's own sequence, for every query head of
// one KV head: a warp per query head (in rounds of up to 12 warps), K and V staged through shared
// memory 32 positions at a time (cp.async, two stages) so that the query heads of a group read
// them once.
//
// A row's positions fall into kAttentionSplits splits of whole tiles, fixed by its length alone
// (split_range, split_fold.cuh). Within a split, an online softmax in position order: per tile,
// lane j scores position j over the whole head, the tile's max and sum (fixed butterflies) rescale
// the running sum and accumulator, and each lane accumulates its 4 dims over the tile's positions
// in order. The splits' (max, sum, accumulator) are then folded left to right (fold_split). Either
// one block per (row, KV head) runs every split and folds them itself (gridDim.y == 1), or a block
// per split writes its partial to `part_*` and tf_attention_combine folds them: the same operations
// in the same order, so a row's bits are the same either way, and the host may spread a decode
// step's few long rows over the whole GPU (flash-decoding) without changing a bit. head_dim <= 128,
// a multiple of 4.
constexpr int kAttentionTile = 32;
constexpr int kAttentionPitch = 128 + 4;  // float4 rows of 8 lanes land in distinct banks
constexpr int kAttentionWarps = 12;
constexpr int kAttentionSplits = 32;
// Dynamic shared memory of tf_attention: K and V tiles in two stages (cp.async brings the next 32
// positions while the block scores the current ones), then the warps' queries.
constexpr int kAttentionStage = 2 * kAttentionTile * kAttentionPitch;  // floats: K tile, V tile
constexpr int kAttentionSharedBytes = (2 * kAttentionStage + kAttentionWarps * kAttentionPitch) * 4;
static_assert(kAttentionSharedBytes == 73920, "the launch's size: attention_shared_bytes in glm_kernels.zig");

// (max, sum, acc) ⊕= a split's (m, l, a), N accumulators. Rounded operations only (no
// contraction), so that the attention kernels and the combine kernel compute the same bits.
template <int N>
__device__ __forceinline__ void fold_split(float& max, float& sum, float (&acc)[N], float m, float l, const float (&a)[N]) {
    const float next = fmaxf(max, m);
    const float x = expf(max - next);  // 0 on the first split
    const float y = expf(m - next);
    sum = __fadd_rn(__fmul_rn(sum, x), __fmul_rn(l, y));
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = __fadd_rn(__fmul_rn(acc[i], x), __fmul_rn(a[i], y));
    max = next;
}

__device__ __forceinline__ float4 fold_result(const float (&acc)[4], float sum) {
    return make_float4(__fdiv_rn(acc[0], sum), __fdiv_rn(acc[1], sum), __fdiv_rn(acc[2], sum), __fdiv_rn(acc[3], sum));
}

// Rows with skip[row] != 0 (skip may be null) are tf_attention_prompt's. Partials of split s of
// (row, query head h): part_acc[((row·heads + h)·S + s)·head_dim + d] and
// part_ml[((row·heads + h)·S + s)·2 + {0: max, 1: sum}].
// sm_12x's ptxas caps the registers for several blocks per SM and spills; its 100 KB of shared
// memory holds one block of this kernel anyway.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define TF_ATTENTION_BOUNDS __launch_bounds__(32 * kAttentionWarps, 1)
#else
#define TF_ATTENTION_BOUNDS __launch_bounds__(32 * kAttentionWarps)
#endif
extern "C" __global__ void TF_ATTENTION_BOUNDS tf_attention(const float* __restrict__ q, const float* __restrict__ cache_k,
                                                               const float* __restrict__ cache_v, const uint32_t* __restrict__ positions,
                                                               const uint32_t* __restrict__ tables, const uint32_t* __restrict__ table_offsets,
                                                               const int* __restrict__ skip, float* __restrict__ out, float* __restrict__ part_acc,
                                                               float* __restrict__ part_ml, int rows, int heads, int kv_heads, int head_dim, int layers, int layer,
                                                               int page_tokens) {
    tf_wait_prior_grid();
    extern __shared__ __align__(16) float attention_shared[];
    float(*qs)[kAttentionPitch] = reinterpret_cast<float(*)[kAttentionPitch]>(attention_shared + 2 * kAttentionStage);
    const int row = blockIdx.x / kv_heads;
    const int kv = blockIdx.x % kv_heads;
    if (row >= rows || (skip && skip[row])) return;
    const bool spread = gridDim.y > 1;
    const int length = static_cast<int>(positions[row]) + 1;
    const int split_first = spread ? blockIdx.y : 0;
    const int split_end = spread ? blockIdx.y + 1 : kAttentionSplits;
    if (split_range<kAttentionTile, kAttentionSplits>(length, split_first).begin >= length) return;  // an empty split: the combine skips it
    const int group = heads / kv_heads;
    const int warps = blockDim.x / kWarp;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const bool mine = 4 * lane < head_dim;
    const float scale = rsqrtf(static_cast<float>(head_dim));
    const uint32_t* table = tables + table_offsets[row];
    const int quads = head_dim / 4;
    for (int round = 0; round < group; round += warps) {
        const bool live = round + warp < group;
        const int h = kv * group + round + warp;
        if (live)  // the query arrives scaled by 1/sqrt(d): a register fewer in the loop below
            for (int i = lane; i < head_dim; i += kWarp) qs[warp][i] = q[(static_cast<size_t>(row) * heads + h) * head_dim + i] * scale;
        float folded_max = -INFINITY, folded_sum = 0.f;
        float folded[4] = {0.f, 0.f, 0.f, 0.f};
        for (int split = split_first; split < split_end; ++split) {
            const SplitRange range = split_range<kAttentionTile, kAttentionSplits>(length, split);
            if (range.begin >= range.end) break;  // the splits after an empty one are empty too
            float running_max = -INFINITY, running_sum = 0.f;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            // Positions t0 .. t0 + 31 into stage (t0 - range.begin) / 32 % 2, one 16-byte copy per task.
            const auto issue = [&](int t0) {
                float* stage = attention_shared + ((t0 - range.begin) / kAttentionTile % 2) * kAttentionStage;
                const int count = min(kAttentionTile, range.end - t0);
#pragma unroll 1
                for (int task = threadIdx.x; task < count * quads; task += blockDim.x) {
                    const int j = task / quads;
                    const int d = 4 * (task % quads);
                    const int t = t0 + j;
                    const size_t at = (((static_cast<size_t>(table[t / page_tokens]) * layers + layer) * kv_heads + kv) * page_tokens + t % page_tokens) * head_dim + d;
                    tf::copy16_async(stage + j * kAttentionPitch + d, cache_k + at, true);
                    tf::copy16_async(stage + (kAttentionTile + j) * kAttentionPitch + d, cache_v + at, true);
                }
                asm volatile("cp.async.commit_group;\n" ::);
            };
            __syncthreads();  // the stages are free (and qs written, the first time)
            issue(range.begin);
            for (int t0 = range.begin; t0 < range.end; t0 += kAttentionTile) {
                const int count = min(kAttentionTile, range.end - t0);
                __syncthreads();  // the stage the next copies go to is consumed
                if (t0 + kAttentionTile < range.end) issue(t0 + kAttentionTile);
                else asm volatile("cp.async.commit_group;\n" ::);
                asm volatile("cp.async.wait_group 1;\n" ::);
                __syncthreads();  // this tile's copies, every thread's, have landed
                const float(*ks)[kAttentionPitch] = reinterpret_cast<const float(*)[kAttentionPitch]>(attention_shared + ((t0 - range.begin) / kAttentionTile % 2) * kAttentionStage);
                const float(*vs)[kAttentionPitch] = ks + kAttentionTile;
                if (!live) continue;
                float score = -INFINITY;
                if (lane < count) {
                    score = 0.f;
#pragma unroll 4
                    for (int d = 0; d < head_dim; d += 4) {
                        const float4 a = *reinterpret_cast<const float4*>(&qs[warp][d]);
                        const float4 b = *reinterpret_cast<const float4*>(&ks[lane][d]);
                        score = fmaf(a.x, b.x, score); score = fmaf(a.y, b.y, score); score = fmaf(a.z, b.z, score); score = fmaf(a.w, b.w, score);
                    }
                }
                const float next_max = fmaxf(running_max, warp_max(score));
                const float p = lane < count ? expf(score - next_max) : 0.f;
                const float rescale = expf(running_max - next_max);  // 0 on the first tile
                running_sum = running_sum * rescale + warp_sum(p);
                running_max = next_max;
                for (int i = 0; i < 4; ++i) acc[i] *= rescale;
                for (int j = 0; j < count; ++j) {
                    const float pj = __shfl_sync(0xFFFFFFFFu, p, j);
                    if (!mine) continue;
                    const float4 v = *reinterpret_cast<const float4*>(&vs[j][4 * lane]);
                    acc[0] = fmaf(pj, v.x, acc[0]); acc[1] = fmaf(pj, v.y, acc[1]); acc[2] = fmaf(pj, v.z, acc[2]); acc[3] = fmaf(pj, v.w, acc[3]);
                }
            }
            asm volatile("cp.async.wait_group 0;\n" ::);
            if (!live) continue;
            if (spread) {
                const size_t at = (static_cast<size_t>(row) * heads + h) * kAttentionSplits + split;
                if (mine) *reinterpret_cast<float4*>(part_acc + at * head_dim + 4 * lane) = make_float4(acc[0], acc[1], acc[2], acc[3]);
                if (lane == 0) *reinterpret_cast<float2*>(part_ml + 2 * at) = make_float2(running_max, running_sum);
            } else {
                fold_split(folded_max, folded_sum, folded, running_max, running_sum, acc);
            }
        }
        if (!spread && live && mine)
            *reinterpret_cast<float4*>(out + (static_cast<size_t>(row) * heads + h) * head_dim + 4 * lane) = fold_result(folded, folded_sum);
        __syncthreads();  // qs is rewritten by the next round
    }
}

// The fold of tf_attention's split partials: a block per (row, query head), a thread per dim, its
// loads issued together, folded as split_fold.cuh does (fold_split's operations in its order, so the
// bits equal the block's own fold).
extern "C" __global__ void __launch_bounds__(128) tf_attention_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                                                     const uint32_t* __restrict__ positions, const int* __restrict__ skip,
                                                                     float* __restrict__ out, int rows, int heads, int head_dim) {
    tf_wait_prior_grid();
    __shared__ float factors[3][kAttentionSplits];  // per split: the old fold's factor, the split's, its sum
    const int row = blockIdx.x / heads;
    const int h = blockIdx.x % heads;
    if (row >= rows || (skip && skip[row])) return;
    const int length = static_cast<int>(positions[row]) + 1;
    const size_t first = (static_cast<size_t>(row) * heads + h) * kAttentionSplits;
    const int live = live_splits<kAttentionTile, kAttentionSplits>(length);
    const bool mine = static_cast<int>(threadIdx.x) < head_dim;
    float a[kAttentionSplits];
#pragma unroll
    for (int split = 0; split < kAttentionSplits; ++split)
        a[split] = split < live && mine ? part_acc[(first + split) * head_dim + threadIdx.x] : 0.f;
    if (threadIdx.x < kWarp) split_fold_factors(factors, part_ml, first, live, threadIdx.x);
    __syncthreads();
    if (!mine) return;
    out[(static_cast<size_t>(row) * heads + h) * head_dim + threadIdx.x] = split_fold(factors, a, live);
}
