// Attention of prompt rows on tensor cores (flash-attention style), for head_dim 128. Included by
// glm_forward.cu; the host half is `Kernels.attentionPrompt` in zig/src/cuda/glm_kernels.zig.
//
// A block takes one tile of up to 16 rows of one sequence (the host's tile table) and up to 4 query
// heads of one KV head, a warp per head: the tile's 16 rows are the mma's m, so every K/V position
// staged in shared memory serves 16 rows x 4 heads (tf_attention's blocks serve one row). Per
// 32 staged positions a warp computes S = Q·Kᵀ, an online softmax on the fragments, and O += P·V.
// Every f32 operand rides as f16 high and low parts (mma.cuh): S = Qh·Kh + Qh·Kl + Ql·Kh and
// O += Ph·Vh + Ph·Vl + Pl·Vh, accumulated in f32, ~2^-22 relative per product.
//
// A row's bits depend on its own query and positions only: the staged positions are aligned at
// multiples of 32 from 0, positions past the row are masked to exact zeros (a tile past the row
// leaves its max, sum and accumulators exactly as they were), and each mma row is its own. So a
// prompt row gives the same bits in any tile, chunk or batch.
#pragma once
#include <math.h>
#include "grid_dependency.cuh"

#include "kv_store.cuh"
#include "mma.cuh"

namespace tf {

constexpr int kPromptAttentionRows = 16;
constexpr int kPromptAttentionWarpsMax = 4;
constexpr int kPromptAttentionDim = 128;
constexpr int kPromptKvTile = 32;
constexpr int kPromptKvPitch = kPromptAttentionDim + 8;  // halves: 272-byte rows, ldmatrix rows in distinct banks
// Dynamic shared memory: K and V as f16 high/low planes, then the next positions' f32 K and V as
// cp.async brings them (they land while the warps compute on the planes).
constexpr int kPromptPlanesBytes = 2 * 2 * kPromptKvTile * kPromptKvPitch * 2;
constexpr int kPromptAttentionSharedBytes = kPromptPlanesBytes + 2 * kPromptKvTile * kPromptAttentionDim * 4;
static_assert(kPromptAttentionSharedBytes == 67584, "the launch's size: prompt_attention_shared_bytes in glm_kernels.zig");

}  // namespace tf

