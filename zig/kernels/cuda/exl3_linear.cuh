// The EXL3 linears of glm_forward.cu's module: the trellis GEMV launches (one item a block,
// several parts on the same rows, groups of one layer's items) and the sort that groups items by
// layer. Included once, by glm_forward.cu, after the helpers it uses.
#pragma once

// ---- EXL3 linear: rotate in, trellis matmul, rotate out (EXL3.md §8.2) ----
// Items are independent 1-row problems with their own layer (pointer tables), so one set of kernels
// serves plain layers (every item the same layer) and grouped experts (each (row, expert) an item).

struct Exl3Layer {
    const uint16_t* words;  // (k_p/16, n_p/16, 8·bits2)
    const uint16_t* suh;    // (k_p) fp16
    const uint16_t* svh;    // (n_p) fp16
    const float* bias;      // (n) or null
};

// y[item] = H128(H128(x[row] ⊙ suh) · Wq) ⊙ svh + bias, trimmed to out_features, in one launch.
// Item i reads source row `source_rows[i]` (or i % group_items) and layer `layer_of_item[i]` (or
// i / group_items): plain layers, a pair of layers on the same rows (gate and up), and grouped
// experts through pointer tables. With `up`, the input is silu(x) · up (SwiGLU), fused here.
//
// One 256-thread block per (128 output columns, k split, item) — or, on the grouped path, per
// (128 columns, k split, group of up to 16 items of one layer), so that a decoded tile serves all
// of them. The block first rotates its split's input channels (512, or 256 or 128 for a small
// weight) of each of its items into shared memory as fp16 high/low planes (128-chunks, a warp
// each), then each warp runs the trellis GEMV of one 16-column tile column over the split's tile
// rows on tensor cores (exl3_gemv.cuh) and
// writes each item's partial sums. The last block of a (key, 128 columns) to finish, told by a
// counter, sums the splits' partials in ascending split order (so the result does not depend on
// which block came last), applies the output Hadamard, svh and bias, and resets the counter for the
// next launch.
//
// Every item's arithmetic is the same on both paths and for any grouping: a row's bits depend on
// the shape alone, never on its batch.
constexpr int kLinearWarps = 8;
constexpr int kSplitChannels = 512;  // the longest split, 32 tile rows: gemv_splits.zig
constexpr int kGroupRows = 16;

struct LinearArgs {
    const float* x;
    const float* up;
    const int* source_rows;
    int group_items;
    float* partial;
    float* y;
    int items;
    int in_features;
    int out_features;
    int k_p;
    int n_p;
    int bits2;
    int codebook;
    int split_tiles;  // tile rows per k split: 32, or 16 or 8 for a small weight (gemv_splits.zig)
};

// The rotated inputs of a block's split, as fp16 high/low planes for the GEMV's ldmatrix (rows
// 1040 bytes apart, 16 past a multiple of 128: the 8 rows of an ldmatrix phase fall in distinct
// banks).
constexpr int kPlanePitch = kSplitChannels + 8;
template <int R>
struct LinearInputs {
    __align__(16) half hi[R][kPlanePitch];
    __align__(16) half lo[R][kPlanePitch];
};

