// Decode attention of class A (GQA) over an f16 or fp8 cache (kv_store.cuh), on tensor cores with
// the query heads of a KV head as the m of the products (as mla.cu takes its heads), part of
// glm_forward.cu's module after attention_decode.cuh (attention_split, fold_split, the combine).
//
// tf_attention (attention_decode.cuh) reads an f32 cache with a warp per query head: every staged
// position is read from shared memory once per head of the group (12 for GLM-4.5), which bounds it
// at ~25% of copy. Here a block per (row, KV head, 16 heads of its group) and a warp per 16-position
// chunk: S = Q·Kᵀ (16 heads x 16 positions), an online softmax on the fragments, O += P·V, each
// staged position serving all 16 heads. The cache's f16 values are the B operands as they are
// (fp8: widened with their scale into exact f16 first); the f32 query and probabilities ride as f16
// high and low parts, so each product is ~2^-22 relative, as in the prompt attention.
//
// A row's positions fall into tf_attention's splits (attention_split, by its length alone); within a
// split, warp w takes chunks w, w + 4, .. and keeps its own online softmax, and the 4 warps' states
// are folded in warp order; the splits then fold left to right (fold_split), in the block (gridDim.y
// == 1) or by tf_attention_combine from part_* (a block per split): the same operations in the same
// order, so a row's bits depend on its own positions only, in any batch.
#pragma once

#include "kv_store.cuh"
#include "mma.cuh"

constexpr int kHeadsWarps = 4;
constexpr int kHeadsChunk = 16;  // positions per warp step: one k step of P·V
constexpr int kHeadsM = 16;      // query heads per block
// A warp's shared memory: two stages of its chunk's K and V rows as f16 (pitch D + 8 halves:
// 272-byte rows for D = 128, ldmatrix rows in distinct banks); fp8 stages its codes in the second
// half and widens them into the first.
template <int D>
__host__ __device__ constexpr int heads_pitch() { return D + 8; }
template <int D>
__host__ __device__ constexpr int heads_warp_bytes() { return 2 * 2 * kHeadsChunk * heads_pitch<D>() * 2; }
constexpr int kHeadsSharedBytes = kHeadsWarps * heads_warp_bytes<128>();
static_assert(kHeadsSharedBytes == 69632, "the launch's size: heads_attention_shared_bytes in glm_kernels.zig");
static_assert(kHeadsWarps * heads_warp_bytes<128>() >= kHeadsWarps * (kHeadsM * 128 + 2 * kHeadsM) * 4, "the warps' states fit for the fold");

// d += (ah + al)·b: an f32 A operand split in two, an exact f16 B operand (tile n of an x4 load).
__device__ __forceinline__ void mma_exact_b(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], const uint32_t (&b)[4], int n) {
    const uint32_t pair[2] = {b[2 * n], b[2 * n + 1]};
    tf::mma_16816(d, ah, pair);
    tf::mma_16816(d, al, pair);
}

