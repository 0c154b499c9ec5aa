// MLA's attention over the latent cache, mla.cu's tf_mla_attention* entries: softmax(q·kᵀ·scale)·v
// per (row, head) over the row's positions 0..pos, or its DSA selection (selected[row·topk ..]
// [0..counts[row]], ascending) when `selected` is given: k = a cache row [latent | rope], v = its
// latent. On tensor cores, the heads as the m of the products: a block per (row, 16 heads) and
// every staged position serves the 16 heads.
//
// The block's 8 warps split the dims: warp w owns latent dims 64w .. 64w + 63, and rope dims 16w ..
// 16w + 15 for w < 4. Per 16-position tile each warp computes its part of S = Q·Kᵀ (16 heads x 16
// positions); a thread per (head, position) adds the parts in warp order and takes the online
// softmax's step for its scores (the 16 threads of a head share the tile's max by shuffles, and add
// their sums at a split's end); every warp then reads the same P and accumulates O += P·V for its
// own 64 latent dims. The f32 query and probabilities ride as f16 high and low parts (mma.cuh),
// ~2^-22 relative per product.
//
// The stored bytes go to shared memory as they are (cp.async, MlaStages::kStages tiles in flight:
// what keeps a long row's copies streaming where one tile in flight left every tile a memory
// latency), and from there into B fragments: f16 by ldmatrix; fp8 codes by ldmatrix over code pairs,
// widened in registers, a key's power-of-two scale on its column of S and a value's on its f16 pair
// (exact: kv_store.cuh); f32 by lane loads split into f16 high and low parts. fp8's K fragments
// hold dims 4t..4t+3 of a 16-dim step, so its query's A fragment takes the same dims, and its
// output tile 2b + p holds dims 16b + 2j + p of the warp's 64 (mla_out_dim). Each tile's page is
// looked up a tile ahead, so no copy waits on the page table or the selection.
//
// A row's positions (or selection) fall into kMlaSplits splits fixed by their count alone; within a
// split an online softmax in position order; the splits' partials are folded left to right, either
// in the attention block (gridDim.z == 1: a block per (row, 16 heads) running every split) or by
// tf_mla_combine after a block per split wrote them to part_acc[((row·heads + h)·splits + s)·kv_lora
// + d] and part_ml[.. ·2 + {max, sum}]: the same operations in the same order, so a row's bits do
// not depend on its batch.
#pragma once

#include "kv_store.cuh"
#include "mma.cuh"
#include "split_fold.cuh"

constexpr int kWarp = 32;
constexpr int kMlaLatent = 512;  // kv_lora_rank of every GLM MLA model; the host refuses others
constexpr int kMlaRope = 64;     // qk_rope_head_dim likewise
constexpr int kMlaWidth = kMlaLatent + kMlaRope;
constexpr int kMlaHeads = 16;  // heads per block: the m of the tensor-core products
constexpr int kMlaWarps = 8;
constexpr int kMlaThreads = kWarp * kMlaWarps;
constexpr int kMlaTile = 16;  // positions per staged tile: one k step of P·V
constexpr int kMlaWarpDims = kMlaLatent / kMlaWarps;
constexpr int kMlaLatentSteps = kMlaWarpDims / 16;  // a warp's k steps of Q·Kᵀ over the latent
constexpr int kMlaRopeWarps = kMlaRope / 16;        // the warps with a rope step after those
constexpr int kMlaWarpSteps = kMlaLatentSteps + 1;
constexpr int kMlaWarpTiles = kMlaWarpDims / 8;  // a warp's n tiles of P·V
// 64 splits: a decode step's one row runs heads/16 x 64 blocks (GLM-4.7-Flash: 128) on 132 SMs.
constexpr int kMlaSplits = 64;
static_assert(kMlaHeads * kMlaTile == kMlaThreads, "a thread per (head, position) of a tile");
static_assert(kMlaRopeWarps <= kMlaWarps && kMlaRope % 16 == 0, "a rope step for each of the first warps");
static_assert(kMlaLatent % (16 * kMlaWarps) == 0, "the warps split the dims evenly");