// One block's work for `rows` items (item_sh[0..rows)) of `layer`: 128 columns `chunk`, k split
// `split` of `splits`; counters[counter_at] counts the splits of its (items, chunk) done (the
// pointer formed after the GEMV: kept live across it, it cost the item kernel a spill at 40
// registers). With `rows_sh`, the count is read again from shared memory after the GEMV, for the
// same reason (the shared-item kernel's run length, 8 bytes spilled at 40 registers otherwise).
template <int R>
__device__ __forceinline__ void linear_block(const LinearArgs& a, const Exl3Layer& layer, const int* item_sh, int rows,
                                             unsigned int* __restrict__ counters, int counter_at, LinearInputs<R>& xs, int chunk, int split, int splits,
                                             const int* rows_sh = nullptr) {
    __shared__ bool last_block;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int first = split * a.split_tiles;
    const int last = min(a.k_p / 16, first + a.split_tiles);
    const int chunks = (last - first) * 16 / kHadamard;

    for (int task = warp; task < rows * chunks; task += kLinearWarps) {
        const int r = task / chunks;
        const int c = task % chunks;
        const int item = item_sh[r];
        const int row = a.source_rows ? a.source_rows[item] : item % a.group_items;
        const size_t at = static_cast<size_t>(row) * a.in_features;
        float v[4];
        for (int i = 0; i < 4; ++i) {
            const int k = first * 16 + c * kHadamard + 4 * lane + i;
            float value = 0.f;
            if (k < a.in_features) {
                float x = a.x[at + k];
                if (a.up) x = tf::swiglu(x, a.up[at + k]);
                value = x * half_to_float(layer.suh[k]);
            }
            v[i] = value;
        }
        hadamard128(v);
        uint32_t hi[2], lo[2];
        tf::split_pair(v[0], v[1], hi[0], lo[0]);
        tf::split_pair(v[2], v[3], hi[1], lo[1]);
        *reinterpret_cast<uint2*>(&xs.hi[r][c * kHadamard + 4 * lane]) = make_uint2(hi[0], hi[1]);
        *reinterpret_cast<uint2*>(&xs.lo[r][c * kHadamard + 4 * lane]) = make_uint2(lo[0], lo[1]);
    }
    __syncthreads();

    const int tile_column = chunk * kLinearWarps + warp;
    const size_t row_stride = static_cast<size_t>(a.n_p / 16) * 4 * a.bits2;  // uint32 words per tile row
    const uint32_t* ring = reinterpret_cast<const uint32_t*>(layer.words) + static_cast<size_t>(tile_column) * 4 * a.bits2;
    tf::GemvMma<R> acc(tf::GemvPlanes{&xs.hi[0][0], &xs.lo[0][0], kPlanePitch, rows}, lane);
    tf::gemv_tiles<R>(ring, row_stride, first, last, a.bits2, a.codebook, lane, acc);
    if (rows_sh) rows = *rows_sh;
#pragma unroll
    for (int j = 0; j < tf::GemvMma<R>::kBlocks; ++j) {
        const int r = tf::GemvMma<R>::row_of(j, lane);
        if (r >= rows) continue;
        float* out = a.partial + (static_cast<size_t>(split) * a.items + item_sh[r]) * a.n_p + tile_column * 16 + lane / 4;
        out[0] = acc.output(j, 0);
        out[8] = acc.output(j, 1);
    }

    if (!tf_last_block(counters + counter_at, static_cast<unsigned int>(splits), &last_block)) return;
    for (int r = warp; r < rows; r += kLinearWarps) {
        const int item = item_sh[r];
        // A lane's four outputs as one float4 a split, eight splits' loads in flight at a time: one
        // float and one split at a time was a chain of L2 round trips ending every launch (H200,
        // docs/measurements.md, nineteenth session). Each output still adds its splits in
        // ascending order from 0: the sum does not depend on which block came last.
        const float4* part = reinterpret_cast<const float4*>(a.partial + static_cast<size_t>(item) * a.n_p + chunk * kHadamard + 4 * lane);
        const size_t split_step = static_cast<size_t>(a.items) * a.n_p / 4;
        float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
        for (int s = 0; s < splits; ++s) {
            const float4 p = __ldcg(part + s * split_step);
            v[0] += p.x;
            v[1] += p.y;
            v[2] += p.z;
            v[3] += p.w;
        }
        hadamard128(v);
        for (int i = 0; i < 4; ++i) {
            const int n = chunk * kHadamard + 4 * lane + i;
            if (n >= a.out_features) continue;
            // One fused multiply-add with a bias, written out: left to the compiler, its contraction
            // followed the kernel's control flow, and the grouped and item kernels' bits parted.
            const float scale = half_to_float(layer.svh[n]);
            const float value = layer.bias ? __fmaf_rn(v[i], scale, layer.bias[n]) : __fmul_rn(v[i], scale);
            a.y[static_cast<size_t>(item) * a.out_features + n] = value;
        }
    }
}

