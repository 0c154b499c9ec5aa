// The decode attentions' splits (attention_decode.cuh, attention_heads.cuh, mla_attention.cuh): where
// a row's positions fall, fixed by their count alone, and the combines' fold of the splits'
// partials: warp 0 turns a row's splits' (max, sum) into each split's two fold factors at once,
// then every thread folds its dim's partials left to right with them. The running max before split
// s is the max over splits < s (a scan, 32 splits per lane chunk), so the factors and the fold are
// fold_split's operations in its order: the bits equal an attention block's own fold of the same
// splits.
#pragma once

#include <math.h>

struct SplitRange {
    int begin;
    int end;
};

// Split `split` of `count` positions: whole tiles of kTile, the same number per split.
template <int kTile, int kSplits>
__device__ __forceinline__ SplitRange split_range(int count, int split) {
    const int tiles = (count + kTile - 1) / kTile;
    const int per = (tiles + kSplits - 1) / kSplits;
    return {min(split * per * kTile, count), min((split + 1) * per * kTile, count)};
}

// The splits with positions: they start before the end, and every one after the first empty is empty.
template <int kTile, int kSplits>
__device__ __forceinline__ int live_splits(int count) {
    const int tiles = (count + kTile - 1) / kTile;
    const int span = (tiles + kSplits - 1) / kSplits * kTile;
    return (count + span - 1) / span;
}

// factors[0][s], [1][s]: the fold's factor of the splits before s and of split s; [2][s] its sum.
// Splits 0 .. live - 1 of part_ml[(first + s)·2 + {max, sum}]; called by the 32 lanes of one warp.
template <int kSplits>
__device__ __forceinline__ void split_fold_factors(float (&factors)[3][kSplits], const float* __restrict__ part_ml, size_t first, int live, int lane) {
    constexpr int kChunks = kSplits / 32;
    static_assert(kSplits % 32 == 0, "whole chunks of 32 splits");
    float2 ml[kChunks];
    float running[kChunks];  // inclusive max scans: the fold's `next` at split lane + 32i
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
        const int split = lane + 32 * i;
        ml[i] = split < live ? reinterpret_cast<const float2*>(part_ml)[first + split] : make_float2(-INFINITY, 0.f);
        running[i] = ml[i].x;
#pragma unroll
        for (int offset = 1; offset < 32; offset *= 2) {
            const float other = __shfl_up_sync(0xFFFFFFFFu, running[i], offset);
            if (lane >= offset) running[i] = fmaxf(running[i], other);
        }
    }
    float carry[kChunks];  // the max over the chunks before
#pragma unroll
    for (int i = 1; i < kChunks; ++i) {
        carry[i] = __shfl_sync(0xFFFFFFFFu, running[i - 1], 31);
        running[i] = fmaxf(running[i], carry[i]);
    }
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
        float before = __shfl_up_sync(0xFFFFFFFFu, running[i], 1);  // the fold's `max` at this split
        if (lane == 0) before = i == 0 ? -INFINITY : carry[i];
        const int split = lane + 32 * i;
        factors[0][split] = expf(before - running[i]);
        factors[1][split] = expf(ml[i].x - running[i]);
        factors[2][split] = ml[i].y;
    }
}

// The fold of a dim's live partials a[0 .. live - 1] with the factors, divided by the folded sum.
// Eight splits a step, past `live` by a select: behind a branch per split each step waited on its
// factors' shared loads (tf_mla_combine: 7.1 us over 64 splits, ncu; 4.2 unbranched), and a step
// of eight past the last live split is skipped whole (a short row's one split).
template <int kSplits>
__device__ __forceinline__ float split_fold(const float (&factors)[3][kSplits], const float (&a)[kSplits], int live) {
    constexpr int kStep = 8;
    static_assert(kSplits % kStep == 0, "whole steps");
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int base = 0; base < kSplits; base += kStep) {
        if (base >= live) break;
#pragma unroll
        for (int split = base; split < base + kStep; ++split) {
            const float x = factors[0][split], y = factors[1][split];
            const float next_sum = __fadd_rn(__fmul_rn(sum, x), __fmul_rn(factors[2][split], y));
            const float next_acc = __fadd_rn(__fmul_rn(acc, x), __fmul_rn(a[split], y));
            sum = split < live ? next_sum : sum;
            acc = split < live ? next_acc : acc;
        }
    }
    return __fdiv_rn(acc, sum);
}