// Dynamic shared memory: kStages tiles of 16 rows as stored, then the softmax's. A row is padded so
// that 8 rows' 16-byte pieces land in distinct banks (ldmatrix); f32 rows, read 8 bytes per lane,
// by 32 so that a half warp's S loads do. An iteration takes kStep tiles (two: the latency of a
// tile's chain of syncs, shuffles and products then serves 32 positions) while the next kStep are
// in flight (fp8's half-size rows: four); f32's tile is twice f16's, so it steps one tile at a
// time with one in flight. The softmax's: the warps' parts of S (16 heads x 16·kStep positions,
// rows padded by 8 floats: a half warp's pair stores land in distinct banks), P's f16 high and low
// parts (the same shape each, in the floats of one: ldmatrix's 8 rows in distinct banks), per head
// the tile's rescale and a split's (max, sum). All under sm_12x's 99 KB.
template <int kDtype>
struct MlaStages {
    static constexpr int kRowBytes = kMlaWidth * (kDtype == tf::kKvF32 ? 4 : kDtype == tf::kKvF16 ? 2 : 1);
    static constexpr int kPitch = kRowBytes + (kDtype == tf::kKvF32 ? 32 : 16);
    static constexpr int kPieces = kRowBytes / 16;  // 16-byte copies per row
    static constexpr int kStageBytes = kMlaTile * kPitch;
    static constexpr int kStages = kDtype == tf::kKvF32 ? 2 : kDtype == tf::kKvF16 ? 4 : 6;
    static constexpr int kStep = kDtype == tf::kKvF32 ? 1 : 2;
    static constexpr int kScorePitch = kMlaTile * kStep + 8;
    static constexpr int kScoreFloats = kMlaHeads * kScorePitch;
    static constexpr int kSharedBytes = kStages * kStageBytes + ((kMlaWarps + 1) * kScoreFloats + 4 * kMlaHeads) * 4;
    static_assert(kStages >= 2 * kStep, "an iteration's tiles and the next ones in flight");
};
// The launch's sizes: attentionSharedBytes in mla_kernels.zig.
static_assert(MlaStages<tf::kKvF32>::kSharedBytes == 88832, "attentionSharedBytes(.f32)");
static_assert(MlaStages<tf::kKvF16>::kSharedBytes == 98048, "attentionSharedBytes(.f16)");
static_assert(MlaStages<tf::kKvFp8>::kSharedBytes == 80128, "attentionSharedBytes(.fp8)");

// The latent dim of a warp's output tile n, column 2t + e (fp8's tiles interleave, as its V
// fragments pair the codes).
template <int kDtype>
__device__ __forceinline__ int mla_out_dim(int warp, int t, int n, int e) {
    return kMlaWarpDims * warp + (kDtype == tf::kKvFp8 ? 16 * (n / 2) + 4 * t + n % 2 + 2 * e : 8 * n + 2 * t + e);
}

template <int kDtype>
__device__ __forceinline__ void mla_store_pair(float* p, float x, float y) {
    if constexpr (kDtype == tf::kKvFp8) {
        p[0] = x;
        p[2] = y;
    } else {
        *reinterpret_cast<float2*>(p) = make_float2(x, y);
    }
}