// Six blocks per SM on sm_90 (40 registers, no spill): the Air expert layer at M = 1 took 78.8 us
// with the five that 48 registers allow, 74.2 with six (H200). Other archs spill at 40 registers
// and keep the compiler's choice.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#define TF_ITEM_LINEAR_BOUNDS __launch_bounds__(256, 6)
#else
#define TF_ITEM_LINEAR_BOUNDS __launch_bounds__(256)
#endif
// The item kernels' parameters (tf_exl3_item_linear and tf_exl3_shared_item_linear: one launch's).
#define TF_ITEM_LINEAR_PARAMS                                                                                                 \
    const float *__restrict__ x, const float *__restrict__ up, const int *__restrict__ source_rows,                           \
        const int *__restrict__ layer_of_item, const Exl3Layer *__restrict__ layers, float *__restrict__ partial,            \
        unsigned int *__restrict__ counters, float *__restrict__ y, int items, int group_items, int in_features, int out_features, \
        int k_p, int n_p, int bits2, int codebook, int split_tiles
extern "C" __global__ void TF_ITEM_LINEAR_BOUNDS tf_exl3_item_linear(TF_ITEM_LINEAR_PARAMS) {
    tf_wait_prior_grid();
    __shared__ LinearInputs<1> xs;
    __shared__ int item_sh[1];
    const int item = blockIdx.z;
    if (item >= items) return;
    if (threadIdx.x == 0) item_sh[0] = item;
    __syncthreads();
    const LinearArgs a{x, up, source_rows, group_items, partial, y, items, in_features, out_features, k_p, n_p, bits2, codebook, split_tiles};
    const int entry = layer_of_item ? layer_of_item[item] : item / group_items;
    if (entry < 0) return;  // the item is on the prompt path
    const Exl3Layer layer = layers[entry];
    linear_block<1>(a, layer, item_sh, 1, counters, item * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x), xs, blockIdx.x, blockIdx.y, gridDim.y);
}

// The item path for items of which several may name the same table entry (a decode step's routed
// experts: two streams that picked the same expert, and the merged shared expert, which every row
// names). Same grid, partial sums and counters as tf_exl3_item_linear; each block counts, over the
// launch's item -> entry table, how many earlier items name its entry (its rank). Ranks cut an
// entry's items, in item order, into runs of kSharedRun: the block of a run's first item runs the
// whole run, each decoded tile serving all of its rows (one n8 block of products costs what one row
// does), and the other items' blocks return. No sorting launch runs before it, and each item's
// arithmetic is the item path's (an output's bits come from its own row alone, exl3_gemv.cuh): the
// same bits. Counters: the run's first item's (the others' stay zero).
constexpr int kSharedRun = 4;
extern "C" __global__ void TF_ITEM_LINEAR_BOUNDS tf_exl3_shared_item_linear(TF_ITEM_LINEAR_PARAMS) {
    tf_wait_prior_grid();
    __shared__ LinearInputs<kSharedRun> xs;
    __shared__ int item_sh[kSharedRun];
    __shared__ int rows_sh;
    __shared__ int warp_found[kLinearWarps];
    const int item = blockIdx.z;
    if (item >= items) return;
    const int entry = layer_of_item[item];
    if (entry < 0) return;  // the item is on the prompt path
    // The rank: earlier items of the same entry (one block-wide count per 256 items).
    int rank = 0;
    for (int base = 0; base < item; base += blockDim.x) {
        const int j = base + static_cast<int>(threadIdx.x);
        rank += __syncthreads_count(j < item && layer_of_item[j] == entry);
    }
    if (rank % kSharedRun != 0) return;  // a run's later item: its first item's block runs it
    // The run: this item, then the next kSharedRun - 1 items of its entry in item order.
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    int found = 1;
    if (threadIdx.x == 0) item_sh[0] = item;
    for (int base = item + 1; base < items && found < kSharedRun; base += blockDim.x) {
        const int j = base + static_cast<int>(threadIdx.x);
        const bool same = j < items && layer_of_item[j] == entry;
        const unsigned int ballot = __ballot_sync(0xFFFFFFFFu, same);
        if (lane == 0) warp_found[warp] = __popc(ballot);
        __syncthreads();
        int before = found;
        for (int w = 0; w < warp; ++w) before += warp_found[w];
        const int at = before + __popc(ballot & ((1u << lane) - 1u));
        if (same && at < kSharedRun) item_sh[at] = j;
        int total = found;
        for (int w = 0; w < kLinearWarps; ++w) total += warp_found[w];
        found = min(total, kSharedRun);
        __syncthreads();  // warp_found is written again by the next round
    }
    if (threadIdx.x == 0) rows_sh = found;
    __syncthreads();
    const LinearArgs a{x, up, source_rows, group_items, partial, y, items, in_features, out_features, k_p, n_p, bits2, codebook, split_tiles};
    const Exl3Layer layer = layers[entry];
    linear_block<kSharedRun>(a, layer, item_sh, found, counters, item * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x), xs, blockIdx.x,
                             blockIdx.y, gridDim.y, &rows_sh);
}
#undef TF_ITEM_LINEAR_PARAMS

