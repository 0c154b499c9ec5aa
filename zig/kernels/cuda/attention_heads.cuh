// Decode attention of class A (GQA) over an f16 or fp8 cache (kv_store.cuh), on tensor cores with
// the query heads of a KV head as the m of the products (as mla.cu takes its heads), part of
// glm_forward.cu's module after attention_decode.cuh (fold_split, the combine; split_range of split_fold.cuh).
//
// tf_attention (attention_decode.cuh) reads an f32 cache with a warp per query head: every staged
// position is read from shared memory once per head of the group (12 for GLM-4.5), which bounds it
// at ~25% of copy. Here a block per (row, KV head, 16 heads of its group) and a warp per 16-position
// chunk: S = Q·Kᵀ (16 heads x 16 positions), an online softmax on the fragments, O += P·V, each
// staged position serving all 16 heads. The f32 query and probabilities ride as f16 high and low
// parts, so each product is ~2^-22 relative to the stored values, as in the prompt attention.
//
// The stored bytes go to shared memory as they are (cp.async, kStages chunks in flight per warp)
// and from there straight into B fragments: f16 rows by ldmatrix; fp8 codes by ldmatrix over code
// pairs, widened in registers (e4m3 is a subset of f16). fp8's scales are powers of two, so they are
// applied where they cost least and round nothing: a key's scale multiplies its column of S (f32),
// a value's its f16 pair in the B fragment (code x 2^e is an exact f16, kv_store.cuh). A lane's
// fp8 K fragment holds dims 4t..4t+3 of its position (ldmatrix gives code pairs), so the query's A
// fragment takes the same dims; its V fragments pair positions 2t, 2t+1 per dim (ldmatrix.trans
// over code pairs, then a byte permute), so output tile 2b + p holds dims 16b + 2j + p.
//
// A row's positions fall into tf_attention's splits (split_range, by its length alone); within a
// split, warp w takes chunks w, w + 4, .. and keeps its own online softmax, and the 4 warps' states
// are folded in warp order; the splits then fold left to right (fold_split), in the block (gridDim.y
// == 1) or by tf_attention_combine from part_* (a block per split): the same operations in the same
// order, so a row's bits depend on its own positions only, in any batch.
#pragma once

#include "kv_store.cuh"
#include "grid_dependency.cuh"
#include "mma.cuh"

constexpr int kHeadsWarps = 4;
constexpr int kHeadsChunk = 16;  // positions per warp step: one k step of P·V
constexpr int kHeadsM = 16;      // query heads per block

// A warp's shared memory: kStages chunks of K then V rows as stored, each row padded by 16 bytes
// (ldmatrix's 8 rows land in distinct banks). fp8 rows are half as long, so it keeps a chunk more
// in flight in less memory; both fit sm_12x's 99 KB per block.
template <int D, int kDtype>
struct HeadsTile {
    static constexpr int kRowBytes = D * (kDtype == tf::kKvF16 ? 2 : 1);
    static constexpr int kPitch = kRowBytes + 16;
    static constexpr int kPieces = kRowBytes / 16;  // 16-byte copies per row
    static constexpr int kPlaneBytes = kHeadsChunk * kPitch;
    static constexpr int kStages = kDtype == tf::kKvF16 ? 2 : 3;
    static constexpr int kWarpBytes = kStages * 2 * kPlaneBytes;
    static constexpr int kSharedBytes = kHeadsWarps * kWarpBytes;
    // After the last chunk the same memory holds the warps' states for their fold, a head's D
    // floats kStatePitch apart: f16's float2 stores (a half warp's heads 8 floats apart) and fp8's
    // float4 stores (a quarter warp's two heads 16 apart) land in distinct banks, and so do the
    // fold's float4 loads. Unpadded, every head of a store or a load fell in the same banks (8- to
    // 16-way conflicts on each of 128 accesses a lane, a split).
    static constexpr int kStatePitch = D + (kDtype == tf::kKvF16 ? 8 : 16);
    static_assert(kSharedBytes >= kHeadsWarps * (kHeadsM * kStatePitch + 2 * kHeadsM) * 4, "the warps' states fit for the fold");
    static_assert(kPieces % 2 == 0, "fp8's copy order: a lane takes every other piece of its row");
};
// The launch's sizes: headsAttentionSharedBytes in glm_kernels.zig.
static_assert(HeadsTile<128, tf::kKvF16>::kSharedBytes == 69632, "headsAttentionSharedBytes(128, .f16)");
static_assert(HeadsTile<64, tf::kKvF16>::kSharedBytes == 36864, "headsAttentionSharedBytes(64, .f16)");
static_assert(HeadsTile<128, tf::kKvFp8>::kSharedBytes == 55296, "headsAttentionSharedBytes(128, .fp8)");
static_assert(HeadsTile<64, tf::kKvFp8>::kSharedBytes == 30720, "headsAttentionSharedBytes(64, .fp8)");