template <bool kSpread, int kDtype>
__device__ __forceinline__ void mla_attention(const float* __restrict__ q, const float* __restrict__ q_lat, const void* __restrict__ cache,
                                              const int8_t* __restrict__ exps, const uint32_t* __restrict__ positions, const uint32_t* __restrict__ tables,
                                              const uint32_t* __restrict__ table_offsets, const uint32_t* __restrict__ selected,
                                              const uint32_t* __restrict__ counts, int topk, float* __restrict__ out,
                                              float* __restrict__ part_acc, float* __restrict__ part_ml, int rows, int heads, int qk_dim,
                                              int nope_dim, float scale, int layers, int layer, int page_tokens, int pack) {
    using namespace tf;
    using Stages = MlaStages<kDtype>;
    constexpr bool kF32 = kDtype == kKvF32, kFp8 = kDtype == kKvFp8;
    constexpr int kStages = Stages::kStages;
    constexpr int kPitch = Stages::kPitch;
    constexpr int kStep = Stages::kStep;
    constexpr int kAhead = kStages - kStep;  // tiles in flight as an iteration starts
    constexpr int kScorePitch = Stages::kScorePitch;
    constexpr int kScoreFloats = Stages::kScoreFloats;
    extern __shared__ __align__(16) unsigned char mla_shared[];
    // parts[w·kScoreFloats + head·kScorePitch + position]: warp w's part of S; P's halves likewise;
    // then per head the tile's rescale and the split's (max, sum).
    float* parts = reinterpret_cast<float*>(mla_shared + kStages * Stages::kStageBytes);
    // P split once into f16 high and low parts (split_pair's values), the products' A fragments by
    // ldmatrix, where every warp split all of P itself.
    half* probs_high = reinterpret_cast<half*>(parts + kMlaWarps * kScoreFloats);
    half* probs_low = probs_high + kScoreFloats;
    float* rescales = parts + (kMlaWarps + 1) * kScoreFloats;
    float2* split_ml = reinterpret_cast<float2*>(rescales + 2 * kMlaHeads);
    const auto stage = [&](int c) { return mla_shared + (c % kStages) * Stages::kStageBytes; };
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    // The block's 16 mma rows ("slots"): 16 heads of one row; or, packed (whole blocks, pack > 1,
    // the grid's last head group: heads past the last whole 16, GLM-4.7-Flash's 20 left 4 heads in
    // a block of 16 slots), `pack` rows x 16 / pack heads, the rows sharing their tiles. Whole
    // blocks run a row's every split, the last rows first: a prompt's later rows have the longer
    // contexts, so the short ones fill the grid's last wave.
    const bool packed = !kSpread && pack > 1 && blockIdx.y + 1 == gridDim.y;
    const int index = kSpread ? static_cast<int>(blockIdx.x) : rows - 1 - static_cast<int>(blockIdx.x);  // the block's row
    if (index < 0 || index >= rows) return;
    const int slot_heads = packed ? kMlaHeads / pack : kMlaHeads;
    const int row0 = packed ? index / pack * pack : index;
    // Packed rows share their tiles where they are one sequence's positions in one 16-position
    // tile (the same tiles, splits and pages: only the last tile's mask differs), and the group's
    // first row's block runs them all; else each row's block runs its own slots.
    bool together = true;
    if (packed)
        for (int i = 1; i < pack; ++i) {
            const int r = row0 + i;
            together = together && r < rows && table_offsets[r] == table_offsets[row0] && positions[r] / kMlaTile == positions[row0] / kMlaTile;
        }
    if (packed && together && index != row0) return;
    const int row = together ? row0 : index;  // whose table and tiles the block runs
    const int head_base = packed ? heads / kMlaHeads * kMlaHeads : static_cast<int>(blockIdx.y) * kMlaHeads;
    const auto slot_row = [&](int m) { return packed ? row0 + m / slot_heads : row0; };
    const auto slot_head = [&](int m) { return head_base + (packed ? m % slot_heads : m); };
    const int head_a = slot_head(g), head_b = slot_head(g + 8);  // this lane's two mma rows
    const int row_a = slot_row(g), row_b = slot_row(g + 8);
    const int row_h = slot_row(threadIdx.x / kMlaTile);  // the softmax's slot
    const bool sparse = selected != nullptr;
    const int split_first = kSpread ? blockIdx.z : 0;
    const int split_end = kSpread ? blockIdx.z + 1 : kMlaSplits;
    const unsigned char* stored = static_cast<const unsigned char*>(cache);
    int count = sparse ? static_cast<int>(counts[row]) : static_cast<int>(positions[row]) + 1;
    if (packed)
        if (together)
            for (int i = 1; i < pack; ++i) count = max(count, static_cast<int>(positions[row0 + i]) + 1);
    // A slot runs in this block: its head exists and, packed, its row is the block's (or together).
    const auto live = [&](int m) {
        if (slot_head(m) >= heads) return false;
        if (packed) return slot_row(m) < rows && (together || slot_row(m) == row);
        return true;
    };
    const bool live_a = live(g), live_b = live(g + 8);
    // The softmax slot's own count (its row's last position masks the shared last tile).
    const int count_h = packed && live(threadIdx.x / kMlaTile) ? static_cast<int>(positions[row_h]) + 1 : count;
    const uint32_t* picks = sparse ? selected + static_cast<size_t>(row) * topk : nullptr;
    if (count == 0) {  // an empty pooled selection (no tail): transformers' SDPA attends to nothing, 0
        if (!kSpread)
            for (int i = threadIdx.x; i < kMlaHeads * kMlaLatent; i += blockDim.x) {
                const int h = blockIdx.y * kMlaHeads + i / kMlaLatent;
                if (h < heads) out[(static_cast<size_t>(row) * heads + h) * kMlaLatent + i % kMlaLatent] = 0.f;
            }
        return;
    }
    if (split_range<kMlaTile, kMlaSplits>(count, split_first).begin >= count) return;  // an empty split: the combine skips it
    const uint32_t* table = tables + table_offsets[row];

    // The query, scaled, as A fragments of this warp's steps: steps 0..3 its latent dims 64w + 16k ..,
    // step 4 its rope dims (w < 4); register r holds head g (r even) or g + 8 (r odd) at dims
    // +2t (+8 for r >= 2), fp8 +4t (+2 for r >= 2).
    uint32_t qa[kMlaWarpSteps][2][4];
#pragma unroll
    for (int k = 0; k < kMlaWarpSteps; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            if (k == kMlaLatentSteps && warp >= kMlaRopeWarps) break;
            const int h = r % 2 == 0 ? head_a : head_b;
            const int q_row = r % 2 == 0 ? row_a : row_b;
            const int dim = (k < kMlaLatentSteps ? kMlaWarpDims * warp + 16 * k : 16 * warp) + (kFp8 ? 4 * t + 2 * (r / 2) : 2 * t + 8 * (r / 2));
            float2 v = make_float2(0.f, 0.f);
            if ((r % 2 == 0 ? live_a : live_b) && (k < kMlaLatentSteps || qk_dim > nope_dim))  // NoPE: no rope part
                v = k < kMlaLatentSteps ? *reinterpret_cast<const float2*>(q_lat + (static_cast<size_t>(q_row) * heads + h) * kMlaLatent + dim)
                                          : *reinterpret_cast<const float2*>(q + (static_cast<size_t>(q_row) * heads + h) * qk_dim + nope_dim + dim);
            split_pair(v.x * scale, v.y * scale, qa[k][0][r], qa[k][1][r]);
        }

    // Whole: the splits fold in registers (o's tiles, a second time). Folding into `out` itself
    // cost a global read and write per split, which prompt rows of at most 1024 positions (a tile
    // per split) paid per tile.
    float folded_max_a = -INFINITY, folded_max_b = -INFINITY, folded_sum_a = 0.f, folded_sum_b = 0.f;
    float fold[kMlaWarpTiles][4];
#pragma unroll
    for (int n = 0; n < kMlaWarpTiles; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) fold[n][i] = 0.f;  // zeros, as the combine starts
    float* out_a = out + (static_cast<size_t>(row_a) * heads + head_a) * kMlaLatent;
    float* out_b = out + (static_cast<size_t>(row_b) * heads + head_b) * kMlaLatent;
    // The row's tiles in one stream through the ring of stages, across its splits: a prompt row of
    // at most 1024 positions has splits of one tile, and a ring refilled at each split left every
    // tile a memory latency (a GLM-4.7-Flash prompt chunk spent 39% of its time here). A split is
    // `per` whole tiles, so a tile never straddles two; an iteration takes its split's next kStep
    // tiles or fewer.
    const int tiles = (count + kMlaTile - 1) / kMlaTile;
    const int per = (tiles + kMlaSplits - 1) / kMlaSplits;  // split_range's
    const int tile_begin = split_first * per;
    const int tile_end = min(split_end * per, tiles);
    // Lane l's cache element (row of the pool) of position l % 16 of tile c, in two steps a tile's
    // issue takes for later tiles: the table entry of its page (a load; a DSA pick before it, a
    // load too) kLook tiles ahead, the element one ahead. The entry's load then has an
    // iteration's work behind it: the element's multiply waiting on it, where one step took
    // both, was 11% of the one-row 32k attention's stall samples (ncu, docs/measurements.md); the
    // picks too, four tiles ahead, spilled the two-block form's 128 registers. 32 bits: a pool of
    // 2^32 rows would be terabytes.
    const PageIndex pages(page_tokens);
    struct Lookup {
        uint32_t entry;
        int offset;  // -1: past the count (element 0, a zero copy)
    };
    const auto lookup = [&](int c) -> Lookup {
        const int j = kMlaTile * c + lane % kMlaTile;
        if (c >= tile_end || j >= count) return {0u, -1};
        const int p = sparse ? static_cast<int>(picks[j]) : j;
        const int page = pages.page(p);
        return {table[page], pages.offset(p, page)};
    };
    const auto element_of = [&](Lookup l) -> uint32_t {
        if (l.offset < 0) return 0;
        return (l.entry * static_cast<uint32_t>(layers) + static_cast<uint32_t>(layer)) * static_cast<uint32_t>(page_tokens) + static_cast<uint32_t>(l.offset);
    };
    // Before issue(c): next_element is tile c's, ahead[i] tile c + 1 + i's lookup. fp8 looks up
    // each tile as the one before it issues (kLook 0): its exponents of the tiles in flight take
    // the registers (128 in the two-block form) the lookups ahead would need.
    constexpr int kLook = kFp8 ? 0 : 2;
    Lookup ahead[kLook > 0 ? kLook : 1];
    uint32_t next_element;
    {
        const Lookup now = lookup(tile_begin);
#pragma unroll
        for (int i = 0; i < kLook; ++i) ahead[i] = lookup(tile_begin + 1 + i);
        next_element = element_of(now);
    }
    // fp8: the exponents of the tiles in flight, oldest first (constant indices: registers); lane l
    // holds position l % 16's.
    int tile_exps[kAhead] = {};
    // Tile c into its stage: warp w copies rows 2w and 2w + 1, lane l their pieces l, l + 32, ..., so
    // a row's address is one shuffle and each copy an add (a task per thread, its row shuffled and
    // its shared address converted per copy, cost ~170 instructions a tile). A tile past the
    // block's last is not copied: an empty group keeps the count, and the tile is neither scored nor read.
    static_assert(kMlaTile == 2 * kMlaWarps, "two rows of a tile per warp");
    constexpr int kLanePieces = (Stages::kPieces + kWarp - 1) / kWarp;
    const uint32_t lane_shared = shared_address(mla_shared) + 2 * warp * kPitch + 16 * lane;
    const auto issue = [&](int c, int slot) {
        const int t0 = kMlaTile * c;
        if (c >= tile_end) {
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            return;
        }
        const uint32_t to = lane_shared + (c % kStages) * Stages::kStageBytes;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int j = 2 * warp + r;
            const uint32_t element = __shfl_sync(0xFFFFFFFFu, next_element, j);
            const unsigned char* from = stored + static_cast<size_t>(element) * Stages::kRowBytes + 16 * lane;
            const int bytes = t0 + j < count ? 16 : 0;  // 0: zeros past the count
#pragma unroll
            for (int i = 0; i < kLanePieces; ++i)
                if (kWarp * i + lane < Stages::kPieces) copy16_async_to(to + r * kPitch + 16 * kWarp * i, from + 16 * kWarp * i, bytes);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        if constexpr (kFp8) tile_exps[slot] = t0 + lane % kMlaTile < count ? exps[next_element] : 0;
        if constexpr (kLook == 0) {
            next_element = element_of(lookup(c + 1));
        } else {
            next_element = element_of(ahead[0]);
#pragma unroll
            for (int i = 0; i + 1 < kLook; ++i) ahead[i] = ahead[i + 1];
            ahead[kLook - 1] = lookup(c + 1 + kLook);
        }
    };
#pragma unroll
    for (int c = 0; c < kAhead; ++c) issue(tile_begin + c, c);
    // As many tiles issued as an iteration at tile c takes (so kAhead stay in flight), each into the
    // slot its exponent's ring frees (the last iteration's tiles, read by no warp past the
    // iteration's first barrier). Behind the products of S, not before them: a warp issues in
    // order, so the copies' addresses and page lookups (~65 instructions a tile) then run while its
    // products drain, where before them they held the products back (one 32k row 2.5% faster,
    // a prompt chunk 2-5%). The split forms over fp8 issue first: their exponents in flight leave
    // no registers for S beside them (the two-block form spilled).
    constexpr bool kIssueLate = !kFp8 || !kSpread;
    const auto issue_next = [&](int c, int step) {
#pragma unroll
        for (int u = 0; u < kStep; ++u) {
            if (u >= step) break;
#pragma unroll
            for (int i = 0; i + 1 < kAhead; ++i) tile_exps[i] = tile_exps[i + 1];
            issue(c + kAhead + u, kAhead - 1);
        }
    };
    // Step k of this warp's part of S for one tile, in two halves: load_k takes the step's K
    // fragment from the tile's stage as stored into frags[k], score_k the step's products from the
    // tile's frags into its chains (the query's high parts' in s, the low parts' in s_low: two
    // chains where one would wait on the other). f16: ldmatrix of 8 positions x 8 dims gives lane (g, t) position g, dims 2t, 2t + 1.
    // fp8, code pairs: matrix (positions 8n.., piece b) gives lane (g, t) position 8n + g, dims 16b
    // + 4t .. 4t + 3, i.e. B rows 2t, 2t + 1 and 2t + 8, 2t + 9 of that step; one ldmatrix serves
    // steps k and k + 1 (an even k loads; the rope step's load also takes the next piece, or the
    // row's padding). f32: lane (g, t) positions g and 8 + g at dims 2t, 2t + 1 and 2t + 8, 2t + 9,
    // split into f16 parts at the products.
    constexpr int kFragWords = kF32 ? 8 : 4;
    const auto load_k = [&](const unsigned char* tile, int k, uint32_t (&frag)[kFragWords]) {
        const int base = k < kMlaLatentSteps ? kMlaWarpDims * warp + 16 * k : kMlaLatent + 16 * warp;
        if constexpr (kFp8) {
            if (k % 2 != 0) return;
            const unsigned char* lane_row = tile + (lane % kMlaTile) * kPitch + 16 * (lane / kMlaTile);
            const int piece = k < kMlaLatentSteps ? kMlaLatentSteps * warp + k : kMlaLatent / 16 + warp;
            ldmatrix_x4(frag, lane_row + 16 * piece);
        } else if constexpr (kF32) {
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const float* at = reinterpret_cast<const float*>(tile + (8 * n + g) * kPitch) + base + 2 * t;
                const float2 low = *reinterpret_cast<const float2*>(at);
                const float2 high = *reinterpret_cast<const float2*>(at + 8);
                frag[4 * n] = __float_as_uint(low.x);
                frag[4 * n + 1] = __float_as_uint(low.y);
                frag[4 * n + 2] = __float_as_uint(high.x);
                frag[4 * n + 3] = __float_as_uint(high.y);
            }
        } else {
            const int position = lane % 8 + 8 * (lane / 16);
            ldmatrix_x4(frag, tile + position * kPitch + 2 * (base + 8 * ((lane / 8) % 2)));
        }
    };
    const auto score_k = [&](float (&st)[2][4], float (&st_low)[2][4], int k, const uint32_t (&frags)[kMlaWarpSteps][kFragWords]) {
        const uint32_t(&frag)[kFragWords] = frags[kFp8 ? k & ~1 : k];  // fp8: the pair's even step holds it
#pragma unroll
        for (int n = 0; n < 2; ++n) {
            if constexpr (kFp8) {
                const uint32_t c4 = frag[2 * (k % 2) + n];
                const uint32_t b[2] = {fp8_pair_to_halves(static_cast<uint16_t>(c4)), fp8_pair_to_halves(static_cast<uint16_t>(c4 >> 16))};
                mma_16816(st[n], qa[k][0], b);
                mma_16816(st_low[n], qa[k][1], b);
            } else if constexpr (kF32) {
                uint32_t bh[2], bl[2];
                split_pair(__uint_as_float(frag[4 * n]), __uint_as_float(frag[4 * n + 1]), bh[0], bl[0]);
                split_pair(__uint_as_float(frag[4 * n + 2]), __uint_as_float(frag[4 * n + 3]), bh[1], bl[1]);
                mma_16816(st[n], qa[k][0], bh);
                mma_16816(st[n], qa[k][0], bl);
                mma_16816(st_low[n], qa[k][1], bh);
            } else {
                const uint32_t b[2] = {frag[2 * n], frag[2 * n + 1]};
                mma_16816(st[n], qa[k][0], b);
                mma_16816(st_low[n], qa[k][1], b);
            }
        }
    };
    for (int split = split_first, c = tile_begin; c < tile_end; ++split) {
        const int split_tiles_end = min((split + 1) * per, tile_end);
        const int range_end = min(kMlaTile * split_tiles_end, count);  // split_range's end

        float o[kMlaWarpTiles][4];
#pragma unroll
        for (int n = 0; n < kMlaWarpTiles; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) o[n][i] = 0.f;
        // The softmax's state of head threadIdx.x / 16: its running max (each of its 16 threads holds
        // it) and this thread's part of the running sum (added across the 16 at the split's end).
        float run_max = -INFINITY, run_sum = 0.f;
        for (; c < split_tiles_end;) {
            const int t0 = kMlaTile * c;
            const int step = min(kStep, split_tiles_end - c);  // this iteration's tiles
            int current[kStep];  // fp8: the iteration's tiles' exponents
#pragma unroll
            for (int u = 0; u < kStep; ++u) current[u] = tile_exps[u];
            asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2 * kStep) : "memory");
            __syncthreads();  // tiles c.. have landed, and every warp is done with the last iteration's
            if constexpr (!kIssueLate) issue_next(c, step);
            // This warp's part of S over its steps, per tile (load_k, score_k).
            float s[kStep][2][4] = {}, s_low[kStep][2][4] = {};
            // The whole form (a prompt's rows): every K fragment of the iteration first, then the
            // products step-major, where each step's products waited on its own loads (a chunk of
            // 1024 rows at 32k 9% faster over f16, 7% over fp8, 4% over f32; the split forms were
            // level or slower, and their two-block entries spilled). A tile past the split is
            // scored too, on stale bytes (the softmax masks its scores): no branch among the loads.
            // Either way the same products into the same chains in the same order.
            if constexpr (!kSpread) {
                uint32_t frags[kStep][kMlaWarpSteps][kFragWords];
#pragma unroll
                for (int u = 0; u < kStep; ++u)
#pragma unroll
                    for (int k = 0; k < kMlaWarpSteps; ++k) {
                        if (k == kMlaLatentSteps && warp >= kMlaRopeWarps) break;
                        load_k(stage(c + u), k, frags[u][k]);
                    }
#pragma unroll
                for (int k = 0; k < kMlaWarpSteps; ++k) {
                    if (k == kMlaLatentSteps && warp >= kMlaRopeWarps) break;
#pragma unroll
                    for (int u = 0; u < kStep; ++u) score_k(s[u], s_low[u], k, frags[u]);
                }
            } else {
#pragma unroll
                for (int u = 0; u < kStep; ++u) {
                    if (t0 + kMlaTile * u >= range_end) break;
                    uint32_t frags[kMlaWarpSteps][kFragWords];
#pragma unroll
                    for (int k = 0; k < kMlaWarpSteps; ++k) {
                        if (k == kMlaLatentSteps && warp >= kMlaRopeWarps) break;
                        load_k(stage(c + u), k, frags[k]);
                        score_k(s[u], s_low[u], k, frags);
                    }
                }
            }
            if constexpr (kIssueLate) issue_next(c, step);
            // Entries (n, 0..1) of tile u are head g's positions 16u + 8n + 2t + e, (n, 2..3) head g + 8's.
            float* mine = parts + warp * kScoreFloats;