template <int D, int kDtype>
__device__ __forceinline__ void attention_heads(const float* __restrict__ q, const void* __restrict__ cache_k, const void* __restrict__ cache_v,
                                                const int8_t* __restrict__ exp_k, const int8_t* __restrict__ exp_v,
                                                const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables,
                                                const uint32_t* __restrict__ table_offsets, const int* __restrict__ skip, float* __restrict__ out,
                                                float* __restrict__ part_acc, float* __restrict__ part_ml, int rows, int heads, int kv_heads,
                                                int layers, int layer, int page_tokens) {
    using namespace tf;
    constexpr int kPitch = heads_pitch<D>();
    constexpr int kSteps = D / 16;
    constexpr int kDimTiles = D / 8;
    constexpr int kRowBytes = D * (kDtype == kKvF16 ? 2 : 1);
    constexpr int kPieces = kRowBytes / 16;  // 16-byte copies per cached row
    extern __shared__ __align__(16) unsigned char heads_shared[];
    const int row = blockIdx.x / kv_heads;
    const int kv = blockIdx.x % kv_heads;
    if (row >= rows || (skip && skip[row])) return;
    const bool spread = gridDim.y > 1;
    const int length = static_cast<int>(positions[row]) + 1;
    const int split_first = spread ? blockIdx.y : 0;
    const int split_end = spread ? blockIdx.y + 1 : kAttentionSplits;
    if (attention_split(length, split_first).begin >= length) return;  // an empty split: the combine skips it
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int group = heads / kv_heads;
    const int member0 = blockIdx.z * kHeadsM;
    const bool live_a = member0 + g < group, live_b = member0 + g + 8 < group;
    const int head_a = kv * group + member0 + g, head_b = head_a + 8;
    const uint32_t* table = tables + table_offsets[row];
    unsigned char* mine = heads_shared + warp * heads_warp_bytes<D>();
    auto planes = reinterpret_cast<half(*)[2][kHeadsChunk][kPitch]>(mine);  // [stage][K/V][position][dim]
    // fp8: codes land in stage 1's planes ([K/V][position][kRowBytes]); stage 0's are the widened rows.
    unsigned char* codes = reinterpret_cast<unsigned char*>(&planes[1][0][0][0]);

    // Q·(1/sqrt(D)) as A fragments: register r of step k holds (head g or g + 8, dims 16k + 2t (+8 for r >= 2)).
    uint32_t qa[kSteps][2][4];
    const float scale = rsqrtf(static_cast<float>(D));
#pragma unroll
    for (int k = 0; k < kSteps; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const bool live = r % 2 == 0 ? live_a : live_b;
            const int h = r % 2 == 0 ? head_a : head_b;
            const int dim = 16 * k + 2 * t + 8 * (r / 2);
            float2 v = make_float2(0.f, 0.f);
            if (live) v = *reinterpret_cast<const float2*>(q + (static_cast<size_t>(row) * heads + h) * D + dim);
            split_pair(v.x * scale, v.y * scale, qa[k][0][r], qa[k][1][r]);
        }

    // The fold of the splits: thread i owns head i / 8 of the block, dims (i % 8)·D/8 ..
    constexpr int kFoldDims = D / 8;
    const int fold_head = threadIdx.x / 8;
    const int fold_dim = (threadIdx.x % 8) * kFoldDims;
    float folded_max = -INFINITY, folded_sum = 0.f;
    float folded[kFoldDims];
#pragma unroll
    for (int i = 0; i < kFoldDims; ++i) folded[i] = 0.f;

    for (int split = split_first; split < split_end; ++split) {
        const SplitRange range = attention_split(length, split);
        if (range.begin >= range.end) break;  // the splits after an empty one are empty too
        // Chunk c of this warp starts at range.begin + 16·(warp + 4c).
        const auto chunk_start = [&](int c) { return range.begin + kHeadsChunk * (warp + kHeadsWarps * c); };
        const auto cache_element = [&](int p) {
            return ((static_cast<size_t>(table[p / page_tokens]) * layers + layer) * kv_heads + kv) * page_tokens + p % page_tokens;
        };
        // fp8: lane j < 16 holds the exponent of K at the chunk's position j, lane 16 + j V's,
        // loaded when the chunk's codes are issued and read (shuffled) when they are widened.
        int8_t exponent = 0;
        const auto issue = [&](int c) {
            const int p0 = chunk_start(c);
            const int stage = kDtype == kKvF16 ? c % 2 : 1;
            if constexpr (kDtype == kKvFp8) {
                const int j = lane % kHeadsChunk;
                exponent = p0 + j < range.end ? (lane < kHeadsChunk ? exp_k : exp_v)[cache_element(p0 + j)] : 0;
            }
#pragma unroll
            for (int task = lane; task < kHeadsChunk * kPieces; task += kWarp) {
                const int j = task / kPieces, piece = task % kPieces;
                const bool valid = p0 + j < range.end;
                const size_t at = valid ? cache_element(p0 + j) * kRowBytes + 16 * piece : 0;
                if constexpr (kDtype == kKvF16) {
                    copy16_async(&planes[stage][0][j][8 * piece], static_cast<const unsigned char*>(cache_k) + at, valid);
                    copy16_async(&planes[stage][1][j][8 * piece], static_cast<const unsigned char*>(cache_v) + at, valid);
                } else {
                    copy16_async(codes + (0 * kHeadsChunk + j) * kRowBytes + 16 * piece, static_cast<const unsigned char*>(cache_k) + at, valid);
                    copy16_async(codes + (1 * kHeadsChunk + j) * kRowBytes + 16 * piece, static_cast<const unsigned char*>(cache_v) + at, valid);
                }
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        };

        float o[kDimTiles][4];
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) o[n][i] = 0.f;
        float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.f, sum_b = 0.f;
        const bool any = chunk_start(0) < range.end;
        if (any) issue(0);
        for (int c = 0; chunk_start(c) < range.end; ++c) {
            const int p0 = chunk_start(c);
            int stage = c % 2;
            if constexpr (kDtype == kKvF16) {
                if (chunk_start(c + 1) < range.end) issue(c + 1);
                else asm volatile("cp.async.commit_group;\n" ::: "memory");
                asm volatile("cp.async.wait_group 1;\n" ::: "memory");
                __syncwarp();
            } else {
                // fp8: widen this chunk's codes into stage 0 with their positions' scales, then
                // bring the next chunk's codes while the products run.
                stage = 0;
                asm volatile("cp.async.wait_group 0;\n" ::: "memory");
                __syncwarp();
                const int8_t exponents = exponent;  // this chunk's, before issue() loads the next's
#pragma unroll 4
                for (int task = lane; task < 2 * kHeadsChunk * (D / 8); task += kWarp) {
                    const int which = task / (kHeadsChunk * (D / 8));
                    const int j = (task / (D / 8)) % kHeadsChunk;
                    const int d = 8 * (task % (D / 8));
                    const int8_t e = static_cast<int8_t>(__shfl_sync(0xFFFFFFFFu, static_cast<int>(exponents), which * kHeadsChunk + j));
                    const __half2 s = fp8_scale_pair(e);
                    const uint2 raw = *reinterpret_cast<const uint2*>(codes + (which * kHeadsChunk + j) * kRowBytes + d);
                    uint4 wide;
                    wide.x = fp8_pair_to_halves(static_cast<uint16_t>(raw.x), s);
                    wide.y = fp8_pair_to_halves(static_cast<uint16_t>(raw.x >> 16), s);
                    wide.z = fp8_pair_to_halves(static_cast<uint16_t>(raw.y), s);
                    wide.w = fp8_pair_to_halves(static_cast<uint16_t>(raw.y >> 16), s);
                    *reinterpret_cast<uint4*>(&planes[0][which][j][d]) = wide;
                }
                __syncwarp();
                if (chunk_start(c + 1) < range.end) issue(c + 1);
            }

            // S = Q·Kᵀ: ldmatrix of 8 positions x 8 dims gives lane (g, t) position g, dims 2t, 2t + 1.
            float s[2][4] = {};
#pragma unroll
            for (int k = 0; k < kSteps; ++k) {
                const int position = lane % 8 + 8 * (lane / 16);
                const int dim = 16 * k + 8 * ((lane / 8) % 2);
                uint32_t kf[4];
                ldmatrix_x4(kf, &planes[stage][0][position][dim]);
#pragma unroll
                for (int n = 0; n < 2; ++n) mma_exact_b(s[n], qa[k][0], qa[k][1], kf, n);
            }
            // Entries (n, 0..1) are head a's positions p0 + 8n + 2t + e, (n, 2..3) head b's.
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (p0 + 8 * n + 2 * t + e >= range.end) s[n][e] = s[n][2 + e] = -INFINITY;
            online_softmax(s, o, max_a, max_b, sum_a, sum_b);

            // O += P·V: P's C fragments are the A fragment; ldmatrix.trans gives V's B fragments.
            uint32_t ph[4], pl[4];
            split_fragment(s[0], s[1], ph, pl);
#pragma unroll
            for (int pair = 0; pair < kSteps; ++pair) {
                const int position = lane % 8 + 8 * ((lane / 8) % 2);
                const int dim = 16 * pair + 8 * (lane / 16);
                uint32_t vf[4];
                ldmatrix_x4_trans(vf, &planes[stage][1][position][dim]);
#pragma unroll
                for (int n = 0; n < 2; ++n) mma_exact_b(o[2 * pair + n], ph, pl, vf, n);
            }
            __syncwarp();  // every lane is done with this stage before it is refilled
        }
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");

        // The warps' states into shared memory ([warp][head][D] accumulators, then [warp][head][max, sum]),
        // folded in warp order by the thread that owns (head, dims); a warp without chunks is skipped.
        __syncthreads();  // every warp is done with its stages
        float* states = reinterpret_cast<float*>(heads_shared);
        float* ml = states + kHeadsWarps * kHeadsM * D;
        const float total_a = quad_sum(sum_a), total_b = quad_sum(sum_b);
        if (any) {
#pragma unroll
            for (int n = 0; n < kDimTiles; ++n) {
                *reinterpret_cast<float2*>(states + (warp * kHeadsM + g) * D + 8 * n + 2 * t) = make_float2(o[n][0], o[n][1]);
                *reinterpret_cast<float2*>(states + (warp * kHeadsM + g + 8) * D + 8 * n + 2 * t) = make_float2(o[n][2], o[n][3]);
            }
            if (t == 0) {
                *reinterpret_cast<float2*>(ml + 2 * (warp * kHeadsM + g)) = make_float2(max_a, total_a);
                *reinterpret_cast<float2*>(ml + 2 * (warp * kHeadsM + g + 8)) = make_float2(max_b, total_b);
            }
        }
        __syncthreads();
        float split_max = -INFINITY, split_sum = 0.f;
        float acc[kFoldDims];
#pragma unroll
        for (int i = 0; i < kFoldDims; ++i) acc[i] = 0.f;
        for (int w = 0; w < kHeadsWarps; ++w) {
            if (range.begin + kHeadsChunk * w >= range.end) break;
            const float2 m = *reinterpret_cast<const float2*>(ml + 2 * (w * kHeadsM + fold_head));
            float part[kFoldDims];
#pragma unroll
            for (int i = 0; i < kFoldDims; ++i) part[i] = states[(w * kHeadsM + fold_head) * D + fold_dim + i];
            fold_split(split_max, split_sum, acc, m.x, m.y, part);
        }
        __syncthreads();  // the states are read before the next split's stages overwrite them
        const int member = member0 + fold_head;
        if (member >= group) continue;
        const int h = kv * group + member;
        if (spread) {
            const size_t at = (static_cast<size_t>(row) * heads + h) * kAttentionSplits + split;
#pragma unroll
            for (int i = 0; i < kFoldDims; i += 4)
                *reinterpret_cast<float4*>(part_acc + at * D + fold_dim + i) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
            if (threadIdx.x % 8 == 0) *reinterpret_cast<float2*>(part_ml + 2 * at) = make_float2(split_max, split_sum);
        } else {
            fold_split(folded_max, folded_sum, folded, split_max, split_sum, acc);
        }
    }
    if (spread) return;
    const int member = member0 + fold_head;
    if (member >= group) return;
    const int h = kv * group + member;
#pragma unroll
    for (int i = 0; i < kFoldDims; i += 4) {
        const float a[4] = {folded[i], folded[i + 1], folded[i + 2], folded[i + 3]};
        *reinterpret_cast<float4*>(out + (static_cast<size_t>(row) * heads + h) * D + fold_dim + i) = fold_result(a, folded_sum);
    }
}