// Several EXL3 layers on the same input rows in one launch (q with k and v; q_a with kv_a): each
// part its own width, k split, outputs, partial sums and counters, as its own launch would run it,
// so every output has that launch's bits. Blocks are the parts' (128 columns, split) places in part
// order, columns fastest; block z is the row. Rows whose `live_rows` entry is -1 are a prompt step's
// prompt rows (the prompt kernels take them). Every part's description is a kernel parameter, picked
// by comparisons: block-uniform values the compiler keeps out of the GEMV loop's registers (a table
// in global memory, loaded, spilled at the six blocks per SM's 40).
constexpr int kPartsMax = 3;
struct LinearParts {
    Exl3Layer layer[kPartsMax];
    float* y[kPartsMax];
    float* partial[kPartsMax];
    unsigned int* counters[kPartsMax];
    int first_place[kPartsMax];  // the part's first block
    int n_p[kPartsMax];
    int out_features[kPartsMax];
    int split_tiles[kPartsMax];
    int splits[kPartsMax];
};
static_assert(sizeof(LinearParts) == 232, "exl3_parts.zig's LinearParts");

// Elsewhere the compiler's own choice (64 registers on sm_8x) spilled the parts' picks: three
// blocks per SM's 85 leave room.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#define TF_PARTS_LINEAR_BOUNDS TF_ITEM_LINEAR_BOUNDS
#else
#define TF_PARTS_LINEAR_BOUNDS __launch_bounds__(256, 3)
#endif
// A block's part: the place's part p, its table entry, arguments and 128-column chunk.
struct PartPlace {
    Exl3Layer layer;
    LinearArgs a;
    int chunk;
    int split;
    int splits;
    unsigned int* counters;
};
__device__ __forceinline__ PartPlace part_place(const float* x, const LinearParts& parts, int rows, int in_features, int k_p, int bits2, int codebook) {
    const int place = static_cast<int>(blockIdx.x);
    const int p = place >= parts.first_place[2] ? 2 : place >= parts.first_place[1] ? 1 : 0;
    const auto pick = [&](const auto& field) { return p == 2 ? field[2] : p == 1 ? field[1] : field[0]; };
    const Exl3Layer layer{pick(parts.layer).words, pick(parts.layer).suh, pick(parts.layer).svh, pick(parts.layer).bias};
    const int n_p = pick(parts.n_p);
    const int chunks = n_p / kHadamard;
    const int at = place - pick(parts.first_place);
    const LinearArgs a{x, nullptr, nullptr, rows, pick(parts.partial), pick(parts.y), rows, in_features, pick(parts.out_features), k_p, n_p,
                       bits2, codebook, pick(parts.split_tiles)};
    return {layer, a, at % chunks, at / chunks, pick(parts.splits), pick(parts.counters)};
}