#pragma unroll
            for (int u = 0; u < kStep; ++u)
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    const int at = kMlaTile * u + 8 * n + 2 * t;
                    *reinterpret_cast<float2*>(mine + g * kScorePitch + at) = make_float2(s[u][n][0] + s_low[u][n][0], s[u][n][1] + s_low[u][n][1]);
                    *reinterpret_cast<float2*>(mine + (g + 8) * kScorePitch + at) = make_float2(s[u][n][2] + s_low[u][n][2], s[u][n][3] + s_low[u][n][3]);
                }
            __syncthreads();
            // The online softmax, once per score (each warp running it on the whole tile did 8x the
            // work): thread 16h + p adds the warps' parts of head h, positions 16u + p, in warp
            // order; fp8 scales them by their keys' powers of two (lane p % 16 holds those); the 16
            // threads of a head share its tile max by shuffles.
            {
                const int h = threadIdx.x / kMlaTile, p = threadIdx.x % kMlaTile;
                float score[kStep];
                float tile_max = -INFINITY;
#pragma unroll
                for (int u = 0; u < kStep; ++u) {
                    const int at = h * kScorePitch + kMlaTile * u + p;
                    score[u] = parts[at];
#pragma unroll
                    for (int w = 1; w < kMlaWarps; ++w) score[u] += parts[w * kScoreFloats + at];
                    if constexpr (kFp8) score[u] *= pow2f(current[u]);
                    // Past the split (an iteration of fewer tiles) or past the slot's row.
                    if (u >= step || t0 + kMlaTile * u + p >= count_h) score[u] = -INFINITY;
                    tile_max = fmaxf(tile_max, score[u]);
                }
#pragma unroll
                for (int offset = kMlaTile / 2; offset > 0; offset /= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, offset));
                const float next = fmaxf(run_max, tile_max);
                const float rescale = expf(run_max - next);  // 0 on the first tile, 1 where nothing is new
                run_sum *= rescale;
