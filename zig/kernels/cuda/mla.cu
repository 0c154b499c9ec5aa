// Multi-head latent attention on the GPU (GLM.md §3.5), the absorbed form of
// zig/src/families/glm/parts/mla.zig for every row: the cache holds per position [latent | k_rope]
// (kv_lora + rope floats, shared by all heads), a head's query is [q_nope·W_UK | q_rope], its
// output W_UV·Σ p·latent. f32 throughout. The host half is zig/src/cuda/mla_kernels.zig.
//
// As in glm_forward.cu's attention, a row's positions (or its DSA selection) fall into kMlaSplits
// splits fixed by their count alone; within a split an online softmax in position order; the
// splits' partials are folded left to right by one function, either in the attention block (one
// block per row and head group) or by tf_mla_combine after a block per split wrote them (steps of
// few rows, spread over the GPU): the same operations in the same order, so a row's bits do not
// depend on its batch.
#include <stdint.h>

namespace {

constexpr int kWarp = 32;
constexpr int kMlaLatent = 512;  // kv_lora_rank of every GLM MLA model; the host refuses others
constexpr int kMlaRope = 64;     // qk_rope_head_dim likewise
constexpr int kMlaWidth = kMlaLatent + kMlaRope;
constexpr int kMlaLaneDims = kMlaWidth / kWarp;   // 18 query dims per lane
constexpr int kMlaLaneLatent = kMlaLatent / kWarp;  // 16 output dims per lane
constexpr int kMlaWarps = 8;  // heads per block, a warp each
constexpr int kMlaTile = 16;  // positions per shared tile
constexpr int kMlaSplits = 32;
constexpr int kMlaRows = 16;  // rows per block of the absorb and v_up products
static_assert(kMlaWidth % kWarp == 0 && kMlaLatent % kWarp == 0, "lanes split the dims evenly");

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}

struct SplitRange {
    int begin;
    int end;
};

// Split `split` of `count` positions: whole tiles, the same per split, fixed by count alone.
__device__ __forceinline__ SplitRange mla_split(int count, int split) {
    const int tiles = (count + kMlaTile - 1) / kMlaTile;
    const int per = (tiles + kMlaSplits - 1) / kMlaSplits;
    return {min(split * per * kMlaTile, count), min((split + 1) * per * kMlaTile, count)};
}

// (max, sum, acc) ⊕= a split's (m, l, a), rounded operations only: the attention kernel and the
// combine kernel compute the same bits.
__device__ __forceinline__ void fold_split(float& max, float& sum, float (&acc)[kMlaLaneLatent], float m, float l,
                                           const float (&a)[kMlaLaneLatent]) {
    const float next = fmaxf(max, m);
    const float x = expf(max - next);  // 0 on the first split
    const float y = expf(m - next);
    sum = __fadd_rn(__fmul_rn(sum, x), __fmul_rn(l, y));
#pragma unroll
    for (int i = 0; i < kMlaLaneLatent; ++i) acc[i] = __fadd_rn(__fmul_rn(acc[i], x), __fmul_rn(a[i], y));
    max = next;
}

// Rotates the `dims` values at x (stride 1) by cos_sin's angles: rotate-half pairs (j, j + dims/2),
// or interleaved pairs (2j, 2j + 1) written back de-interleaved (rope.zig). One warp.
__device__ __forceinline__ void rope_warp(float* x, const float* cs, int dims, bool interleaved, int lane) {
    const int half = dims / 2;
    float a[2], b[2];
    for (int k = 0; k < 2; ++k) {
        const int j = lane + k * kWarp;
        if (j >= half) continue;
        a[k] = interleaved ? x[2 * j] : x[j];
        b[k] = interleaved ? x[2 * j + 1] : x[j + half];
    }
    __syncwarp();
    for (int k = 0; k < 2; ++k) {
        const int j = lane + k * kWarp;
        if (j >= half) continue;
        x[j] = a[k] * cs[j] - b[k] * cs[half + j];
        x[j + half] = b[k] * cs[j] + a[k] * cs[half + j];
    }
    __syncwarp();
}

}  // namespace