extern "C" __global__ void TF_PARTS_LINEAR_BOUNDS tf_exl3_parts_linear(const float* __restrict__ x, const int* __restrict__ live_rows,
                                                                      const LinearParts parts, int rows, int in_features, int k_p,
                                                                      int bits2, int codebook) {
    tf_wait_prior_grid();
    __shared__ LinearInputs<1> xs;
    __shared__ int item_sh[1];
    const int item = blockIdx.z;
    if (item >= rows || (live_rows && live_rows[item] < 0)) return;
    // Its own picks, not part_place's: through the helper its code grew 89 instructions (sm_90).
    const int place = static_cast<int>(blockIdx.x);
    const int p = place >= parts.first_place[2] ? 2 : place >= parts.first_place[1] ? 1 : 0;
    const auto pick = [&](const auto& field) { return p == 2 ? field[2] : p == 1 ? field[1] : field[0]; };
    const Exl3Layer layer{pick(parts.layer).words, pick(parts.layer).suh, pick(parts.layer).svh, pick(parts.layer).bias};
    const int n_p = pick(parts.n_p);
    const int chunks = n_p / kHadamard;
    const int at = place - pick(parts.first_place);
    if (threadIdx.x == 0) item_sh[0] = item;
    __syncthreads();
    const LinearArgs a{x, nullptr, nullptr, rows, pick(parts.partial), pick(parts.y), rows, in_features, pick(parts.out_features), k_p, n_p,
                       bits2, codebook, pick(parts.split_tiles)};
    const int chunk = at % chunks;
    linear_block<1>(a, layer, item_sh, 1, pick(parts.counters), item * chunks + chunk, xs, chunk, at / chunks, pick(parts.splits));
}

// The parts of 2 to kSharedRun rows in one block a place: block z takes rows kSharedRun·z on (the
// live ones), each decoded tile serving them all, one n8 block of products as one row's (the same
// bits as a block a row). Its counters are the group's, one per (group, 128 columns) of a part.
extern "C" __global__ void TF_PARTS_LINEAR_BOUNDS tf_exl3_parts_linear4(const float* __restrict__ x, const int* __restrict__ live_rows,
                                                                     const LinearParts parts, int rows, int in_features, int k_p, int bits2,
                                                                     int codebook) {
    tf_wait_prior_grid();
    __shared__ LinearInputs<kSharedRun> xs;
    __shared__ int item_sh[kSharedRun];
    __shared__ int rows_sh;
    const int group = blockIdx.z;
    if (threadIdx.x == 0) {
        int found = 0;
        for (int r = group * kSharedRun; r < min(rows, (group + 1) * kSharedRun); ++r)
            if (!live_rows || live_rows[r] >= 0) item_sh[found++] = r;
        rows_sh = found;
    }
    __syncthreads();
    const int found = rows_sh;
    if (found == 0) return;
    const PartPlace at = part_place(x, parts, rows, in_features, k_p, bits2, codebook);
    linear_block<kSharedRun>(at.a, at.layer, item_sh, found, at.counters, group * (at.a.n_p / kHadamard) + at.chunk, xs, at.chunk, at.split,
                             at.splits, &rows_sh);
}

