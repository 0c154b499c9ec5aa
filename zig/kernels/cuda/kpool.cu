// GLM-5.3-Flash's DSA indexer over pooled keys on the GPU, as zig/src/families/glm/parts/kpool.zig:
// each position's [LayerNorm(wk·x) | compress_gate·x] in the indexer cache (2·128 floats); a query
// scores each complete pool of `pool` positions ending at or before it by Σ_h w_h·ReLU(q_h·key·
// 128^-0.5), key the per-channel softmax(gate + ape)-weighted sum of the pool's keys; dsa.cu's
// tf_dsa_topk picks the best index_topk/pool pools (ties to the earlier), and tf_kpool_expand turns
// them into positions, ascending, plus the query's own incomplete pool. The host half is
// zig/src/cuda/kpool_kernels.zig.
#include <stdint.h>
#include "grid_dependency.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kDim = 128;        // index_head_dim; the host refuses others
constexpr int kHeadsMax = 64;    // dsa.cu's kIndexHeadsMax
constexpr int kPoolsPerBlock = 64;  // pools per block of tf_kpool_scores, a warp per pool in turn
constexpr int kScoreThreads = 256;

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

__device__ __forceinline__ float block_sum(float v, float* partial) {
    v = warp_sum(v);
    if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = v;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < kDim / kWarp; ++w) total += partial[w];
    __syncthreads();
    return total;
}

__device__ __forceinline__ const float* cache_row(const float* cache, const uint32_t* table, int position, int layers, int layer,
                                                  int page_tokens) {
    return cache + ((static_cast<size_t>(table[position / page_tokens]) * layers + layer) * page_tokens + position % page_tokens) * 2 * kDim;
}

}  // namespace

// A block per row, a thread per channel: the key's LayerNorm (biased variance) and the entry
// [key | gate scores] into the row's cache slot.
extern "C" __global__ void __launch_bounds__(kDim) tf_kpool_store(
    const float* __restrict__ key, const float* __restrict__ gates, const float* __restrict__ norm_weight,
    const float* __restrict__ norm_bias, float* __restrict__ cache, const uint32_t* __restrict__ positions,
    const uint32_t* __restrict__ tables, const uint32_t* __restrict__ table_offsets, int rows, float eps, int layers, int layer,
    int page_tokens) {
    tf_wait_prior_grid();
    __shared__ float partial[kDim / kWarp];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int d = threadIdx.x;
    const float x = key[static_cast<size_t>(row) * kDim + d];
    const float mean = block_sum(x, partial) / kDim;
    const float variance = block_sum((x - mean) * (x - mean), partial) / kDim;
    const int position = static_cast<int>(positions[row]);
    float* slot = const_cast<float*>(cache_row(cache, tables + table_offsets[row], position, layers, layer, page_tokens));
    slot[d] = (x - mean) * (1.0f / sqrtf(variance + eps)) * norm_weight[d] + norm_bias[d];
    slot[kDim + d] = gates[static_cast<size_t>(row) * kDim + d];
}