// The latent's RMSNorm and the rotations, then the cache write: per row, [RMSNorm(latent) | rotated
// k_rope] into the layer's cache slot, and every head's q_rope rotated in place. A block per row,
// warp 0 the key, the other warps the heads.
extern "C" __global__ void __launch_bounds__(256) tf_mla_rope_store(
    float* __restrict__ kv, float* __restrict__ q, float* __restrict__ cache, const float* __restrict__ norm,
    const float* __restrict__ cos_sin, const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables,
    const uint32_t* __restrict__ table_offsets, int rows, int heads, int qk_dim, int nope_dim, int interleaved, float eps,
    int layers, int layer, int page_tokens) {
    __shared__ float partial[8];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    float* key = kv + static_cast<size_t>(row) * kMlaWidth;
    const float* cs = cos_sin + static_cast<size_t>(row) * kMlaRope;
    float sum = 0.f;
    for (int i = threadIdx.x; i < kMlaLatent; i += blockDim.x) sum += key[i] * key[i];
    sum = warp_sum(sum);
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < 8; ++w) total += partial[w];
    const float inverse = 1.0f / sqrtf(total / kMlaLatent + eps);
    const uint32_t position = positions[row];
    const uint32_t page = tables[table_offsets[row] + position / page_tokens];
    float* slot = cache + ((static_cast<size_t>(page) * layers + layer) * page_tokens + position % page_tokens) * kMlaWidth;
    for (int i = threadIdx.x; i < kMlaLatent; i += blockDim.x) slot[i] = norm[i] * (key[i] * inverse);
    if (warp == 0) {
        rope_warp(key + kMlaLatent, cs, kMlaRope, interleaved, lane);
        for (int i = lane; i < kMlaRope; i += kWarp) slot[kMlaLatent + i] = key[kMlaLatent + i];
    }
    for (int h = warp; h < heads; h += blockDim.x / kWarp)
        rope_warp(q + (static_cast<size_t>(row) * heads + h) * qk_dim + nope_dim, cs, kMlaRope, interleaved, lane);
}

// q_lat[r, h, :] = q_nope[r, h, :] · W_UK[h] (W_UK: the head's k_nope rows of kv_b_proj, [nope ×
// kv_lora]), summed over the nope dims in order. A block per (head, 16 rows): each weight row is
// read once for the block's rows, a thread per two latent columns.
extern "C" __global__ void __launch_bounds__(256) tf_mla_absorb(const float* __restrict__ q, const float* __restrict__ wuk,
                                                               float* __restrict__ q_lat, int rows, int heads, int qk_dim, int nope_dim) {
    __shared__ float qs[kMlaRows][256];
    const int h = blockIdx.x;
    const int row0 = blockIdx.y * kMlaRows;
    const int count = min(kMlaRows, rows - row0);
    for (int task = threadIdx.x; task < count * nope_dim; task += blockDim.x) {
        const int r = task / nope_dim, i = task % nope_dim;
        qs[r][i] = q[(static_cast<size_t>(row0 + r) * heads + h) * qk_dim + i];
    }
    __syncthreads();
    float acc[kMlaRows][2] = {};
    const float* w = wuk + static_cast<size_t>(h) * nope_dim * kMlaLatent;
    for (int i = 0; i < nope_dim; ++i) {
        const float w0 = w[static_cast<size_t>(i) * kMlaLatent + threadIdx.x];
        const float w1 = w[static_cast<size_t>(i) * kMlaLatent + threadIdx.x + 256];
#pragma unroll
        for (int r = 0; r < kMlaRows; ++r) {
            acc[r][0] = fmaf(qs[r][i], w0, acc[r][0]);
            acc[r][1] = fmaf(qs[r][i], w1, acc[r][1]);
        }
    }
    for (int r = 0; r < count; ++r) {
        float* out = q_lat + (static_cast<size_t>(row0 + r) * heads + h) * kMlaLatent;
        out[threadIdx.x] = acc[r][0];
        out[threadIdx.x + 256] = acc[r][1];
    }
}

