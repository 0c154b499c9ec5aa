// The DSA lightning indexer on the GPU (GLM.md §3.6), as zig/src/families/glm/parts/dsa.zig: per
// query row, I[s] = Σ_h w_h · ReLU(q_h · k_s · head_dim^-0.5) over the earlier positions of its
// sequence, then the index_topk best positions, ties to the earlier one, written ascending (the
// order tf_mla_attention sums them in). Rows whose context fits index_topk select everything. The
// host half is zig/src/cuda/dsa_kernels.zig.
#include <stdint.h>
#include "block_scan.cuh"
#include "grid_dependency.cuh"

namespace {

using tf::block_scan;
constexpr int kWarp = 32;
constexpr int kIndexHeadDim = 128;  // index_head_dim of every GLM DSA model; the host refuses others
constexpr int kIndexHeadsMax = 64;
constexpr int kIndexRope = 64;
constexpr int kScoreTile = 128;  // threads per block of tf_dsa_scores
constexpr int kTopkThreads = 1024;

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

// Interleaved pairs (2j, 2j + 1) of the first kIndexRope dims, written back de-interleaved.
__device__ __forceinline__ void rope_interleaved(float* x, const float* cs, int lane) {
    const int half = kIndexRope / 2;
    const float a = x[2 * lane], b = x[2 * lane + 1];
    __syncwarp();
    x[lane] = a * cs[lane] - b * cs[half + lane];
    x[half + lane] = b * cs[lane] + a * cs[half + lane];
    __syncwarp();
}

// A float's key for a descending order as unsigned integers: larger floats, larger keys.
__device__ __forceinline__ uint32_t order_key(float v) {
    const uint32_t bits = __float_as_uint(v == 0.f ? 0.f : v);  // -0 ties with +0
    return (bits >> 31) ? ~bits : bits | 0x80000000u;
}

}  // namespace

// Per row: LayerNorm of its key (weight, bias), RoPE on the key's and every head's query's first
// dims, the key into the layer's cache slot, and the head weights scaled by heads^-0.5. A block
// per row, warp 0 the key, the other warps the heads.
extern "C" __global__ void __launch_bounds__(256) tf_dsa_prepare(
    float* __restrict__ q, float* __restrict__ k, float* __restrict__ weights, float* __restrict__ cache,
    const float* __restrict__ norm_weight, const float* __restrict__ norm_bias, const float* __restrict__ cos_sin,
    const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables, const uint32_t* __restrict__ table_offsets,
    int rows, int heads, float eps, float weight_scale, int layers, int layer, int page_tokens) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const float* cs = cos_sin + static_cast<size_t>(row) * kIndexRope;
    if (warp == 0) {
        float* key = k + static_cast<size_t>(row) * kIndexHeadDim;
        float v[kIndexHeadDim / kWarp];
        float sum = 0.f;
        for (int i = 0; i < kIndexHeadDim / kWarp; ++i) sum += v[i] = key[lane + i * kWarp];
        const float mean = warp_sum(sum) / kIndexHeadDim;
        float squares = 0.f;
        for (int i = 0; i < kIndexHeadDim / kWarp; ++i) squares += (v[i] - mean) * (v[i] - mean);
        const float inverse = 1.0f / sqrtf(warp_sum(squares) / kIndexHeadDim + eps);
        for (int i = 0; i < kIndexHeadDim / kWarp; ++i) {
            const int d = lane + i * kWarp;
            key[d] = (v[i] - mean) * inverse * norm_weight[d] + norm_bias[d];
        }
        __syncwarp();
        rope_interleaved(key, cs, lane);
        const uint32_t position = positions[row];
        const uint32_t page = tables[table_offsets[row] + position / page_tokens];
        float* slot = cache + ((static_cast<size_t>(page) * layers + layer) * page_tokens + position % page_tokens) * kIndexHeadDim;
        for (int i = lane; i < kIndexHeadDim; i += kWarp) slot[i] = key[i];
        for (int h = lane; h < heads; h += kWarp) weights[static_cast<size_t>(row) * heads + h] *= weight_scale;
    }
    for (int h = warp - 1; warp > 0 && h < heads; h += blockDim.x / kWarp - 1)
        rope_interleaved(q + (static_cast<size_t>(row) * heads + h) * kIndexHeadDim, cs, lane);
}