template <int D, int kDtype>
__device__ __forceinline__ void attention_heads(const float* __restrict__ q, const void* __restrict__ cache_k, const void* __restrict__ cache_v,
                                                const int8_t* __restrict__ exp_k, const int8_t* __restrict__ exp_v,
                                                const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables,
                                                const uint32_t* __restrict__ table_offsets, const int* __restrict__ skip, float* __restrict__ out,
                                                float* __restrict__ part_acc, float* __restrict__ part_ml, int rows, int heads, int kv_heads,
                                                int layers, int layer, int page_tokens) {
    using namespace tf;
    using Tile = HeadsTile<D, kDtype>;
    constexpr bool kF16 = kDtype == kKvF16;
    constexpr int kStages = Tile::kStages;
    constexpr int kPitch = Tile::kPitch;
    constexpr int kSteps = D / 16;
    constexpr int kDimTiles = D / 8;
    extern __shared__ __align__(16) unsigned char heads_shared[];
    const int row = blockIdx.x / kv_heads;
    const int kv = blockIdx.x % kv_heads;
    if (row >= rows || (skip && skip[row])) return;
    const bool spread = gridDim.y > 1;
    const int length = static_cast<int>(positions[row]) + 1;
    const int split_first = spread ? blockIdx.y : 0;
    const int split_end = spread ? blockIdx.y + 1 : kAttentionSplits;
    if (split_range<kAttentionTile, kAttentionSplits>(length, split_first).begin >= length) return;  // an empty split: the combine skips it
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int group = heads / kv_heads;
    const int member0 = blockIdx.z * kHeadsM;
    const bool live_a = member0 + g < group, live_b = member0 + g + 8 < group;
    const int head_a = kv * group + member0 + g, head_b = head_a + 8;
    const uint32_t* table = tables + table_offsets[row];
    unsigned char* mine = heads_shared + warp * Tile::kWarpBytes;
    const auto plane = [&](int stage, int which) { return mine + (2 * stage + which) * Tile::kPlaneBytes; };

    // Q·(1/sqrt(D)) as A fragments: register r of step k holds head g (r even) or g + 8 (r odd) at
    // dims 16k + 2t (+8 for r >= 2) for f16, 16k + 4t (+2 for r >= 2) for fp8 (its K fragments).
    uint32_t qa[kSteps][2][4];
    const float scale = rsqrtf(static_cast<float>(D));
#pragma unroll
    for (int k = 0; k < kSteps; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const bool live = r % 2 == 0 ? live_a : live_b;
            const int h = r % 2 == 0 ? head_a : head_b;
            const int dim = kF16 ? 16 * k + 2 * t + 8 * (r / 2) : 16 * k + 4 * t + 2 * (r / 2);
            float2 v = make_float2(0.f, 0.f);
            if (live) v = *reinterpret_cast<const float2*>(q + (static_cast<size_t>(row) * heads + h) * D + dim);
            split_pair(v.x * scale, v.y * scale, qa[k][0][r], qa[k][1][r]);
        }

    // The fold of the splits: thread i owns head i / 8 of the block, dims 4(i % 8) + 32c .. + 3 for
    // c < D/32 (a quarter warp's float4 loads cover the 32 banks once; a head's 8 threads write
    // 128 contiguous bytes a c).
    constexpr int kFoldDims = D / 8;
    const int fold_head = threadIdx.x / 8;
    const auto fold_dim = [&](int i) { return 4 * (threadIdx.x % 8) + 32 * (i / 4) + i % 4; };  // of its i-th value
    float folded_max = -INFINITY, folded_sum = 0.f;
    float folded[kFoldDims];
#pragma unroll
    for (int i = 0; i < kFoldDims; ++i) folded[i] = 0.f;

    // Copies of chunk c's 16 rows, task i of lane l: f16, the 16-byte piece (l + 32i) % pieces of
    // row (l + 32i) / pieces (a warp's copy covers whole rows: at 32k, 61 -> 43 us per layer on an
    // H200 against the other order); fp8, piece l / 16 + 2i of row l % 16 (a lane stays on one
    // row, two lanes fill a sector; the two orders measured within 10% for fp8, this one ahead;
    // docs/measurements.md). fp8: lanes 0 and 1 also copy the chunk's K and V exponents.
    // Either way task i is task 0 moved by a constant: rows (f16) or pieces (fp8).
    constexpr int kTasks = kHeadsChunk * Tile::kPieces / kWarp;
    constexpr int kTaskRows = kF16 ? kWarp / Tile::kPieces : 0;  // rows task i is past task 0
    constexpr int kTaskBytes = kF16 ? 0 : 32;                    // bytes of its row past task 0's
    static_assert(!kF16 || kWarp % Tile::kPieces == 0, "f16: a task's rows are whole pieces of the warp");
    const int lane_row = kF16 ? lane / Tile::kPieces : lane % kHeadsChunk;
    const int lane_piece = kF16 ? lane % Tile::kPieces : lane / kHeadsChunk;
    const uint32_t lane_shared = shared_address(mine) + lane_row * kPitch + 16 * lane_piece;
    const unsigned char* const k_bytes = static_cast<const unsigned char*>(cache_k) + 16 * lane_piece;
    const unsigned char* const v_bytes = static_cast<const unsigned char*>(cache_v) + 16 * lane_piece;
    const bool exps_aligned = ((reinterpret_cast<uintptr_t>(exp_k) | reinterpret_cast<uintptr_t>(exp_v)) & 15) == 0;
    const PageIndex pages(page_tokens);
    for (int split = split_first; split < split_end; ++split) {
        const SplitRange range = split_range<kAttentionTile, kAttentionSplits>(length, split);
        if (range.begin >= range.end) break;  // the splits after an empty one are empty too
        // Chunk c of this warp starts at range.begin + 16·(warp + 4c).
        const auto chunk_start = [&](int c) { return range.begin + kHeadsChunk * (warp + kHeadsWarps * c); };
        const auto cache_element = [&](uint32_t page, int p) {
            return ((static_cast<size_t>(page) * layers + layer) * kv_heads + kv) * page_tokens + pages.offset(p);
        };
        // The page of the chunk issued next, loaded a chunk ahead so that no copy waits on it.
        uint32_t next_page = table[pages.page(chunk_start(0))];
        const auto issue = [&](int c) {
            const int first = chunk_start(c);
            // Within one page (always, when pages are a multiple of 16 tokens) the chunk's rows are
            // consecutive elements; otherwise each row finds its own page.
            const bool one_page = pages.offset(first) + kHeadsChunk <= page_tokens;
            const size_t first_element = cache_element(next_page, first);
            const auto element_of = [&](int j) {
                return one_page ? first_element + j : cache_element(table[pages.page(first + j)], first + j);
            };
            const uint32_t k_shared = lane_shared + (2 * (c % kStages)) * Tile::kPlaneBytes;
            const uint32_t v_shared = k_shared + Tile::kPlaneBytes;
#pragma unroll
            for (int i = 0; i < kTasks; ++i) {
                const int j = lane_row + kTaskRows * i;
                const bool valid = first + j < range.end;
                const size_t at = valid ? element_of(j) * Tile::kRowBytes + kTaskBytes * i : 0;
                const uint32_t to = (kTaskRows * kPitch + kTaskBytes) * i;
                copy16_async_to(k_shared + to, k_bytes + at, valid ? 16 : 0);
                copy16_async_to(v_shared + to, v_bytes + at, valid ? 16 : 0);
            }
            if constexpr (!kF16) {
                // The chunk's 16 K and 16 V exponents go with its group, into the padding of row 0
                // of its K and V planes (ldmatrix reads a row's first kRowBytes only). Held in
                // registers through the stages instead, each was consumed at its load (the
                // rotation's moves): a stall of a round trip a chunk, ~18% of fp8's samples.
                if (one_page && first_element % kHeadsChunk == 0 && exps_aligned) {
                    if (lane < 2) copy16_async_to(shared_address(plane(c % kStages, lane)) + Tile::kRowBytes, (lane == 0 ? exp_k : exp_v) + first_element, 16);
                } else {  // pages of other sizes: a lane's own load and store
                    const int j = lane % kHeadsChunk;
                    const int8_t e = first + j < range.end ? (lane < kHeadsChunk ? exp_k : exp_v)[element_of(j)] : 0;
                    reinterpret_cast<int8_t*>(plane(c % kStages, lane / kHeadsChunk))[Tile::kRowBytes + j] = e;
                }
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            if (chunk_start(c + 1) < range.end) next_page = table[pages.page(chunk_start(c + 1))];
        };

        float o[kDimTiles][4];
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) o[n][i] = 0.f;
        float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.f, sum_b = 0.f;
        const bool any = chunk_start(0) < range.end;
        // Chunks 0 .. kStages - 2 in flight before the first is used (an empty group past the end).
#pragma unroll
        for (int c = 0; c < kStages - 1; ++c) {
            if (chunk_start(c) < range.end) {
                issue(c);
            } else {
                asm volatile("cp.async.commit_group;\n" ::: "memory");
            }
        }
        for (int c = 0; chunk_start(c) < range.end; ++c) {
            const int p0 = chunk_start(c);
            if (chunk_start(c + kStages - 1) < range.end) {
                issue(c + kStages - 1);
            } else {
                asm volatile("cp.async.commit_group;\n" ::: "memory");
            }
            asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
            __syncwarp();
            const unsigned char* k_plane = plane(c % kStages, 0);
            const unsigned char* v_plane = plane(c % kStages, 1);
            // fp8: lane j < 16 holds position j's K exponent, lane 16 + j its V's; 0 past the end,
            // whose zeroed codes then stay zeros.
            int current = 0;
            if constexpr (!kF16) {
                const int j = lane % kHeadsChunk;
                const int8_t e = reinterpret_cast<const int8_t*>(lane < kHeadsChunk ? k_plane : v_plane)[Tile::kRowBytes + j];
                current = p0 + j < range.end ? e : 0;
            }
            // x4 loads take matrices (positions 0-7, piece b), (8-15, b), (0-7, b + 1), (8-15, b + 1).
            const unsigned char* k_lane = k_plane + (lane % kHeadsChunk) * kPitch + 16 * (lane / kHeadsChunk);
            const unsigned char* v_lane = v_plane + (lane % kHeadsChunk) * kPitch + 16 * (lane / kHeadsChunk);

            // S = Q·Kᵀ; entries (n, 0..1) are head a's positions p0 + 8n + 2t + e, (n, 2..3) head b's.
            float s[2][4] = {};
            if constexpr (kF16) {
                // ldmatrix of 8 positions x 8 dims gives lane (g, t) position g, dims 2t, 2t + 1.
#pragma unroll
                for (int k = 0; k < kSteps; ++k) {
                    const int position = lane % 8 + 8 * (lane / 16);
                    const int dim = 16 * k + 8 * ((lane / 8) % 2);
                    uint32_t kf[4];
                    ldmatrix_x4(kf, k_plane + position * kPitch + 2 * dim);
#pragma unroll
                    for (int n = 0; n < 2; ++n) {
                        const uint32_t b[2] = {kf[2 * n], kf[2 * n + 1]};
                        mma_exact_b(s[n], qa[k][0], qa[k][1], b);
                    }
                }
            } else {
                // Code pairs: matrix (positions 8n.., piece k) gives lane (g, t) position 8n + g,
                // dims 16k + 4t .. 4t + 3, i.e. B rows 2t, 2t + 1 and 2t + 8, 2t + 9 of step k.
#pragma unroll
                for (int k = 0; k < kSteps; k += 2) {
                    uint32_t codes[4];
                    ldmatrix_x4(codes, k_lane + 16 * k);
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int n = 0; n < 2; ++n) {
                            const uint32_t c4 = codes[2 * h + n];
                            const uint32_t b[2] = {fp8_pair_to_halves(static_cast<uint16_t>(c4)), fp8_pair_to_halves(static_cast<uint16_t>(c4 >> 16))};
                            mma_exact_b(s[n], qa[k + h][0], qa[k + h][1], b);
                        }
                }
                // Each column times its key's scale: lane j < 16 holds position j's exponent.
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float key_scale = pow2f(__shfl_sync(0xFFFFFFFFu, current, 8 * n + 2 * t + e));
                        s[n][e] *= key_scale;
                        s[n][2 + e] *= key_scale;
                    }
            }
            if (p0 + kHeadsChunk > range.end) {  // the split's last chunk, part past the end (uniform)
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (p0 + 8 * n + 2 * t + e >= range.end) s[n][e] = s[n][2 + e] = -INFINITY;
            }
            online_softmax<2, kDimTiles, true>(s, o, max_a, max_b, sum_a, sum_b);

            // O += P·V: P's C fragments are the A fragment.
            uint32_t ph[4], pl[4];
            split_fragment(s[0], s[1], ph, pl);
            if constexpr (kF16) {
#pragma unroll
                for (int pair = 0; pair < kSteps; ++pair) mma_pv_f16(o[2 * pair], o[2 * pair + 1], ph, pl, v_plane, kPitch, 16 * pair, lane);
            } else {
                // ldmatrix.trans over code pairs, then mma_fp8_values; lanes 16 + j hold the V exponents.
                const __half2 low_scales = fp8_scales(__shfl_sync(0xFFFFFFFFu, current, 16 + 2 * t), __shfl_sync(0xFFFFFFFFu, current, 17 + 2 * t));
                const __half2 high_scales = fp8_scales(__shfl_sync(0xFFFFFFFFu, current, 24 + 2 * t), __shfl_sync(0xFFFFFFFFu, current, 25 + 2 * t));
#pragma unroll
                for (int b = 0; b < kSteps; b += 2) {
                    uint32_t codes[4];
                    ldmatrix_x4_trans(codes, v_lane + 16 * b);
#pragma unroll
                    for (int h = 0; h < 2; ++h) mma_fp8_values(o[2 * (b + h)], o[2 * (b + h) + 1], ph, pl, codes[2 * h], codes[2 * h + 1], low_scales, high_scales);
                }
            }
            __syncwarp();  // every lane is done with this stage before it is refilled
        }
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");

        // The warps' states into shared memory ([warp][head][D] accumulators, then [warp][head][max, sum]),
        // folded in warp order by the thread that owns (head, dims); a warp without chunks is skipped.
        __syncthreads();  // every warp is done with its stages
        float* states = reinterpret_cast<float*>(heads_shared);
        float* ml = states + kHeadsWarps * kHeadsM * Tile::kStatePitch;
        const float total_a = quad_sum(sum_a), total_b = quad_sum(sum_b);
        if (any) {
            float* state_a = states + (warp * kHeadsM + g) * Tile::kStatePitch;
            float* state_b = state_a + 8 * Tile::kStatePitch;
            if constexpr (kF16) {
#pragma unroll
                for (int n = 0; n < kDimTiles; ++n) {  // tile n's columns 2t, 2t + 1: dims 8n + 2t, + 1
                    *reinterpret_cast<float2*>(state_a + 8 * n + 2 * t) = make_float2(o[n][0], o[n][1]);
                    *reinterpret_cast<float2*>(state_b + 8 * n + 2 * t) = make_float2(o[n][2], o[n][3]);
                }
            } else {
#pragma unroll
                for (int n = 0; n < kDimTiles; n += 2) {  // tiles n, n + 1: dims 8n + 4t + {0, 2}, {1, 3}
                    *reinterpret_cast<float4*>(state_a + 8 * n + 4 * t) = make_float4(o[n][0], o[n + 1][0], o[n][1], o[n + 1][1]);
                    *reinterpret_cast<float4*>(state_b + 8 * n + 4 * t) = make_float4(o[n][2], o[n + 1][2], o[n][3], o[n + 1][3]);
                }
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
            const float* state = states + (w * kHeadsM + fold_head) * Tile::kStatePitch;
            float part[kFoldDims];
#pragma unroll
            for (int i = 0; i < kFoldDims; i += 4) {
                const float4 v = *reinterpret_cast<const float4*>(state + fold_dim(i));
                part[i] = v.x;
                part[i + 1] = v.y;
                part[i + 2] = v.z;
                part[i + 3] = v.w;
            }
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
                *reinterpret_cast<float4*>(part_acc + at * D + fold_dim(i)) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
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
        *reinterpret_cast<float4*>(out + (static_cast<size_t>(row) * heads + h) * D + fold_dim(i)) = fold_result(a, folded_sum);
    }
}