#pragma unroll
                for (int u = 0; u < kStep; ++u) {
                    const float prob = expf(score[u] - next);
                    run_sum += prob;
                    half high, low;
                    split_half(prob, high, low);
                    probs_high[h * kScorePitch + kMlaTile * u + p] = high;
                    probs_low[h * kScorePitch + kMlaTile * u + p] = low;
                }
                run_max = next;
                if (p == 0) rescales[h] = rescale;
            }
            __syncthreads();
            // O·rescale + P·V, a step of 16 positions per tile: P as the A fragment, split in f16 parts.
            const float rescale_a = rescales[g], rescale_b = rescales[g + 8];
            if (__any_sync(0xFFFFFFFFu, rescale_a != 1.f || rescale_b != 1.f)) {  // once the max settles, a rescale by 1 changes no bit
#pragma unroll
                for (int n = 0; n < kMlaWarpTiles; ++n) {
                    o[n][0] *= rescale_a;
                    o[n][1] *= rescale_a;
                    o[n][2] *= rescale_b;
                    o[n][3] *= rescale_b;
                }
            }
#pragma unroll
            for (int u = 0; u < kStep; ++u) {
                if (t0 + kMlaTile * u >= range_end) break;
                const unsigned char* tile = stage(c + u);
                // Register r: head g (r even) or g + 8, positions 2t, 2t + 1 (+8 for r >= 2).
                uint32_t ph[4], pl[4];
                const int p_at = (lane % 8 + 8 * ((lane / 8) % 2)) * kScorePitch + kMlaTile * u + 8 * (lane / 16);
                ldmatrix_x4(ph, probs_high + p_at);
                ldmatrix_x4(pl, probs_low + p_at);
                if constexpr (kFp8) {
                    // ldmatrix.trans over code pairs, then mma_fp8_values with the positions' scales.
                    const unsigned char* lane_row = tile + (lane % kMlaTile) * kPitch + 16 * (lane / kMlaTile);
                    const int e = current[u];
                    const __half2 low_scales = fp8_scales(__shfl_sync(0xFFFFFFFFu, e, 2 * t), __shfl_sync(0xFFFFFFFFu, e, 2 * t + 1));
                    const __half2 high_scales = fp8_scales(__shfl_sync(0xFFFFFFFFu, e, 2 * t + 8), __shfl_sync(0xFFFFFFFFu, e, 2 * t + 9));
#pragma unroll
                    for (int b = 0; b < kMlaLatentSteps; b += 2) {
                        uint32_t codes[4];
                        ldmatrix_x4_trans(codes, lane_row + 16 * (kMlaLatentSteps * warp + b));
#pragma unroll
                        for (int h = 0; h < 2; ++h) mma_fp8_values(o[2 * (b + h)], o[2 * (b + h) + 1], ph, pl, codes[2 * h], codes[2 * h + 1], low_scales, high_scales);
                    }
                } else if constexpr (kF32) {
                    // Lane (g, t): dim 8n + g at positions 2t, 2t + 1 and 2t + 8, 2t + 9.
                    const float* column = reinterpret_cast<const float*>(tile) + kMlaWarpDims * warp + g;
                    constexpr int kRow = kPitch / 4;
#pragma unroll
                    for (int n = 0; n < kMlaWarpTiles; ++n) {
                        const float* at = column + 8 * n + 2 * t * kRow;
                        uint32_t bh[2], bl[2];
                        split_pair(at[0], at[kRow], bh[0], bl[0]);
                        split_pair(at[8 * kRow], at[9 * kRow], bh[1], bl[1]);
                        mma_16816(o[n], ph, bh);
                        mma_16816(o[n], ph, bl);
                        mma_16816(o[n], pl, bh);
                    }
                } else {
#pragma unroll
                    for (int pair = 0; pair < kMlaWarpTiles / 2; ++pair)
                        mma_pv_f16(o[2 * pair], o[2 * pair + 1], ph, pl, tile, kPitch, kMlaWarpDims * warp + 16 * pair, lane);
                }
            }
            c += step;
        }