#define TF_HEADS_ARGS                                                                                                                     \
    const float *__restrict__ q, const void *__restrict__ cache_k, const void *__restrict__ cache_v, const int8_t *__restrict__ exp_k,   \
        const int8_t *__restrict__ exp_v, const uint32_t *__restrict__ positions, const uint32_t *__restrict__ tables,                   \
        const uint32_t *__restrict__ table_offsets, const int *__restrict__ skip, float *__restrict__ out, float *__restrict__ part_acc, \
        float *__restrict__ part_ml, int rows, int heads, int kv_heads, int layers, int layer, int page_tokens
#define TF_HEADS_PASS q, cache_k, cache_v, exp_k, exp_v, positions, tables, table_offsets, skip, out, part_acc, part_ml, rows, heads, kv_heads, layers, layer, page_tokens

// Grid: (rows x kv_heads, splits or 1, ceil(group / 16)); block: 128 threads; dynamic shared
// memory kHeadsSharedBytes. Named by head_dim and stored dtype.
extern "C" __global__ void __launch_bounds__(32 * kHeadsWarps) tf_attention_heads_128_f16(TF_HEADS_ARGS) { attention_heads<128, tf::kKvF16>(TF_HEADS_PASS); }
extern "C" __global__ void __launch_bounds__(32 * kHeadsWarps) tf_attention_heads_128_fp8(TF_HEADS_ARGS) { attention_heads<128, tf::kKvFp8>(TF_HEADS_PASS); }
extern "C" __global__ void __launch_bounds__(32 * kHeadsWarps) tf_attention_heads_64_f16(TF_HEADS_ARGS) { attention_heads<64, tf::kKvF16>(TF_HEADS_PASS); }
extern "C" __global__ void __launch_bounds__(32 * kHeadsWarps) tf_attention_heads_64_fp8(TF_HEADS_ARGS) { attention_heads<64, tf::kKvFp8>(TF_HEADS_PASS); }
