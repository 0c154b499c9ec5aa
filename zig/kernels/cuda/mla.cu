// Multi-head latent attention on the GPU (GLM.md §3.5), the absorbed form of
// zig/src/families/glm/parts/mla.zig for every row: the cache holds per position [latent | k_rope]
// (kv_lora + rope floats, shared by all heads), a head's query is [q_nope·W_UK | q_rope], its
// output W_UV·Σ p·latent. f32 data; the attention's products on tensor cores with f32 operands
// split into f16 high and low parts (mma.cuh). The host half is zig/src/cuda/mla_kernels.zig.
//
// As in glm_forward.cu's attention, a row's positions (or its DSA selection) fall into kMlaSplits
// splits fixed by their count alone; within a split an online softmax in position order; the
// splits' partials are folded left to right by one function, either in the attention block (one
// block per row and head group) or by tf_mla_combine after a block per split wrote them (steps of
// few rows, spread over the GPU): the same operations in the same order, so a row's bits do not
// depend on its batch.
#include <stdint.h>

#include "kv_store.cuh"
#include "mma.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kMlaLatent = 512;  // kv_lora_rank of every GLM MLA model; the host refuses others
constexpr int kMlaRope = 64;     // qk_rope_head_dim likewise
constexpr int kMlaWidth = kMlaLatent + kMlaRope;
constexpr int kMlaHeads = 16;   // heads per block: the m of the tensor-core products
constexpr int kMlaWarps = 8;  // warp w owns latent dims 64w .. 64w + 63, and rope dims 16w .. for w < 4
constexpr int kMlaTile = 16;   // positions per staged tile: one k step of P·V
constexpr int kMlaWarpDims = kMlaLatent / kMlaWarps;
constexpr int kMlaLatentSteps = kMlaWarpDims / 16;  // a warp's k steps of Q·Kᵀ over the latent
constexpr int kMlaRopeWarps = kMlaRope / 16;        // the warps with a rope step after those
constexpr int kMlaWarpSteps = kMlaLatentSteps + 1;
constexpr int kMlaWarpTiles = kMlaWarpDims / 8;  // a warp's n tiles of P·V
constexpr int kMlaPlanePitch = kMlaWidth + 8;  // halves: 1168-byte rows, ldmatrix rows in distinct banks
// 64 splits: a decode step's one row runs heads/16 x 64 blocks (GLM-4.7-Flash: 128) on 132 SMs.
constexpr int kMlaSplits = 64;
// Dynamic shared memory: the tile as f16 high/low planes, the next tile's f32 rows as cp.async
// brings them (they land while the warps compute on the planes), the warps' parts of S. Under
// sm_12x's 99 KB per block.
constexpr int kMlaPlanesBytes = 2 * kMlaTile * kMlaPlanePitch * 2;
constexpr int kMlaRawBytes = kMlaTile * kMlaWidth * 4;
constexpr int kMlaSharedBytes = kMlaPlanesBytes + kMlaRawBytes + kMlaWarps * kWarp * 8 * 4;
static_assert(kMlaSharedBytes == 82432, "the launch's size: attention_shared_bytes in mla_kernels.zig");
static_assert(kMlaRopeWarps <= kMlaWarps && kMlaRope % 16 == 0, "a rope step for each of the first warps");
static_assert(kMlaWidth % 4 == 0 && kMlaLatent % (16 * kMlaWarps) == 0, "the warps split the dims evenly");

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
// k_rope] into the layer's cache slot in its dtype (kv_store.cuh; fp8: one exponent per row in
// `exps`, from the row's largest value, as the host's KvStore takes it), and every head's q_rope
// rotated in place. A block per row, warp 0 the key, the other warps the heads.
extern "C" __global__ void __launch_bounds__(256) tf_mla_rope_store(
    float* __restrict__ kv, float* __restrict__ q, void* __restrict__ cache, const float* __restrict__ norm,
    const float* __restrict__ cos_sin, const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables,
    const uint32_t* __restrict__ table_offsets, int rows, int heads, int qk_dim, int nope_dim, int interleaved, float eps,
    int layers, int layer, int page_tokens, int kv_dtype, int8_t* __restrict__ exps) {
    __shared__ float partial[8];
    __shared__ float peak[8];
    __shared__ float stored[kMlaWidth];  // the row as the cache takes it
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    // NoPE (GLM-5.3-Flash: qk_dim == nope_dim): kv rows are the latent alone and the cache's rope
    // slot holds zeros, which q's absent rope part multiplies away in tf_mla_attention.
    const bool has_rope = qk_dim > nope_dim;
    float* key = kv + static_cast<size_t>(row) * (has_rope ? kMlaWidth : kMlaLatent);
    const float* cs = cos_sin + static_cast<size_t>(row) * kMlaRope;
    float sum = 0.f;
    for (int i = threadIdx.x; i < kMlaLatent; i += blockDim.x) sum += key[i] * key[i];
    sum = warp_sum(sum);
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < 8; ++w) total += partial[w];
    const float inverse = 1.0f / sqrtf(total / kMlaLatent + eps);
    for (int i = threadIdx.x; i < kMlaLatent; i += blockDim.x) stored[i] = norm[i] * (key[i] * inverse);
    if (!has_rope) {
        for (int i = threadIdx.x; i < kMlaRope; i += blockDim.x) stored[kMlaLatent + i] = 0.f;
    } else if (warp == 0) {
        rope_warp(key + kMlaLatent, cs, kMlaRope, interleaved, lane);
        for (int i = lane; i < kMlaRope; i += kWarp) stored[kMlaLatent + i] = key[kMlaLatent + i];
    }
    __syncthreads();
    const uint32_t position = positions[row];
    const uint32_t page = tables[table_offsets[row] + position / page_tokens];
    const size_t slot = (static_cast<size_t>(page) * layers + layer) * page_tokens + position % page_tokens;
    if (kv_dtype == tf::kKvFp8) {
        float amax = 0.f;
        for (int i = threadIdx.x; i < kMlaWidth; i += blockDim.x) amax = fmaxf(amax, fabsf(stored[i]));
        amax = warp_max(amax);
        if (lane == 0) peak[warp] = amax;
        __syncthreads();
        for (int w = 0; w < 8; ++w) amax = fmaxf(amax, peak[w]);
        const int e = tf::fp8_exponent(amax);
        for (int i = threadIdx.x; i < kMlaWidth; i += blockDim.x) static_cast<uint8_t*>(cache)[slot * kMlaWidth + i] = tf::fp8_encode(stored[i], e);
        if (threadIdx.x == 0) exps[slot] = static_cast<int8_t>(e);
    } else {
        for (int i = threadIdx.x; i < kMlaWidth; i += blockDim.x) {
            if (kv_dtype == tf::kKvF16) static_cast<half*>(cache)[slot * kMlaWidth + i] = tf::kv_half(stored[i]);
            else static_cast<float*>(cache)[slot * kMlaWidth + i] = stored[i];
        }
    }
    if (!has_rope) return;
    for (int h = warp; h < heads; h += blockDim.x / kWarp)
        rope_warp(q + (static_cast<size_t>(row) * heads + h) * qk_dim + nope_dim, cs, kMlaRope, interleaved, lane);
}