// scores[(row - row_first)·context_max + s] for the row's positions s <= pos, for rows whose context
// exceeds topk (the others select everything): Σ_h w_h · ReLU(q_h · k_s · scale), each head's dot
// over the key's 128 dims in order (the key 16 dims at a time with the next 16 in flight, the
// queries read from shared memory) and the terms added in head order, each one fused
// multiply-add. Two forms of the same operations, so of the same bits:
// - tf_dsa_scores, a thread per position, heads in passes of 32 in registers, the sum in the
//   thread: ~2 instructions per multiply-add and no shuffles (a warp per position with a butterfly
//   per head took 168 us for 32k positions on the H200);
// - tf_dsa_scores_lanes, four threads per position, thread j its heads j, j + 4, ..., the ReLU'd
//   dots left in shared memory for the position's first thread to add: four times the warps (one
//   row at 8k positions had 256 warps for 528 schedulers), each lane loading the whole key. The
//   host takes it where the blocks are few (docs/measurements.md).
// A block takes the rounds of its span (the host caps a row's blocks at kScoreColumns): each block
// stages the row's queries (16 KB), which a block per round made as many bytes as the keys at 128k.
constexpr int kScorePassHeads = 32;  // a thread's heads per register pass, one lane per position
constexpr int kQueryPitch = kIndexHeadDim + 4;  // four lanes' rows of a position fall in distinct banks

template <int kLanes>
__device__ __forceinline__ void dsa_scores(const float* __restrict__ q, const float* __restrict__ weights, const float* __restrict__ cache,
                                           const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables,
                                           const uint32_t* __restrict__ table_offsets, float* __restrict__ scores, int row_first, int rows,
                                           int heads, int topk, float score_scale, int context_max, int layers, int layer, int page_tokens) {
    constexpr int kPositions = kScoreTile / kLanes;  // a round's
    constexpr int kPassHeads = kLanes == 1 ? kScorePassHeads : kIndexHeadsMax / kLanes;
    __shared__ __align__(16) float qs[kIndexHeadsMax][kQueryPitch];
    __shared__ float ws[kIndexHeadsMax];
    __shared__ float terms[kLanes == 1 ? 1 : kPositions][kIndexHeadsMax + 1];
    const int row = row_first + blockIdx.x;
    if (row >= rows) return;
    const int length = static_cast<int>(positions[row]) + 1;
    const int span = ((context_max + gridDim.y - 1) / gridDim.y + kPositions - 1) / kPositions * kPositions;
    const int t0 = blockIdx.y * span;
    if (length <= topk || t0 >= length) return;
    {
        // Every load of the row's queries issued before any is stored: one at a time, a thread's 32
        // were as many L2 round trips ahead of the first multiply-add.
        constexpr int kStaged = kIndexHeadsMax * kIndexHeadDim / 4 / kScoreTile;
        constexpr int kRow4 = kIndexHeadDim / 4;
        const float4* q4 = reinterpret_cast<const float4*>(q + static_cast<size_t>(row) * heads * kIndexHeadDim);
        const int n4 = heads * kRow4;
        float4 staged[kStaged];
#pragma unroll
        for (int j = 0; j < kStaged; ++j) {
            const int i = threadIdx.x + j * kScoreTile;
            if (i < n4) staged[j] = q4[i];
        }
        if (threadIdx.x < heads) ws[threadIdx.x] = weights[static_cast<size_t>(row) * heads + threadIdx.x];
#pragma unroll
        for (int j = 0; j < kStaged; ++j) {
            const int i = threadIdx.x + j * kScoreTile;
            if (i < n4) *reinterpret_cast<float4*>(&qs[i / kRow4][4 * (i % kRow4)]) = staged[j];
        }
    }
    __syncthreads();
    const int position = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
    const uint32_t* table = tables + table_offsets[row];
    const int end = min(t0 + span, length);
    for (int base = t0; base < end; base += kPositions) {
        const int t = base + position;
        float total = 0.f;
        if (t < end) {
            const float4* key = reinterpret_cast<const float4*>(
                cache + ((static_cast<size_t>(table[t / page_tokens]) * layers + layer) * page_tokens + t % page_tokens) * kIndexHeadDim);
            for (int h0 = 0; h0 < heads; h0 += kLanes * kPassHeads) {
                float dot[kPassHeads] = {};
                float4 k4[4], next[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) k4[c] = __ldg(key + c);
                for (int d = 0; d < kIndexHeadDim; d += 16) {
                    if (d + 16 < kIndexHeadDim) {
#pragma unroll
                        for (int c = 0; c < 4; ++c) next[c] = __ldg(key + (d + 16) / 4 + c);
                    }
#pragma unroll
                    for (int j = 0; j < kPassHeads; ++j) {
                        const int h = h0 + lane + j * kLanes;
                        if (h >= heads) break;
#pragma unroll
                        for (int c = 0; c < 4; ++c) {
                            const float4 a = *reinterpret_cast<const float4*>(&qs[h][d + 4 * c]);
                            dot[j] = fmaf(a.x, k4[c].x, dot[j]); dot[j] = fmaf(a.y, k4[c].y, dot[j]);
                            dot[j] = fmaf(a.z, k4[c].z, dot[j]); dot[j] = fmaf(a.w, k4[c].w, dot[j]);
                        }
                    }
                    if (d + 16 < kIndexHeadDim) {
#pragma unroll
                        for (int c = 0; c < 4; ++c) k4[c] = next[c];
                    }
                }
#pragma unroll
                for (int j = 0; j < kPassHeads; ++j) {
                    const int h = h0 + lane + j * kLanes;
                    if (h >= heads) break;
                    const float relu = fmaxf(dot[j] * score_scale, 0.f);
                    if constexpr (kLanes == 1) total = fmaf(ws[h], relu, total);
                    else terms[position][h] = relu;
                }
            }
        }
        if constexpr (kLanes == 1) {
            if (t < end) scores[static_cast<size_t>(blockIdx.x) * context_max + t] = total;
        } else {
            __syncthreads();
            if (lane == 0 && t < end) {
                for (int h = 0; h < heads; ++h) total = fmaf(ws[h], terms[position][h], total);
                scores[static_cast<size_t>(blockIdx.x) * context_max + t] = total;
            }
            __syncthreads();  // the terms are read before the next round writes them
        }
    }
}