// Block (row of the chunk, 64 pools): a warp per pool in turn, a lane per 4 channels: the pool's
// key (per channel the softmax over its positions of gate + ape weighting their keys), then each
// head's q·key by one butterfly, ReLU'd and weighted, summed over the heads in order. (A thread per
// pool walking the channels was latency-bound: 300 us a decode row.) Pools past the row's complete
// ones are not read.
extern "C" __global__ void __launch_bounds__(kScoreThreads, 2) tf_kpool_scores(
    const float* __restrict__ q, const float* __restrict__ weights, const float* __restrict__ cache, const float* __restrict__ ape,
    const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables, const uint32_t* __restrict__ table_offsets,
    float* __restrict__ scores, int row_first, int rows, int heads, int pool, float score_scale, float weight_scale, int pools_max,
    int layers, int layer, int page_tokens) {
    tf_wait_prior_grid();
    __shared__ __align__(16) float queries[kHeadsMax * kDim];
    __shared__ float head_weights[kHeadsMax];
    const int row = row_first + blockIdx.x;
    if (row >= rows) return;
    const int pools = min((static_cast<int>(positions[row]) + 1) / pool, pools_max);
    const int first = blockIdx.y * kPoolsPerBlock;
    if (first >= pools) return;  // the whole block: no barrier is left waiting
    for (int i = threadIdx.x; i < heads * kDim; i += blockDim.x) queries[i] = q[static_cast<size_t>(row) * heads * kDim + i];
    for (int h = threadIdx.x; h < heads; h += blockDim.x) head_weights[h] = weights[static_cast<size_t>(row) * heads + h] * weight_scale;
    __syncthreads();
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const uint32_t* table = tables + table_offsets[row];
    const int last = min(first + kPoolsPerBlock, pools);
    for (int p = first + warp; p < last; p += kScoreThreads / kWarp) {
        const auto entry = [&](int i) { return cache_row(cache, table, p * pool + i, layers, layer, page_tokens); };
        const auto logit = [&](int i) {
            const float4 g = *reinterpret_cast<const float4*>(entry(i) + kDim + 4 * lane);
            const float4 a = *reinterpret_cast<const float4*>(ape + i * kDim + 4 * lane);
            return make_float4(g.x + a.x, g.y + a.y, g.z + a.z, g.w + a.w);
        };
        float4 peak = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        for (int i = 0; i < pool; ++i) {
            const float4 l = logit(i);
            peak = make_float4(fmaxf(peak.x, l.x), fmaxf(peak.y, l.y), fmaxf(peak.z, l.z), fmaxf(peak.w, l.w));
        }
        float4 total = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i = 0; i < pool; ++i) {
            const float4 l = logit(i);
            total.x += expf(l.x - peak.x), total.y += expf(l.y - peak.y), total.z += expf(l.z - peak.z), total.w += expf(l.w - peak.w);
        }
        float4 key = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i = 0; i < pool; ++i) {
            const float4 l = logit(i);
            const float4 k = *reinterpret_cast<const float4*>(entry(i) + 4 * lane);
            key.x += expf(l.x - peak.x) / total.x * k.x, key.y += expf(l.y - peak.y) / total.y * k.y;
            key.z += expf(l.z - peak.z) / total.z * k.z, key.w += expf(l.w - peak.w) / total.w * k.w;
        }
        float score = 0.f;
        for (int h = 0; h < heads; ++h) {
            const float4 qh = *reinterpret_cast<const float4*>(queries + h * kDim + 4 * lane);
            const float dot = warp_sum(qh.x * key.x + qh.y * key.y + qh.z * key.z + qh.w * key.w);
            score += head_weights[h] * fmaxf(dot * score_scale, 0.f);
        }
        if (lane == 0) scores[static_cast<size_t>(blockIdx.x) * pools_max + p] = score;
    }
}

// Per row: its chosen pools (ascending, from tf_dsa_topk) as their positions, then with `tail` the
// positions of its own incomplete pool, into selected[row·stride ..], and the count.
extern "C" __global__ void __launch_bounds__(256) tf_kpool_expand(
    const uint32_t* __restrict__ picks, const uint32_t* __restrict__ pick_counts, const uint32_t* __restrict__ positions,
    uint32_t* __restrict__ selected, uint32_t* __restrict__ counts, int rows, int keep, int pool, int stride, int tail) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int chosen = static_cast<int>(pick_counts[row]);
    const int length = static_cast<int>(positions[row]) + 1;
    const int complete = length / pool * pool;
    const int extra = tail ? length - complete : 0;
    uint32_t* out = selected + static_cast<size_t>(row) * stride;
    for (int i = threadIdx.x; i < chosen * pool; i += blockDim.x) out[i] = picks[static_cast<size_t>(row) * keep + i / pool] * pool + i % pool;
    for (int i = threadIdx.x; i < extra; i += blockDim.x) out[chosen * pool + i] = complete + i;
    if (threadIdx.x == 0) counts[row] = chosen * pool + extra;
}