// The grouped path: block z takes group z of tf_exl3_group_items (blocks past the group count
// return at once). Without `sorted_items` the items are plain layers' (item i: table entry
// i / group_items, every item live), whose groups the sort would make are each entry's items in
// order, in chunks of kRows: computed here, so such a launch needs no sorting launch before it
// (4.4 us on the step timeline, three per layer at four streams).
template <int kRows>
__device__ __forceinline__ void group_linear(const float* __restrict__ x, const float* __restrict__ up, const int* __restrict__ source_rows,
                                             const Exl3Layer* __restrict__ layers, const int* __restrict__ sorted_items,
                                             const int* __restrict__ group_first, const int* __restrict__ group_count,
                                             const int* __restrict__ group_layer, const int* __restrict__ group_total, float* __restrict__ partial,
                                             unsigned int* __restrict__ counters, float* __restrict__ y, int items, int group_items, int in_features,
                                             int out_features, int k_p, int n_p, int bits2, int codebook, int split_tiles) {
    tf_wait_prior_grid();
    __shared__ LinearInputs<kRows> xs;
    __shared__ int item_sh[kRows];
    __shared__ int rows_sh;
    const int group = blockIdx.z;
    int rows, entry;
    if (sorted_items) {
        if (group >= *group_total) return;
        rows = group_count[group];
        entry = group_layer[group];
        if (threadIdx.x < rows) item_sh[threadIdx.x] = sorted_items[group_first[group] + threadIdx.x];
    } else {
        const int per_entry = (group_items + kRows - 1) / kRows;
        entry = group / per_entry;
        const int offset = (group % per_entry) * kRows;
        rows = min(kRows, min(group_items, items - entry * group_items) - offset);  // the last entry may hold fewer
        if (rows <= 0) return;
        if (threadIdx.x < rows) item_sh[threadIdx.x] = entry * group_items + offset + threadIdx.x;
    }
    if constexpr (kRows <= kSharedRun)
        if (threadIdx.x == 0) rows_sh = rows;
    __syncthreads();
    const LinearArgs a{x, up, source_rows, group_items, partial, y, items, in_features, out_features, k_p, n_p, bits2, codebook, split_tiles};
    const Exl3Layer layer = layers[entry];
    // At 40 registers (the four-row form) the row count is read again after the GEMV.
    linear_block<kRows>(a, layer, item_sh, rows, counters, group * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x), xs, blockIdx.x, blockIdx.y, gridDim.y,
                        kRows <= kSharedRun ? &rows_sh : nullptr);
}

#define TF_GROUP_LINEAR_PARAMS                                                                                                              \
    const float *__restrict__ x, const float *__restrict__ up, const int *__restrict__ source_rows, const Exl3Layer *__restrict__ layers, \
        const int *__restrict__ sorted_items, const int *__restrict__ group_first, const int *__restrict__ group_count,                     \
        const int *__restrict__ group_layer, const int *__restrict__ group_total, float *__restrict__ partial,                              \
        unsigned int *__restrict__ counters, float *__restrict__ y, int items, int group_items, int in_features, int out_features, int k_p, \
        int n_p, int bits2, int codebook, int split_tiles
#define TF_GROUP_LINEAR_ARGS \
    x, up, source_rows, layers, sorted_items, group_first, group_count, group_layer, group_total, partial, counters, y, items, group_items, \
        in_features, out_features, k_p, n_p, bits2, codebook, split_tiles

// Three blocks an SM (80 registers): its four n8 blocks' accumulators took 91 registers unbounded,
// two blocks an SM, and 16 rows 10% longer than the 72 of two rows a block (tf-bench --linears).
extern "C" __global__ void __launch_bounds__(256, 3) tf_exl3_group_linear(TF_GROUP_LINEAR_PARAMS) {
    group_linear<kGroupRows>(TF_GROUP_LINEAR_ARGS);
}

// Plain layers of at most 8 rows (a step of up to 8 streams): two n8 blocks of the products and
// half the 16-row form's shared planes, so four blocks fit an SM (64 registers).
extern "C" __global__ void __launch_bounds__(256, 4) tf_exl3_group_linear8(TF_GROUP_LINEAR_PARAMS) {
    group_linear<8>(TF_GROUP_LINEAR_ARGS);
}
// Plain layers of 2 to 4 rows (steps of 2 to 4 streams): the shared-item kernel's one n8 block
// and 40 registers, six blocks an SM on sm_90, where the 8-row form's 64 allow four.
extern "C" __global__ void TF_ITEM_LINEAR_BOUNDS tf_exl3_group_linear4(TF_GROUP_LINEAR_PARAMS) {
    group_linear<kSharedRun>(TF_GROUP_LINEAR_ARGS);
}
#undef TF_GROUP_LINEAR_PARAMS
#undef TF_GROUP_LINEAR_ARGS