#define TF_DSA_SCORES_ARGS                                                                                                                   \
    const float *__restrict__ q, const float *__restrict__ weights, const float *__restrict__ cache, const uint32_t *__restrict__ positions, \
        const uint32_t *__restrict__ tables, const uint32_t *__restrict__ table_offsets, float *__restrict__ scores, int row_first, int rows, \
        int heads, int topk, float score_scale, int context_max, int layers, int layer, int page_tokens
#define TF_DSA_SCORES_PASS \
    q, weights, cache, positions, tables, table_offsets, scores, row_first, rows, heads, topk, score_scale, context_max, layers, layer, page_tokens
extern "C" __global__ void __launch_bounds__(kScoreTile) tf_dsa_scores(TF_DSA_SCORES_ARGS) {
    tf_wait_prior_grid();
    dsa_scores<1>(TF_DSA_SCORES_PASS);
}
extern "C" __global__ void __launch_bounds__(kScoreTile) tf_dsa_scores_lanes(TF_DSA_SCORES_ARGS) {
    tf_wait_prior_grid();
    dsa_scores<4>(TF_DSA_SCORES_PASS);
}
#undef TF_DSA_SCORES_ARGS
#undef TF_DSA_SCORES_PASS

// Each row's selection: its topk best candidates (ties to the earlier), ascending, into
// selected[row·topk ..] and their count; a row with at most topk takes them all. Candidates are
// positions 0..pos, or with `pool` > 1 the complete pools of `pool` positions that end at or before
// pos (kpool.cu scores them). A block per row: a radix select of the topk-th key (up to four 8-bit
// passes), then an ordered compaction. A thread reads its keys kTopkBatch at a time, every load
// issued before any is used, and a pass's bin is found by a scan of the histogram over the block.
// A row of at most kTopkHeld keys is staged in shared memory once (each of the up to six reads
// had been an L2 round trip). A warp with no key in the pass's bin skips the pass's match (after
// the first pass most do), and the passes stop once the bin's keys are exactly those still to
// take: the later passes would only split a bin that is taken whole.
constexpr int kTopkBatch = 8;
constexpr int kTopkHeld = 11264;  // 44 KB: an 8k context and its next 3k generated rows, under the 48 KB of static shared memory