// softmax(q·kᵀ·scale)·v per (row, head) over the row's positions 0..pos, or its DSA selection
// (selected[row·topk ..][0..counts[row]], ascending) when `selected` is given: k = a cache row,
// v = its latent. A warp per head, lanes over the dims (18 query dims, 16 latent dims each), the
// block's 8 heads sharing each tile of 16 cached positions in shared memory. gridDim.z == 1: a
// block runs every split and folds them; else a block per split writes its partial to part_*
// (part_acc[((row·heads + h)·splits + s)·kv_lora + d], part_ml[.. ·2 + {max, sum}]).
extern "C" __global__ void __launch_bounds__(32 * kMlaWarps) tf_mla_attention(
    const float* __restrict__ q, const float* __restrict__ q_lat, const float* __restrict__ cache,
    const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables, const uint32_t* __restrict__ table_offsets,
    const uint32_t* __restrict__ selected, const uint32_t* __restrict__ counts, int topk, float* __restrict__ out,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int rows, int heads, int qk_dim, int nope_dim, float scale,
    int layers, int layer, int page_tokens) {
    __shared__ __align__(16) float ks[kMlaTile][kMlaWidth];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int h = blockIdx.y * kMlaWarps + warp;
    const bool live = h < heads;
    const bool sparse = selected != nullptr;
    const int count = sparse ? static_cast<int>(counts[row]) : static_cast<int>(positions[row]) + 1;
    const uint32_t* picks = sparse ? selected + static_cast<size_t>(row) * topk : nullptr;
    const bool spread = gridDim.z > 1;
    const int split_first = spread ? blockIdx.z : 0;
    const int split_end = spread ? blockIdx.z + 1 : kMlaSplits;
    if (mla_split(count, split_first).begin >= count) return;
    const uint32_t* table = tables + table_offsets[row];
    float query[kMlaLaneDims];
#pragma unroll
    for (int k = 0; k < kMlaLaneDims; ++k) {
        const int d = lane + k * kWarp;
        float value = 0.f;
        if (live) value = d < kMlaLatent ? q_lat[(static_cast<size_t>(row) * heads + h) * kMlaLatent + d]
                                         : q[(static_cast<size_t>(row) * heads + h) * qk_dim + nope_dim + d - kMlaLatent];
        query[k] = value * scale;
    }
    float folded_max = -INFINITY, folded_sum = 0.f;
    float folded[kMlaLaneLatent] = {};
    for (int split = split_first; split < split_end; ++split) {
        const SplitRange range = mla_split(count, split);
        if (range.begin >= range.end) break;
        float running_max = -INFINITY, running_sum = 0.f;
        float acc[kMlaLaneLatent] = {};
        for (int t0 = range.begin; t0 < range.end; t0 += kMlaTile) {
            const int tile = min(kMlaTile, range.end - t0);
            __syncthreads();  // the previous tile is consumed
            for (int task = threadIdx.x; task < tile * (kMlaWidth / 4); task += blockDim.x) {
                const int j = task / (kMlaWidth / 4), d = 4 * (task % (kMlaWidth / 4));
                const int t = sparse ? static_cast<int>(picks[t0 + j]) : t0 + j;
                const size_t at = ((static_cast<size_t>(table[t / page_tokens]) * layers + layer) * page_tokens + t % page_tokens) * kMlaWidth + d;
                *reinterpret_cast<float4*>(&ks[j][d]) = *reinterpret_cast<const float4*>(cache + at);
            }
            __syncthreads();
            if (!live) continue;
            float score = -INFINITY;  // lane j: position t0 + j
            for (int j = 0; j < tile; ++j) {
                float partial = 0.f;
#pragma unroll
                for (int k = 0; k < kMlaLaneDims; ++k) partial = fmaf(query[k], ks[j][lane + k * kWarp], partial);
                partial = warp_sum(partial);
                if (lane == j) score = partial;
            }
            const float next_max = fmaxf(running_max, warp_max(score));
            const float p = lane < tile ? expf(score - next_max) : 0.f;
            const float rescale = expf(running_max - next_max);  // 0 on the first tile
            running_sum = running_sum * rescale + warp_sum(p);
            running_max = next_max;
#pragma unroll
            for (int k = 0; k < kMlaLaneLatent; ++k) acc[k] *= rescale;
            for (int j = 0; j < tile; ++j) {
                const float pj = __shfl_sync(0xFFFFFFFFu, p, j);
#pragma unroll
                for (int k = 0; k < kMlaLaneLatent; ++k) acc[k] = fmaf(pj, ks[j][lane + k * kWarp], acc[k]);
            }
        }
        if (!live) continue;
        if (spread) {
            const size_t at = (static_cast<size_t>(row) * heads + h) * kMlaSplits + split;
#pragma unroll
            for (int k = 0; k < kMlaLaneLatent; ++k) part_acc[at * kMlaLatent + lane + k * kWarp] = acc[k];
            if (lane == 0) {
                part_ml[2 * at] = running_max;
                part_ml[2 * at + 1] = running_sum;
            }
        } else {
            fold_split(folded_max, folded_sum, folded, running_max, running_sum, acc);
        }
    }
    if (spread || !live) return;
    float* target = out + (static_cast<size_t>(row) * heads + h) * kMlaLatent;
#pragma unroll
    for (int k = 0; k < kMlaLaneLatent; ++k) target[lane + k * kWarp] = __fdiv_rn(folded[k], folded_sum);
}