#define TF_HEADS_ARGS                                                                                                                     \
    const float *__restrict__ q, const void *__restrict__ cache_k, const void *__restrict__ cache_v, const int8_t *__restrict__ exp_k,   \
        const int8_t *__restrict__ exp_v, const uint32_t *__restrict__ positions, const uint32_t *__restrict__ tables,                   \
        const uint32_t *__restrict__ table_offsets, const int *__restrict__ skip, float *__restrict__ out, float *__restrict__ part_acc, \
        float *__restrict__ part_ml, int rows, int heads, int kv_heads, int layers, int layer, int page_tokens
#define TF_HEADS_PASS q, cache_k, cache_v, exp_k, exp_v, positions, tables, table_offsets, skip, out, part_acc, part_ml, rows, heads, kv_heads, layers, layer, page_tokens

// Grid: (rows x kv_heads, splits or 1, ceil(group / 16)); block: 128 threads; dynamic shared
// memory HeadsTile<D, dtype>::kSharedBytes. Named by head_dim and stored dtype.
extern "C" __global__ void __launch_bounds__(32 * kHeadsWarps, 2) tf_attention_heads_128_f16(TF_HEADS_ARGS) {
    tf_wait_prior_grid(); attention_heads<128, tf::kKvF16>(TF_HEADS_PASS); }
extern "C" __global__ void __launch_bounds__(32 * kHeadsWarps, 2) tf_attention_heads_128_fp8(TF_HEADS_ARGS) {
    tf_wait_prior_grid(); attention_heads<128, tf::kKvFp8>(TF_HEADS_PASS); }
extern "C" __global__ void __launch_bounds__(32 * kHeadsWarps, 2) tf_attention_heads_64_f16(TF_HEADS_ARGS) {
    tf_wait_prior_grid(); attention_heads<64, tf::kKvF16>(TF_HEADS_PASS); }
extern "C" __global__ void __launch_bounds__(32 * kHeadsWarps, 2) tf_attention_heads_64_fp8(TF_HEADS_ARGS) {
    tf_wait_prior_grid(); attention_heads<64, tf::kKvFp8>(TF_HEADS_PASS); }