// sm_8x: the compiler's choice (32 registers) spilled; one block per SM is what a row takes.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define TF_TOPK_BOUNDS __launch_bounds__(kTopkThreads, 1)
#else
#define TF_TOPK_BOUNDS __launch_bounds__(kTopkThreads)
#endif
extern "C" __global__ void TF_TOPK_BOUNDS tf_dsa_topk(
    const float* __restrict__ scores, const uint32_t* __restrict__ positions, uint32_t* __restrict__ selected,
    uint32_t* __restrict__ counts, int row_first, int rows, int topk, int context_max, int pool) {
    tf_wait_prior_grid();
    __shared__ int histogram[256];
    __shared__ int scan[kTopkThreads / kWarp];
    __shared__ uint32_t chosen_prefix;
    __shared__ int chosen_left;
    __shared__ bool chosen_whole;
    __shared__ float held[kTopkHeld];
    const int row = row_first + blockIdx.x;
    if (row >= rows) return;
    const int length = (static_cast<int>(positions[row]) + 1) / pool;
    uint32_t* out = selected + static_cast<size_t>(row) * topk;
    if (length <= topk) {
        for (int t = threadIdx.x; t < length; t += blockDim.x) out[t] = t;
        if (threadIdx.x == 0) counts[row] = length;
        return;
    }
    const float* row_scores = scores + static_cast<size_t>(blockIdx.x) * context_max;
    if (length <= kTopkHeld) {
        for (int base = threadIdx.x; base < length; base += kTopkBatch * kTopkThreads) {
            float v[kTopkBatch];
#pragma unroll
            for (int j = 0; j < kTopkBatch; ++j) v[j] = base + j * kTopkThreads < length ? row_scores[base + j * kTopkThreads] : 0.f;
#pragma unroll
            for (int j = 0; j < kTopkBatch; ++j)
                if (base + j * kTopkThreads < length) held[base + j * kTopkThreads] = v[j];
        }
        __syncthreads();
        row_scores = held;  // a generic pointer: the same loads below read shared memory
    }
    // The topk-th largest key, byte by byte from the top; `left`: how many of the keys equal to it
    // (in their prefix so far) are still to take.
    uint32_t prefix = 0, mask = 0;
    int left = topk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) histogram[i] = 0;
        __syncthreads();
        for (int base = threadIdx.x; base < length; base += kTopkBatch * kTopkThreads) {
            uint32_t keys[kTopkBatch];
#pragma unroll
            for (int j = 0; j < kTopkBatch; ++j) {
                const int t = base + j * kTopkThreads;
                keys[j] = t < length ? order_key(row_scores[t]) : 0u;
            }
#pragma unroll
            for (int j = 0; j < kTopkBatch; ++j) {
                // One atomic per distinct bin in the warp: tied keys (ReLU zeros) would serialize.
                const bool live = base + j * kTopkThreads < length && (keys[j] & mask) == prefix;
                if (!__any_sync(__activemask(), live)) continue;
                const int bin = live ? static_cast<int>((keys[j] >> shift) & 0xFF) : -1;
                const uint32_t peers = __match_any_sync(__activemask(), bin);
                if (bin >= 0 && (threadIdx.x % kWarp) == __ffs(peers) - 1) atomicAdd(&histogram[bin], __popc(peers));
            }
        }
        __syncthreads();
        // The bin of the topk-th key from the top: the highest bin b > 0 whose keys with the
        // ones above it reach `left`, else bin 0. Thread i holds bin 255 - i; the scan gives the
        // count above it.
        const int bin = 255 - static_cast<int>(threadIdx.x);
        const int here = bin >= 0 ? histogram[bin] : 0;
        int total;
        const int above = block_scan(here, scan, &total);
        if (bin >= 0 && above < left && (bin == 0 || above + here >= left)) {
            chosen_prefix = prefix | (static_cast<uint32_t>(bin) << shift);
            chosen_left = left - above;
            chosen_whole = above + here == left;
        }
        __syncthreads();
        prefix = chosen_prefix;
        left = chosen_left;
        mask |= 0xFFu << shift;
        if (chosen_whole) break;  // every key of the bin is taken: `left` is its count
    }
    // Keys above the threshold all, then the first `left` equal ones, in position order: each
    // thread a run of positions, counted, then written from its offset (two block scans in all).
    // Keys compare by their bytes decided so far (all four unless the passes stopped early).
    const int run = (length + blockDim.x - 1) / blockDim.x;
    const int first = min(static_cast<int>(threadIdx.x) * run, length), last = min(first + run, length);
    const auto batch = [&](int t0, uint32_t (&keys)[kTopkBatch]) {
#pragma unroll
        for (int j = 0; j < kTopkBatch; ++j) keys[j] = t0 + j < last ? order_key(row_scores[t0 + j]) & mask : 0u;
    };
    int above = 0, equal = 0;
    for (int t0 = first; t0 < last; t0 += kTopkBatch) {
        uint32_t keys[kTopkBatch];
        batch(t0, keys);
#pragma unroll
        for (int j = 0; j < kTopkBatch; ++j) {
            if (t0 + j >= last) break;
            above += keys[j] > prefix;
            equal += keys[j] == prefix;
        }
    }
    int total;
    const int above_before = block_scan(above, scan, &total);
    int equal_before = block_scan(equal, scan, &total);
    int at = above_before + min(equal_before, left);
    for (int t0 = first; t0 < last; t0 += kTopkBatch) {
        uint32_t keys[kTopkBatch];
        batch(t0, keys);
#pragma unroll
        for (int j = 0; j < kTopkBatch; ++j) {
            if (t0 + j >= last) break;
            if (keys[j] > prefix || (keys[j] == prefix && equal_before++ < left)) out[at++] = t0 + j;
        }
    }
    if (threadIdx.x == 0) counts[row] = topk;
}