// The fold of tf_mla_attention's split partials: a warp per (row, head).
extern "C" __global__ void tf_mla_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                          const uint32_t* __restrict__ positions, const uint32_t* __restrict__ counts,
                                          float* __restrict__ out, int rows, int heads) {
    const int task = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (task >= rows * heads) return;
    const int row = task / heads, h = task % heads;
    const int count = counts ? static_cast<int>(counts[row]) : static_cast<int>(positions[row]) + 1;
    float folded_max = -INFINITY, folded_sum = 0.f;
    float folded[kMlaLaneLatent] = {};
    for (int split = 0; split < kMlaSplits; ++split) {
        const SplitRange range = mla_split(count, split);
        if (range.begin >= range.end) break;
        const size_t at = (static_cast<size_t>(row) * heads + h) * kMlaSplits + split;
        float a[kMlaLaneLatent];
#pragma unroll
        for (int k = 0; k < kMlaLaneLatent; ++k) a[k] = part_acc[at * kMlaLatent + lane + k * kWarp];
        fold_split(folded_max, folded_sum, folded, part_ml[2 * at], part_ml[2 * at + 1], a);
    }
    float* target = out + static_cast<size_t>(task) * kMlaLatent;
#pragma unroll
    for (int k = 0; k < kMlaLaneLatent; ++k) target[lane + k * kWarp] = __fdiv_rn(folded[k], folded_sum);
}

// out[r, h·v + j] = Σ_c W_UV[h][c][j] · lat[r, h, c] (W_UV stored transposed, [kv_lora × v], so that
// a block's threads read a weight row together), summed over c in order. A block per (head, 16
// rows), a thread per output column.
extern "C" __global__ void __launch_bounds__(256) tf_mla_v_up(const float* __restrict__ lat, const float* __restrict__ wuv_t,
                                                             float* __restrict__ out, int rows, int heads, int v_dim) {
    __shared__ float ls[kMlaRows][kMlaLatent];
    const int h = blockIdx.x;
    const int row0 = blockIdx.y * kMlaRows;
    const int count = min(kMlaRows, rows - row0);
    for (int task = threadIdx.x; task < count * kMlaLatent; task += blockDim.x) {
        const int r = task / kMlaLatent, c = task % kMlaLatent;
        ls[r][c] = lat[(static_cast<size_t>(row0 + r) * heads + h) * kMlaLatent + c];
    }
    __syncthreads();
    const float* w = wuv_t + static_cast<size_t>(h) * kMlaLatent * v_dim;
    for (int j = threadIdx.x; j < v_dim; j += blockDim.x) {
        float acc[kMlaRows] = {};
        for (int c = 0; c < kMlaLatent; ++c) {
            const float weight = w[static_cast<size_t>(c) * v_dim + j];
#pragma unroll
            for (int r = 0; r < kMlaRows; ++r) acc[r] = fmaf(ls[r][c], weight, acc[r]);
        }
        for (int r = 0; r < count; ++r) out[(static_cast<size_t>(row0 + r) * heads + h) * v_dim + j] = acc[r];
    }
}