#pragma unroll
        for (int offset = kMlaTile / 2; offset > 0; offset /= 2) run_sum += __shfl_xor_sync(0xFFFFFFFFu, run_sum, offset);
        if (threadIdx.x % kMlaTile == 0) split_ml[threadIdx.x / kMlaTile] = make_float2(run_max, run_sum);
        __syncthreads();  // the split's (max, sum) are out
        const float2 ml_a = split_ml[g], ml_b = split_ml[g + 8];
        const float max_a = ml_a.x, total_a = ml_a.y, max_b = ml_b.x, total_b = ml_b.y;
        if constexpr (kSpread) {
            const size_t at_a = (static_cast<size_t>(row) * heads + head_a) * kMlaSplits + split;
            const size_t at_b = (static_cast<size_t>(row) * heads + head_b) * kMlaSplits + split;
#pragma unroll
            for (int n = 0; n < kMlaWarpTiles; ++n) {
                const int dim = mla_out_dim<kDtype>(warp, t, n, 0);
                if (live_a) mla_store_pair<kDtype>(part_acc + at_a * kMlaLatent + dim, o[n][0], o[n][1]);
                if (live_b) mla_store_pair<kDtype>(part_acc + at_b * kMlaLatent + dim, o[n][2], o[n][3]);
            }
            if (warp == 0 && t == 0) {
                if (live_a) *reinterpret_cast<float2*>(part_ml + 2 * at_a) = make_float2(max_a, total_a);
                if (live_b) *reinterpret_cast<float2*>(part_ml + 2 * at_b) = make_float2(max_b, total_b);
            }
        } else {
            const float next_a = fmaxf(folded_max_a, max_a), next_b = fmaxf(folded_max_b, max_b);
            const float xa = expf(folded_max_a - next_a), ya = expf(max_a - next_a);  // x: 0 on the first split
            const float xb = expf(folded_max_b - next_b), yb = expf(max_b - next_b);
            folded_sum_a = __fadd_rn(__fmul_rn(folded_sum_a, xa), __fmul_rn(total_a, ya));
            folded_sum_b = __fadd_rn(__fmul_rn(folded_sum_b, xb), __fmul_rn(total_b, yb));
#pragma unroll
            for (int n = 0; n < kMlaWarpTiles; ++n) {
                fold[n][0] = __fadd_rn(__fmul_rn(fold[n][0], xa), __fmul_rn(o[n][0], ya));
                fold[n][1] = __fadd_rn(__fmul_rn(fold[n][1], xa), __fmul_rn(o[n][1], ya));
                fold[n][2] = __fadd_rn(__fmul_rn(fold[n][2], xb), __fmul_rn(o[n][2], yb));
                fold[n][3] = __fadd_rn(__fmul_rn(fold[n][3], xb), __fmul_rn(o[n][3], yb));
            }
            folded_max_a = next_a;
            folded_max_b = next_b;
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // the empty groups past the last tile
    if constexpr (!kSpread) {
#pragma unroll
        for (int n = 0; n < kMlaWarpTiles; ++n) {
            const int dim = mla_out_dim<kDtype>(warp, t, n, 0);
            if (live_a) mla_store_pair<kDtype>(out_a + dim, __fdiv_rn(fold[n][0], folded_sum_a), __fdiv_rn(fold[n][1], folded_sum_a));
            if (live_b) mla_store_pair<kDtype>(out_b + dim, __fdiv_rn(fold[n][2], folded_sum_b), __fdiv_rn(fold[n][3], folded_sum_b));
        }
    }
}