// out[r, h, :] = x[r, h, :] · W[h] for each head's (k × n) matrix W[h], rows of x at x_stride
// floats apart: the products around the attention, q_lat = q_nope·W_UK and out = lat·W_UV (W_UV
// stored transposed so that both read a weight row at a time). A block per (head, 32 output
// columns, 8 rows): its 8 warps split the k sum in eighths, lanes take a column each, and the
// eighths are added in warp order; so a row's sum has one order, whatever the rows beside it, and
// a decode step's single row still spreads over heads × n/32 blocks (a block per head did not:
// 65 and 141 us per layer for GLM-4.7-Flash's two products on the H200).
constexpr int kProductRows = 8;
constexpr int kProductWarps = 8;

__device__ __forceinline__ void head_product(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                             int rows, int heads, int x_stride, int k, int n) {
    __shared__ float partial[kProductWarps][kProductRows][kWarp];
    const int h = blockIdx.x;
    const int column = blockIdx.y * kWarp + threadIdx.x % kWarp;
    const int row0 = blockIdx.z * kProductRows;
    const int count = min(kProductRows, rows - row0);
    const int warp = threadIdx.x / kWarp;
    const int per = (k + kProductWarps - 1) / kProductWarps;
    const int i_end = min(k, (warp + 1) * per);
    float acc[kProductRows] = {};
    if (column < n) {
        const float* weights = w + static_cast<size_t>(h) * k * n + column;
        for (int i = warp * per; i < i_end; ++i) {
            const float weight = weights[static_cast<size_t>(i) * n];
#pragma unroll
            for (int r = 0; r < kProductRows; ++r)
                if (r < count) acc[r] = fmaf(x[(static_cast<size_t>(row0 + r) * heads + h) * x_stride + i], weight, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < kProductRows; ++r) partial[warp][r][threadIdx.x % kWarp] = acc[r];
    __syncthreads();
    if (warp != 0 || column >= n) return;
    for (int r = 0; r < count; ++r) {
        float sum = 0.f;
        for (int v = 0; v < kProductWarps; ++v) sum += partial[v][r][threadIdx.x];
        out[(static_cast<size_t>(row0 + r) * heads + h) * n + column] = sum;
    }
}

extern "C" __global__ void __launch_bounds__(32 * kProductWarps) tf_mla_absorb(const float* __restrict__ q, const float* __restrict__ wuk,
                                                                              float* __restrict__ q_lat, int rows, int heads, int qk_dim, int nope_dim) {
    head_product(q, wuk, q_lat, rows, heads, qk_dim, nope_dim, kMlaLatent);
}

// softmax(q·kᵀ·scale)·v per (row, head) over the row's positions 0..pos, or its DSA selection
// (selected[row·topk ..][0..counts[row]], ascending) when `selected` is given: k = a cache row
// [latent | rope], v = its latent. On tensor cores, the heads as the m of the products (as
// attention_prompt.cuh takes rows): a block per (row, 16 heads) stages kMlaTile positions at a
// time and every staged position serves the 16 heads, where a warp per head read the whole tile
// once per head and shared-memory bandwidth bound it (3-10% of copy at long contexts).
//
// The block's 8 warps split the dims: warp w owns latent dims 64w .. 64w + 63, and rope dims 16w ..
// 16w + 15 for w < 4. Per tile each warp computes its part of S = Q·Kᵀ (16 heads x 16 positions), the
// parts are added in warp order through shared memory (every warp then holds the same S, so the
// same softmax), and each warp accumulates O += P·V for its own 64 latent dims. Operands ride as
// f16 high and low parts (mma.cuh), ~2^-22 relative per product; positions past the split or the
// selection stage as zeros and score -inf. gridDim.z == 1: a block runs every split and folds them
// (fold_split); else a block per split writes its partial to part_* (part_acc[((row·heads + h)·
// splits + s)·kv_lora + d], part_ml[.. ·2 + {max, sum}]) for tf_mla_combine. Both fold the same
// way, so a row's bits are the same in either. Dynamic shared memory: kMlaSharedBytes.
template <bool kSpread, int kDtype>
__device__ __forceinline__ void mla_attention(const float* __restrict__ q, const float* __restrict__ q_lat, const void* __restrict__ cache,
                                              const int8_t* __restrict__ exps, const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables,
                                              const uint32_t* __restrict__ table_offsets, const uint32_t* __restrict__ selected,
                                              const uint32_t* __restrict__ counts, int topk, float* __restrict__ out,
                                              float* __restrict__ part_acc, float* __restrict__ part_ml, int rows, int heads, int qk_dim,
                                              int nope_dim, float scale, int layers, int layer, int page_tokens) {
    using namespace tf;
    extern __shared__ __align__(16) unsigned char mla_shared[];
    auto planes = reinterpret_cast<half(*)[kMlaTile][kMlaPlanePitch]>(mla_shared);  // [high/low][position][dim]
    unsigned char* raw = mla_shared + kMlaPlanesBytes;                                 // [position][dim], as cached
    constexpr int kRowBytes = kMlaWidth * (kDtype == kKvF32 ? 4 : kDtype == kKvF16 ? 2 : 1);
    // fp8: the staged tile's exponents (one per row), loaded with its copies.
    __shared__ int tile_exps[kMlaTile];
    int pending_exp = 0;
    float(*scores)[kWarp][8] = reinterpret_cast<float(*)[kWarp][8]>(mla_shared + kMlaPlanesBytes + kMlaRawBytes);
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int head_a = blockIdx.y * kMlaHeads + g, head_b = head_a + 8;  // this lane's two mma rows
    const bool sparse = selected != nullptr;
    const int count = sparse ? static_cast<int>(counts[row]) : static_cast<int>(positions[row]) + 1;
    const uint32_t* picks = sparse ? selected + static_cast<size_t>(row) * topk : nullptr;
    const int split_first = kSpread ? blockIdx.z : 0;
    const int split_end = kSpread ? blockIdx.z + 1 : kMlaSplits;
    if (count == 0) {  // an empty pooled selection (no tail): transformers' SDPA attends to nothing, 0
        if (!kSpread)
            for (int i = threadIdx.x; i < kMlaHeads * kMlaLatent; i += blockDim.x) {
                const int h = blockIdx.y * kMlaHeads + i / kMlaLatent;
                if (h < heads) out[(static_cast<size_t>(row) * heads + h) * kMlaLatent + i % kMlaLatent] = 0.f;
            }
        return;
    }
    if (mla_split(count, split_first).begin >= count) return;  // an empty split: the combine skips it
    const uint32_t* table = tables + table_offsets[row];
    if constexpr (kDtype != kKvF32)  // an f16 (or fp8 x scale) row is exact in f16: its low plane stays zero
        for (int i = threadIdx.x; i < kMlaTile * kMlaPlanePitch / 2; i += blockDim.x) reinterpret_cast<uint32_t*>(&planes[1][0][0])[i] = 0u;

    // The query, scaled, as A fragments of this warp's steps: steps 0..3 its latent dims
    // 64w + 16k .., step 4 its rope dims (w < 4); register r holds (head g or g + 8, dims +2t (+8 for r >= 2)).
    uint32_t qa[kMlaWarpSteps][2][4];
#pragma unroll
    for (int k = 0; k < kMlaWarpSteps; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            if (k == kMlaLatentSteps && warp >= kMlaRopeWarps) break;
            const int h = r % 2 == 0 ? head_a : head_b;
            const int dim = (k < kMlaLatentSteps ? kMlaWarpDims * warp + 16 * k : 16 * warp) + 2 * t + 8 * (r / 2);
            float2 v = make_float2(0.f, 0.f);
            if (h < heads && (k < kMlaLatentSteps || qk_dim > nope_dim))  // NoPE: no rope part
                v = k < kMlaLatentSteps ? *reinterpret_cast<const float2*>(q_lat + (static_cast<size_t>(row) * heads + h) * kMlaLatent + dim)
                                          : *reinterpret_cast<const float2*>(q + (static_cast<size_t>(row) * heads + h) * qk_dim + nope_dim + dim);
            split_pair(v.x * scale, v.y * scale, qa[k][0][r], qa[k][1][r]);
        }

    // Whole: the splits fold into `out` itself (the block's own 16 heads), which costs a read and a
    // write per split where registers for a second accumulator would spill.
    float folded_max_a = -INFINITY, folded_max_b = -INFINITY, folded_sum_a = 0.f, folded_sum_b = 0.f;
    float* out_a = out + (static_cast<size_t>(row) * heads + head_a) * kMlaLatent + kMlaWarpDims * warp + 2 * t;
    float* out_b = out + (static_cast<size_t>(row) * heads + head_b) * kMlaLatent + kMlaWarpDims * warp + 2 * t;
    for (int split = split_first; split < split_end; ++split) {
        const SplitRange range = mla_split(count, split);
        if (range.begin >= range.end) break;  // the splits after an empty one are empty too
        // Positions (selection entries) t0 .. t0 + kMlaTile - 1 into `raw`, one 16-byte copy per task.
        const auto issue = [&](int t0) {
#pragma unroll 1
            for (int task = threadIdx.x; task < kMlaTile * (kRowBytes / 16); task += blockDim.x) {
                const int j = task / (kRowBytes / 16), piece = task % (kRowBytes / 16);
                const bool valid = t0 + j < range.end;
                const int p = valid ? (sparse ? static_cast<int>(picks[t0 + j]) : t0 + j) : 0;
                const size_t at = ((static_cast<size_t>(table[p / page_tokens]) * layers + layer) * page_tokens + p % page_tokens) * kRowBytes + 16 * piece;
                copy16_async(raw + j * kRowBytes + 16 * piece, static_cast<const unsigned char*>(cache) + at, valid);
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            if constexpr (kDtype == kKvFp8) {
                const int j = threadIdx.x;
                if (j < kMlaTile) {
                    const bool valid = t0 + j < range.end;
                    const int p = valid ? (sparse ? static_cast<int>(picks[t0 + j]) : t0 + j) : 0;
                    pending_exp = valid ? exps[(static_cast<size_t>(table[p / page_tokens]) * layers + layer) * page_tokens + p % page_tokens] : 0;
                }
            }
        };
        float o[kMlaWarpTiles][4];
#pragma unroll
        for (int n = 0; n < kMlaWarpTiles; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) o[n][i] = 0.f;
        float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.f, sum_b = 0.f;
        issue(range.begin);  // `raw` is free: the last tile's conversion is behind a barrier
        for (int t0 = range.begin; t0 < range.end; t0 += kMlaTile) {
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
            if constexpr (kDtype == kKvFp8)
                if (threadIdx.x < kMlaTile) tile_exps[threadIdx.x] = pending_exp;
            __syncthreads();  // `raw` has landed, and every warp is done with the planes
            if constexpr (kDtype == kKvFp8) {
                // Codes times their row's power-of-two scale: exact f16 (kv_store.cuh).
                for (int task = threadIdx.x; task < kMlaTile * (kMlaWidth / 8); task += blockDim.x) {
                    const int j = task / (kMlaWidth / 8), d = 8 * (task % (kMlaWidth / 8));
                    const __half2 scale2 = fp8_scale_pair(static_cast<int8_t>(tile_exps[j]));
                    const uint2 codes = *reinterpret_cast<const uint2*>(raw + j * kRowBytes + d);
                    *reinterpret_cast<uint4*>(&planes[0][j][d]) = fp8_widen8(codes, scale2);
                }
            } else if constexpr (kDtype == kKvF16) {
                for (int task = threadIdx.x; task < kMlaTile * (kMlaWidth / 8); task += blockDim.x) {
                    const int j = task / (kMlaWidth / 8), d = 8 * (task % (kMlaWidth / 8));
                    *reinterpret_cast<uint4*>(&planes[0][j][d]) = *reinterpret_cast<const uint4*>(raw + j * kRowBytes + 2 * d);
                }
            } else {
                for (int task = threadIdx.x; task < kMlaTile * (kMlaWidth / 4); task += blockDim.x) {
                    const int j = task / (kMlaWidth / 4), d = 4 * (task % (kMlaWidth / 4));
                    const float4 v = *reinterpret_cast<const float4*>(raw + j * kRowBytes + 4 * d);
                    uint2 hi, lo;
                    split_pair(v.x, v.y, hi.x, lo.x);
                    split_pair(v.z, v.w, hi.y, lo.y);
                    *reinterpret_cast<uint2*>(&planes[0][j][d]) = hi;
                    *reinterpret_cast<uint2*>(&planes[1][j][d]) = lo;
                }
            }
            __syncthreads();  // the planes are ready and `raw` is free
            if (t0 + kMlaTile < range.end) issue(t0 + kMlaTile);

            // This warp's part of S over its steps: ldmatrix of 8 positions x 8 dims gives lane
            // (g, t) position g, dims 2t, 2t + 1, the B fragment as it is.
            float s[2][4] = {};
#pragma unroll
            for (int k = 0; k < kMlaWarpSteps; ++k) {
                if (k == kMlaLatentSteps && warp >= kMlaRopeWarps) break;
                const int position = lane % 8 + 8 * (lane / 16);
                const int dim = (k < kMlaLatentSteps ? kMlaWarpDims * warp + 16 * k : kMlaLatent + 16 * warp) + 8 * ((lane / 8) % 2);
                uint32_t kh[4], kl[4];
                ldmatrix_x4(kh, &planes[0][position][dim]);
                ldmatrix_x4(kl, &planes[1][position][dim]);
#pragma unroll
                for (int n = 0; n < 2; ++n) mma_split(s[n], qa[k][0], qa[k][1], kh, kl, n);
            }
            *reinterpret_cast<float4*>(&scores[warp][lane][0]) = make_float4(s[0][0], s[0][1], s[0][2], s[0][3]);
            *reinterpret_cast<float4*>(&scores[warp][lane][4]) = make_float4(s[1][0], s[1][1], s[1][2], s[1][3]);
            __syncthreads();
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    float total = scores[0][lane][4 * n + i];
#pragma unroll
                    for (int w = 1; w < kMlaWarps; ++w) total += scores[w][lane][4 * n + i];
                    s[n][i] = total;
                }

            // Entries (n, 0..1) are head a's positions t0 + 8n + 2t + e, (n, 2..3) head b's.
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (t0 + 8 * n + 2 * t + e >= range.end) s[n][e] = s[n][2 + e] = -INFINITY;
            online_softmax(s, o, max_a, max_b, sum_a, sum_b);

            // O += P·V, one step of 16 positions: P's C fragments are the A fragment; ldmatrix.trans
            // of 8 positions x 8 dims gives lane (g, t) positions 2t, 2t + 1 of dim g, the B fragment.
            uint32_t ph[4], pl[4];
            split_fragment(s[0], s[1], ph, pl);
#pragma unroll
            for (int pair = 0; pair < kMlaWarpTiles / 2; ++pair) {
                const int position = lane % 8 + 8 * ((lane / 8) % 2);
                const int dim = kMlaWarpDims * warp + 16 * pair + 8 * (lane / 16);
                uint32_t vh[4], vl[4];
                ldmatrix_x4_trans(vh, &planes[0][position][dim]);
                ldmatrix_x4_trans(vl, &planes[1][position][dim]);
#pragma unroll
                for (int n = 0; n < 2; ++n) mma_split(o[2 * pair + n], ph, pl, vh, vl, n);
            }
        }
        const float total_a = quad_sum(sum_a);
        const float total_b = quad_sum(sum_b);
        if constexpr (kSpread) {
            const size_t at_a = (static_cast<size_t>(row) * heads + head_a) * kMlaSplits + split;
            const size_t at_b = (static_cast<size_t>(row) * heads + head_b) * kMlaSplits + split;
#pragma unroll
            for (int n = 0; n < kMlaWarpTiles; ++n) {
                const int dim = kMlaWarpDims * warp + 8 * n + 2 * t;
                if (head_a < heads) *reinterpret_cast<float2*>(part_acc + at_a * kMlaLatent + dim) = make_float2(o[n][0], o[n][1]);
                if (head_b < heads) *reinterpret_cast<float2*>(part_acc + at_b * kMlaLatent + dim) = make_float2(o[n][2], o[n][3]);
            }
            if (warp == 0 && t == 0) {
                if (head_a < heads) *reinterpret_cast<float2*>(part_ml + 2 * at_a) = make_float2(max_a, total_a);
                if (head_b < heads) *reinterpret_cast<float2*>(part_ml + 2 * at_b) = make_float2(max_b, total_b);
            }
        } else {
            const float next_a = fmaxf(folded_max_a, max_a), next_b = fmaxf(folded_max_b, max_b);
            const float xa = expf(folded_max_a - next_a), ya = expf(max_a - next_a);  // x: 0 on the first split
            const float xb = expf(folded_max_b - next_b), yb = expf(max_b - next_b);
            folded_sum_a = __fadd_rn(__fmul_rn(folded_sum_a, xa), __fmul_rn(total_a, ya));
            folded_sum_b = __fadd_rn(__fmul_rn(folded_sum_b, xb), __fmul_rn(total_b, yb));
            const bool first = split == split_first;  // `out` holds no fold yet: zeros, as the combine starts
#pragma unroll
            for (int n = 0; n < kMlaWarpTiles; ++n) {
                if (head_a < heads) {
                    const float2 was = first ? make_float2(0.f, 0.f) : *reinterpret_cast<const float2*>(out_a + 8 * n);
                    *reinterpret_cast<float2*>(out_a + 8 * n) = make_float2(__fadd_rn(__fmul_rn(was.x, xa), __fmul_rn(o[n][0], ya)),
                                                                            __fadd_rn(__fmul_rn(was.y, xa), __fmul_rn(o[n][1], ya)));
                }
                if (head_b < heads) {
                    const float2 was = first ? make_float2(0.f, 0.f) : *reinterpret_cast<const float2*>(out_b + 8 * n);
                    *reinterpret_cast<float2*>(out_b + 8 * n) = make_float2(__fadd_rn(__fmul_rn(was.x, xb), __fmul_rn(o[n][2], yb)),
                                                                            __fadd_rn(__fmul_rn(was.y, xb), __fmul_rn(o[n][3], yb)));
                }
            }
            folded_max_a = next_a;
            folded_max_b = next_b;
        }
    }
    if constexpr (!kSpread) {
#pragma unroll
        for (int n = 0; n < kMlaWarpTiles; ++n) {
            if (head_a < heads) {
                const float2 v = *reinterpret_cast<const float2*>(out_a + 8 * n);
                *reinterpret_cast<float2*>(out_a + 8 * n) = make_float2(__fdiv_rn(v.x, folded_sum_a), __fdiv_rn(v.y, folded_sum_a));
            }
            if (head_b < heads) {
                const float2 v = *reinterpret_cast<const float2*>(out_b + 8 * n);
                *reinterpret_cast<float2*>(out_b + 8 * n) = make_float2(__fdiv_rn(v.x, folded_sum_b), __fdiv_rn(v.y, folded_sum_b));
            }
        }
    }
}

#define TF_MLA_ATTENTION_ARGS                                                                                                      \
    const float *__restrict__ q, const float *__restrict__ q_lat, const void *__restrict__ cache, const int8_t *__restrict__ exps, \
        const uint32_t *__restrict__ positions, const uint32_t *__restrict__ tables, const uint32_t *__restrict__ table_offsets, \
        const uint32_t *__restrict__ selected, const uint32_t *__restrict__ counts, int topk, float *__restrict__ out,             \
        float *__restrict__ part_acc, float *__restrict__ part_ml, int rows, int heads, int qk_dim, int nope_dim, float scale,    \
        int layers, int layer, int page_tokens
#define TF_MLA_ATTENTION_PASS \
    q, q_lat, cache, exps, positions, tables, table_offsets, selected, counts, topk, out, part_acc, part_ml, rows, heads, qk_dim, nope_dim, scale, layers, layer, page_tokens

// fp8's entries on sm_12x: its 99 KB of shared memory holds one block of these anyway, so the
// registers of a single block (ptxas caps them for two by default, and the fp8 conversion spills).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define TF_MLA_FP8_BOUNDS __launch_bounds__(32 * kMlaWarps, 1)
#else
#define TF_MLA_FP8_BOUNDS __launch_bounds__(32 * kMlaWarps)
#endif

// Every split in the block, folded there: prompt rows (and steps with many rows). Named by the
// cache's dtype (none: f32; fp8 takes its rows' exponents in `exps`).
extern "C" __global__ void __launch_bounds__(32 * kMlaWarps) tf_mla_attention(TF_MLA_ATTENTION_ARGS) {
    mla_attention<false, tf::kKvF32>(TF_MLA_ATTENTION_PASS);
}
extern "C" __global__ void __launch_bounds__(32 * kMlaWarps) tf_mla_attention_f16(TF_MLA_ATTENTION_ARGS) {
    mla_attention<false, tf::kKvF16>(TF_MLA_ATTENTION_PASS);
}
extern "C" __global__ void TF_MLA_FP8_BOUNDS tf_mla_attention_fp8(TF_MLA_ATTENTION_ARGS) {
    mla_attention<false, tf::kKvFp8>(TF_MLA_ATTENTION_PASS);
}

// A block per split (gridDim.z == kMlaSplits), partials for tf_mla_combine: a decode step's rows.
extern "C" __global__ void __launch_bounds__(32 * kMlaWarps) tf_mla_attention_split(TF_MLA_ATTENTION_ARGS) {
    mla_attention<true, tf::kKvF32>(TF_MLA_ATTENTION_PASS);
}
extern "C" __global__ void __launch_bounds__(32 * kMlaWarps) tf_mla_attention_split_f16(TF_MLA_ATTENTION_ARGS) {
    mla_attention<true, tf::kKvF16>(TF_MLA_ATTENTION_PASS);
}
extern "C" __global__ void TF_MLA_FP8_BOUNDS tf_mla_attention_split_fp8(TF_MLA_ATTENTION_ARGS) {
    mla_attention<true, tf::kKvFp8>(TF_MLA_ATTENTION_PASS);
}

// The fold of tf_mla_attention's split partials: a block per (row, head), a thread per 4 dims, each
// folding its dims' splits in split order as fold_split does (the same bits); the partials are
// loaded kCombineBatch splits at a time, so the loads overlap rather than queue.
constexpr int kCombineThreads = kMlaLatent / 4;
constexpr int kCombineBatch = 8;
static_assert(kMlaSplits % kCombineBatch == 0, "whole batches");

extern "C" __global__ void __launch_bounds__(kCombineThreads) tf_mla_combine(
    const float* __restrict__ part_acc, const float* __restrict__ part_ml, const uint32_t* __restrict__ positions,
    const uint32_t* __restrict__ counts, float* __restrict__ out, int rows, int heads) {
    const int task = blockIdx.x;
    if (task >= rows * heads) return;
    const int row = task / heads;
    const int d = 4 * threadIdx.x;
    const int count = counts ? static_cast<int>(counts[row]) : static_cast<int>(positions[row]) + 1;
    if (count == 0) {  // an empty selection: zeros, as tf_mla_attention writes
        *reinterpret_cast<float4*>(out + static_cast<size_t>(task) * kMlaLatent + d) = make_float4(0.f, 0.f, 0.f, 0.f);
        return;
    }
    const size_t base = static_cast<size_t>(task) * kMlaSplits;
    float max = -INFINITY, sum = 0.f;
    float acc[4] = {};
    for (int s0 = 0; s0 < kMlaSplits; s0 += kCombineBatch) {
        float4 a[kCombineBatch];
        float2 ml[kCombineBatch];
        int live = 0;
#pragma unroll
        for (int b = 0; b < kCombineBatch; ++b) {
            const SplitRange range = mla_split(count, s0 + b);
            if (range.begin < range.end) {
                a[b] = __ldg(reinterpret_cast<const float4*>(part_acc + (base + s0 + b) * kMlaLatent + d));
                ml[b] = __ldg(reinterpret_cast<const float2*>(part_ml + 2 * (base + s0 + b)));
                live = b + 1;
            }
        }
#pragma unroll
        for (int b = 0; b < kCombineBatch; ++b) {
            if (b >= live) break;
            const float next = fmaxf(max, ml[b].x);
            const float x = expf(max - next);
            const float y = expf(ml[b].x - next);
            sum = __fadd_rn(__fmul_rn(sum, x), __fmul_rn(ml[b].y, y));
            acc[0] = __fadd_rn(__fmul_rn(acc[0], x), __fmul_rn(a[b].x, y));
            acc[1] = __fadd_rn(__fmul_rn(acc[1], x), __fmul_rn(a[b].y, y));
            acc[2] = __fadd_rn(__fmul_rn(acc[2], x), __fmul_rn(a[b].z, y));
            acc[3] = __fadd_rn(__fmul_rn(acc[3], x), __fmul_rn(a[b].w, y));
            max = next;
        }
        if (live < kCombineBatch) break;
    }
    *reinterpret_cast<float4*>(out + static_cast<size_t>(task) * kMlaLatent + d) =
        make_float4(__fdiv_rn(acc[0], sum), __fdiv_rn(acc[1], sum), __fdiv_rn(acc[2], sum), __fdiv_rn(acc[3], sum));
}

extern "C" __global__ void __launch_bounds__(32 * kProductWarps) tf_mla_v_up(const float* __restrict__ lat, const float* __restrict__ wuv_t,
                                                                             float* __restrict__ out, int rows, int heads, int v_dim) {
    head_product(lat, wuv_t, out, rows, heads, kMlaLatent, kMlaLatent, v_dim);
}