// tiles: [0] = the tile count, then (first row, rows) per tile; a tile's rows are one sequence's,
// at consecutive positions (its last row's page table covers them all).
// Grid: (tiles or more, kv_heads x head chunks); block: 32 x min(group, 4) threads.
// kDtype: the cache's stored dtype (kv_store.cuh). An f16 or fp8 value is exact in f16, so its
// high plane holds it and its low plane stays zero.
template <int kDtype>
__device__ __forceinline__ void attention_prompt(
    const float* __restrict__ q, const void* __restrict__ cache_k, const void* __restrict__ cache_v, const int8_t* __restrict__ exp_k,
    const int8_t* __restrict__ exp_v, const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables,
    const uint32_t* __restrict__ table_offsets, const int* __restrict__ tiles, float* __restrict__ out, int heads, int kv_heads, int layers,
    int layer, int page_tokens) {
    using namespace tf;
    constexpr int D = kPromptAttentionDim;
    constexpr int kSteps = D / 16;
    constexpr int kDimTiles = D / 8;
    constexpr int kRowBytes = D * (kDtype == kKvF32 ? 4 : kDtype == kKvF16 ? 2 : 1);
    constexpr int kPieces = kRowBytes / 16;
    extern __shared__ __align__(16) unsigned char prompt_attention_shared[];
    auto ks = reinterpret_cast<half(*)[kPromptKvTile][kPromptKvPitch]>(prompt_attention_shared);  // [high/low][position][dim]
    auto vs = ks + 2;
    unsigned char* raw = prompt_attention_shared + kPromptPlanesBytes;  // [K/V][position][kRowBytes], as cached
    // fp8: the staged positions' exponents ([K/V][position]), after the codes (which take a quarter of raw).
    int8_t* exps = reinterpret_cast<int8_t*>(raw + 2 * kPromptKvTile * kRowBytes);
    if (static_cast<int>(blockIdx.x) >= tiles[0]) return;
    const int first = tiles[1 + 2 * blockIdx.x];
    const int count = tiles[2 + 2 * blockIdx.x];
    const int warps = blockDim.x / 32;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int group = heads / kv_heads;
    const int chunks = (group + warps - 1) / warps;
    const int kv = blockIdx.y / chunks;
    const int member = (blockIdx.y % chunks) * warps + warp;
    const bool live = member < group;
    const int h = kv * group + member;
    // This lane's two rows of the tile (g and g + 8); rows past the tile repeat its last row,
    // computed and never written.
    const int row_a = first + min(g, count - 1);
    const int row_b = first + min(g + 8, count - 1);
    const int pos_a = static_cast<int>(positions[row_a]);
    const int pos_b = static_cast<int>(positions[row_b]);
    const int last = static_cast<int>(positions[first + count - 1]);
    const uint32_t* table = tables + table_offsets[first + count - 1];
    if constexpr (kDtype != kKvF32)
        for (int i = threadIdx.x; i < kPromptKvTile * kPromptKvPitch / 2; i += blockDim.x) {
            reinterpret_cast<uint32_t*>(&ks[1][0][0])[i] = 0u;
            reinterpret_cast<uint32_t*>(&vs[1][0][0])[i] = 0u;
        }

    // Q·(1/sqrt(d)) as A fragments: register r of step k holds (row g or g + 8, dims 16k + 2t
    // (+8 for r >= 2)).
    uint32_t qa[kSteps][2][4];
    const float scale = rsqrtf(static_cast<float>(D));
#pragma unroll
    for (int k = 0; k < kSteps; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = r % 2 == 0 ? row_a : row_b;
            const int dim = 16 * k + 2 * t + 8 * (r / 2);
            float2 v = make_float2(0.f, 0.f);
            if (live) v = *reinterpret_cast<const float2*>(q + (static_cast<size_t>(row) * heads + h) * D + dim);
            split_pair(v.x * scale, v.y * scale, qa[k][0][r], qa[k][1][r]);
        }

    float o[kDimTiles][4];
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[n][i] = 0.f;
    float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.f, sum_b = 0.f;

    // Positions t0 .. t0 + 31 into `raw`, 16-byte copies of K and V rows; positions past the
    // tile's last row read as zeros.
    const auto element = [&](int p) {
        return ((static_cast<size_t>(table[p / page_tokens]) * layers + layer) * kv_heads + kv) * page_tokens + p % page_tokens;
    };
    const auto issue = [&](int t0) {
#pragma unroll 1
        for (int task = threadIdx.x; task < kPromptKvTile * kPieces; task += blockDim.x) {
            const int j = task / kPieces;
            const int piece = task % kPieces;
            const int p = t0 + j;
            const bool valid = p <= last;
            const size_t at = valid ? element(p) * kRowBytes + 16 * piece : 0;
            copy16_async(raw + j * kRowBytes + 16 * piece, static_cast<const unsigned char*>(cache_k) + at, valid);
            copy16_async(raw + (kPromptKvTile + j) * kRowBytes + 16 * piece, static_cast<const unsigned char*>(cache_v) + at, valid);
        }
        if constexpr (kDtype == kKvFp8) {
            for (int task = threadIdx.x; task < 2 * kPromptKvTile; task += blockDim.x) {
                const int p = t0 + task % kPromptKvTile;
                exps[task] = p <= last ? (task < kPromptKvTile ? exp_k : exp_v)[element(p)] : 0;
            }
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    issue(0);
    for (int t0 = 0; t0 <= last; t0 += kPromptKvTile) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();  // `raw` has landed, and the planes' previous positions are consumed
        if constexpr (kDtype == kKvF32) {
            const float* rawf = reinterpret_cast<const float*>(raw);
            for (int task = threadIdx.x; task < kPromptKvTile * (D / 4); task += blockDim.x) {
                const int j = task / (D / 4);
                const int d = 4 * (task % (D / 4));
                const float4 kf = *reinterpret_cast<const float4*>(rawf + j * D + d);
                const float4 vf = *reinterpret_cast<const float4*>(rawf + (kPromptKvTile + j) * D + d);
                uint2 hi, lo;
                split_pair(kf.x, kf.y, hi.x, lo.x);
                split_pair(kf.z, kf.w, hi.y, lo.y);
                *reinterpret_cast<uint2*>(&ks[0][j][d]) = hi;
                *reinterpret_cast<uint2*>(&ks[1][j][d]) = lo;
                split_pair(vf.x, vf.y, hi.x, lo.x);
                split_pair(vf.z, vf.w, hi.y, lo.y);
                *reinterpret_cast<uint2*>(&vs[0][j][d]) = hi;
                *reinterpret_cast<uint2*>(&vs[1][j][d]) = lo;
            }
        } else if constexpr (kDtype == kKvF16) {
            for (int task = threadIdx.x; task < kPromptKvTile * (D / 8); task += blockDim.x) {
                const int j = task / (D / 8);
                const int d = 8 * (task % (D / 8));
                *reinterpret_cast<uint4*>(&ks[0][j][d]) = *reinterpret_cast<const uint4*>(raw + j * kRowBytes + 2 * d);
                *reinterpret_cast<uint4*>(&vs[0][j][d]) = *reinterpret_cast<const uint4*>(raw + (kPromptKvTile + j) * kRowBytes + 2 * d);
            }
        } else {
            for (int task = threadIdx.x; task < 2 * kPromptKvTile * (D / 8); task += blockDim.x) {
                const int which = task / (kPromptKvTile * (D / 8));
                const int j = (task / (D / 8)) % kPromptKvTile;
                const int d = 8 * (task % (D / 8));
                const __half2 s = fp8_scale_pair(exps[which * kPromptKvTile + j]);
                const uint2 codes = *reinterpret_cast<const uint2*>(raw + (which * kPromptKvTile + j) * kRowBytes + d);
                *reinterpret_cast<uint4*>(which == 0 ? &ks[0][j][d] : &vs[0][j][d]) = fp8_widen8(codes, s);
            }
        }
        __syncthreads();  // the planes are ready and `raw` is free
        if (t0 + kPromptKvTile <= last) issue(t0 + kPromptKvTile);
        if (!live) continue;

        // S = Q·Kᵀ over 4 position tiles of 8: ldmatrix of 8 positions x 8 dims gives lane (g, t)
        // position g, dims 2t, 2t + 1, the B fragment as it is.
        float s[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[n][i] = 0.f;
#pragma unroll
        for (int k = 0; k < kSteps; ++k)
#pragma unroll
            for (int pair = 0; pair < 2; ++pair) {
                const int position = 16 * pair + lane % 8 + 8 * (lane / 16);
                const int dim = 16 * k + 8 * ((lane / 8) % 2);
                uint32_t kh[4], kl[4];
                ldmatrix_x4(kh, &ks[0][position][dim]);
                ldmatrix_x4(kl, &ks[1][position][dim]);
#pragma unroll
                for (int n = 0; n < 2; ++n) mma_split(s[2 * pair + n], qa[k][0], qa[k][1], kh, kl, n);
            }

        // Entries (n, 0..1) are row a's positions t0 + 8n + 2t + e, (n, 2..3) row b's; a position
        // past its row is masked (a tile past the row leaves max, sum and o exactly as they were).
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int p = t0 + 8 * n + 2 * t + e;
                if (p > pos_a) s[n][e] = -INFINITY;
                if (p > pos_b) s[n][2 + e] = -INFINITY;
            }
        online_softmax(s, o, max_a, max_b, sum_a, sum_b);

        // O += P·V over 2 steps of 16 positions: P's C fragments of position tiles 2k and 2k + 1
        // are the A fragment of step k; ldmatrix.trans of 8 positions x 8 dims gives lane (g, t)
        // positions 2t, 2t + 1 of dim g, the B fragment.
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            uint32_t ph[4], pl[4];
            split_fragment(s[2 * k], s[2 * k + 1], ph, pl);
#pragma unroll
            for (int pair = 0; pair < kDimTiles / 2; ++pair) {
                const int position = 16 * k + lane % 8 + 8 * ((lane / 8) % 2);
                const int dim = 16 * pair + 8 * (lane / 16);
                uint32_t vh[4], vl[4];
                ldmatrix_x4_trans(vh, &vs[0][position][dim]);
                ldmatrix_x4_trans(vl, &vs[1][position][dim]);
#pragma unroll
                for (int n = 0; n < 2; ++n) mma_split(o[2 * pair + n], ph, pl, vh, vl, n);
            }
        }
    }
    if (!live) return;
    const float total_a = quad_sum(sum_a);
    const float total_b = quad_sum(sum_b);
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
        const int dim = 8 * n + 2 * t;
        if (g < count)
            *reinterpret_cast<float2*>(out + (static_cast<size_t>(row_a) * heads + h) * D + dim) = make_float2(o[n][0] / total_a, o[n][1] / total_a);
        if (g + 8 < count)
            *reinterpret_cast<float2*>(out + (static_cast<size_t>(row_b) * heads + h) * D + dim) = make_float2(o[n][2] / total_b, o[n][3] / total_b);
    }
}

