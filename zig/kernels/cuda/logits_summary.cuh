// The logits summary the sampler and the log-probabilities start from, part of glm_forward.cu's
// module. Included once, by glm_forward.cu, after the helpers it uses.
//
// A row of 150k logits in one block took ~110 us on the H200 (the f64 exps of one SM), as long as
// two MoE layers of a decode step; so each row is cut into kSummarySlices slices summarized by
// their own blocks, and one warp per row folds the slices in a fixed order. The slices depend on
// the vocabulary alone, so a row's summary does not depend on its batch.
#pragma once
#include "grid_dependency.cuh"

// Device twin of core/logits_summary.zig's LogitsSummary. A slice's partial uses the same layout,
// with log_total holding Σ exp(l − slice max) itself.
struct LogitsSummary {
    double log_total;
    float max;
    uint32_t argmax;
};

constexpr int kSummarySlices = 32;  // glm_kernels.zig: summary_slices

// The better of two (logit, token) candidates: the higher logit, the lower token on a tie. Empty
// candidates carry token `vocab`, which loses every tie.
__device__ __forceinline__ void keep_best(float& best, int& index, float other, int other_index) {
    if (other > best || (other == best && other_index < index)) {
        best = other;
        index = other_index;
    }
}

// parts[row * kSummarySlices + slice]: the slice's highest logit, its lowest token and
// Σ exp(l − that max) in f64, the difference too (an f32 one is off by up to 2⁻²⁴ of it, ~1e-7
// of a term); 0 when every logit of the slice is −inf, as masked tokens are.
extern "C" __global__ void __launch_bounds__(256) tf_logits_summary_parts(const float* __restrict__ logits, LogitsSummary* __restrict__ parts,
                                                                          int rows, int vocab) {
    tf_wait_prior_grid();
    __shared__ float best_sh[8];
    __shared__ int index_sh[8];
    __shared__ double sum_sh[8];
    const int row = blockIdx.x / kSummarySlices;
    const int slice = blockIdx.x % kSummarySlices;
    if (row >= rows) return;
    const int per_slice = (vocab + kSummarySlices - 1) / kSummarySlices;
    const int begin = min(vocab, slice * per_slice);
    const int end = min(vocab, begin + per_slice);
    const float* in = logits + static_cast<size_t>(row) * vocab;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    float best = -INFINITY;
    int index = vocab;
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) keep_best(best, index, in[i], i);
    for (int offset = 16; offset > 0; offset /= 2) {
        keep_best(best, index, __shfl_xor_sync(0xFFFFFFFFu, best, offset), __shfl_xor_sync(0xFFFFFFFFu, index, offset));
    }
    if (lane == 0) {
        best_sh[warp] = best;
        index_sh[warp] = index;
    }
    __syncthreads();
    best = best_sh[0];
    index = index_sh[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w) keep_best(best, index, best_sh[w], index_sh[w]);
    double sum = 0.0;
    if (best != -INFINITY) {
        for (int i = begin + threadIdx.x; i < end; i += blockDim.x) sum += exp(static_cast<double>(in[i]) - static_cast<double>(best));
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    if (lane == 0) sum_sh[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) total += sum_sh[w];
        parts[blockIdx.x] = {total, best, static_cast<uint32_t>(index)};
    }
}

// out[row]: the row's highest logit, its lowest token and max + log Σ_slices sum·exp(slice max −
// max), a warp per row, lane s holding slice s, summed over the fixed butterfly.
extern "C" __global__ void __launch_bounds__(256) tf_logits_summary(const LogitsSummary* __restrict__ parts, LogitsSummary* __restrict__ out,
                                                                    int rows) {
    tf_wait_prior_grid();
    static_assert(kSummarySlices == kWarp, "a lane per slice");
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (row >= rows) return;
    const LogitsSummary part = parts[static_cast<size_t>(row) * kSummarySlices + lane];
    float best = part.max;
    int index = static_cast<int>(part.argmax);
    for (int offset = 16; offset > 0; offset /= 2) {
        keep_best(best, index, __shfl_xor_sync(0xFFFFFFFFu, best, offset), __shfl_xor_sync(0xFFFFFFFFu, index, offset));
    }
    double sum = part.max == -INFINITY ? 0.0 : part.log_total * exp(static_cast<double>(part.max) - static_cast<double>(best));
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    if (lane == 0) out[row] = {static_cast<double>(best) + log(sum), best, static_cast<uint32_t>(index)};
}