#define TF_PROMPT_ATTENTION_ARGS                                                                                                        \
    const float *__restrict__ q, const void *__restrict__ cache_k, const void *__restrict__ cache_v, const int8_t *__restrict__ exp_k, \
        const int8_t *__restrict__ exp_v, const uint32_t *__restrict__ positions, const uint32_t *__restrict__ tables,                 \
        const uint32_t *__restrict__ table_offsets, const int *__restrict__ tiles, float *__restrict__ out, int heads, int kv_heads,   \
        int layers, int layer, int page_tokens
#define TF_PROMPT_ATTENTION_PASS q, cache_k, cache_v, exp_k, exp_v, positions, tables, table_offsets, tiles, out, heads, kv_heads, layers, layer, page_tokens

extern "C" __global__ void __launch_bounds__(128) tf_attention_prompt(TF_PROMPT_ATTENTION_ARGS) {
    tf_wait_prior_grid(); attention_prompt<tf::kKvF32>(TF_PROMPT_ATTENTION_PASS); }
extern "C" __global__ void __launch_bounds__(128) tf_attention_prompt_f16(TF_PROMPT_ATTENTION_ARGS) {
    tf_wait_prior_grid(); attention_prompt<tf::kKvF16>(TF_PROMPT_ATTENTION_PASS); }
extern "C" __global__ void __launch_bounds__(128) tf_attention_prompt_fp8(TF_PROMPT_ATTENTION_ARGS) {
    tf_wait_prior_grid(); attention_prompt<tf::kKvFp8>(TF_PROMPT_ATTENTION_PASS); }
