// Multi-head latent attention on the GPU (GLM.md §3.5), the absorbed form of
// zig/src/families/glm/parts/mla.zig for every row: the cache holds per position [latent | k_rope]
// (kv_lora + rope floats, shared by all heads), a head's query is [q_nope·W_UK | q_rope], its
// output W_UV·Σ p·latent. f32 activations, the cache in the engine's dtype (kv_store.cuh); the
// attention's products on tensor cores with f32 operands split into f16 high and low parts
// (mma.cuh). The host half is zig/src/cuda/mla_kernels.zig.
//
// The attention itself is mla_attention.cuh; here its entries, the split fold, and the steps
// around it (the cache write, the products through W_UK and W_UV).
#include <stdint.h>
#include "grid_dependency.cuh"

#include "mla_attention.cuh"

namespace {

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
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
    tf_wait_prior_grid();
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
// eighths are added in warp order (each eighth in k order); so a row's sum has one order, whatever
// the rows beside it, and a decode step's single row still spreads over heads × n/32 blocks (a
// block per head did not: 65 and 141 us per layer for GLM-4.7-Flash's two products on the H200).
constexpr int kProductRows = 8;
constexpr int kProductWarps = 8;

// A product's weight as f32: stored f32, or f16 where every value of the checkpoint's converts
// exactly (mla_cuda.zig: the peer writes kv_b_proj fp16), which halves the memory W_UK and W_UV
// take (GLM-5: 29 MB a layer). Widening is exact: either form feeds the same values to the same
// fmaf chain, so a row's bits do not depend on the form.
__device__ __forceinline__ float widen(float w) { return w; }
__device__ __forceinline__ float widen(__half w) { return __half2float(w); }
template <typename W>
__device__ __forceinline__ float weight_at(const W* p) { return widen(__ldg(p)); }
constexpr int kProductK = kMlaLatent;  // the longest k: the latent (W_UV); W_UK's is nope_dim <= 256
constexpr int kProductAhead = 16;
constexpr int kProductAheadUv = 64;  // tf_mla_v_up_half: a warp's whole eighth of W_UV

// kAhead weights a lane loads before using any; kEarly: the first of them before the rows' inputs
// are staged, so that their DRAM latency and the inputs' copy overlap. At a decode step's one row
// these products wait on rounds of loads, not on bytes: GLM-4.7-Flash's W_UV took 12.8 us in f16
// as in f32 (5.2 vs 10.5 MB; four rounds of 16), and 11.5 us with a warp's whole eighth (64) in
// one early round; W_UK's eighths (24) took 8.6 us in two rounds, 9.7 in one early round (H200
// step timelines, docs/measurements.md), so tf_mla_v_up_half alone takes the early round. The
// multiply-adds run in the same order for any kAhead and kEarly, so the bits are the same.
template <typename W, int kAhead, bool kEarly>
__device__ __forceinline__ void head_product(const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ out,
                                             int rows, int heads, int x_stride, int k, int n) {
    __shared__ float partial[kProductWarps][kProductRows][kWarp];
    __shared__ float xs[kProductRows][kProductK];
    const int h = blockIdx.x;
    const int column = blockIdx.y * kWarp + threadIdx.x % kWarp;
    const int row0 = blockIdx.z * kProductRows;
    const int count = min(kProductRows, rows - row0);
    const int warp = threadIdx.x / kWarp;
    const int per = (k + kProductWarps - 1) / kProductWarps;
    const int i_end = min(k, (warp + 1) * per);
    // The weights of kAhead steps loaded before any is used, the rows' inputs from shared memory:
    // a decode step's one row reads each weight once, and one load in flight per lane left the
    // products at a sixth of copy bandwidth (step timeline: 15 and 25 us per GLM-4.7-Flash layer
    // for 7.9 and 10.5 MB).
    float acc[kProductRows] = {};
    if constexpr (kEarly) {
        const W* weights = w + static_cast<size_t>(h) * k * n + column;
        // As stored until used: f16 weights hold half the registers of their widened values.
        W ahead[kAhead];
        const W zero = W(0.f);
        const auto fetch = [&](int i) {
#pragma unroll
            for (int u = 0; u < kAhead; ++u) ahead[u] = column < n && i + u < i_end ? __ldg(weights + static_cast<size_t>(i + u) * n) : zero;
        };
        fetch(warp * per);
        for (int at = threadIdx.x; at < count * k; at += blockDim.x)
            xs[at / k][at % k] = x[(static_cast<size_t>(row0 + at / k) * heads + h) * x_stride + at % k];
        __syncthreads();
        if (column < n) {
#pragma unroll 1
            for (int i = warp * per; i < i_end; i += kAhead) {
                if (i != warp * per) fetch(i);
#pragma unroll
                for (int u = 0; u < kAhead; ++u) {
                    if (i + u >= i_end) break;
                    const float weight = widen(ahead[u]);
#pragma unroll
                    for (int r = 0; r < kProductRows; ++r)
                        if (r < count) acc[r] = fmaf(xs[r][i + u], weight, acc[r]);
                }
            }
        }
    } else {
        for (int at = threadIdx.x; at < count * k; at += blockDim.x)
            xs[at / k][at % k] = x[(static_cast<size_t>(row0 + at / k) * heads + h) * x_stride + at % k];
        __syncthreads();
        if (column < n) {
            const W* weights = w + static_cast<size_t>(h) * k * n + column;
#pragma unroll 1
            for (int i = warp * per; i < i_end; i += kAhead) {
                float weight[kAhead];
#pragma unroll
                for (int u = 0; u < kAhead; ++u) weight[u] = i + u < i_end ? weight_at(weights + static_cast<size_t>(i + u) * n) : 0.f;
#pragma unroll
                for (int u = 0; u < kAhead; ++u) {
                    if (i + u >= i_end) break;
#pragma unroll
                    for (int r = 0; r < kProductRows; ++r)
                        if (r < count) acc[r] = fmaf(xs[r][i + u], weight[u], acc[r]);
                }
            }
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

// The same products for many rows (a prompt chunk): the block of head_product read its head's
// whole weight for every 8 rows and took a shared-memory load per multiply-add, so a 1024-row
// chunk spent 454 + 869 us per GLM-4.7-Flash layer on them (27% of the chunk). Here a block
// holds 64 rows x 64 columns, a thread 4 x 4 of them, and walks k in head_product's order: the
// eighths in turn, each eighth's k in order into a fresh f32 sum, that sum added to the running
// total after it — the same operations, so a row gives the same bits on either kernel.
constexpr int kTileRows = 64;
constexpr int kTileColumns = 64;
constexpr int kTileK = 8;
constexpr int kTilePad = 4;  // keeps the 16-byte loads aligned, moves rows across banks
constexpr int kTileThreads = 256;

template <typename W>
__device__ __forceinline__ void head_product_rows(const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ out,
                                                  int rows, int heads, int x_stride, int k, int n) {
    __shared__ __align__(16) float xs[2][kTileK][kTileRows + kTilePad];  // transposed: k major
    __shared__ __align__(16) float ws[2][kTileK][kTileColumns + kTilePad];
    const int h = blockIdx.x;
    const int column0 = blockIdx.y * kTileColumns;
    const int row0 = blockIdx.z * kTileRows;
    const int t = threadIdx.x;
    const int ty = t / 16, tx = t % 16;
    const int per = (k + kProductWarps - 1) / kProductWarps;
    const int chunks = (per + kTileK - 1) / kTileK;  // per eighth
    const W* weights = w + static_cast<size_t>(h) * k * n;
    // Loads: x as 64 rows x 8 k (two per thread), w as 8 k x 64 columns (two per thread).
    const int x_row = t / 4, x_k = (t % 4) * 2;
    const int w_k = t / 32, w_col = (t % 32) * 2;
    const bool x_live = row0 + x_row < rows;
    const float* x_src = x + (static_cast<size_t>(row0 + x_row) * heads + h) * x_stride;
    float x_next[2];
    W w_next[2];  // as stored until staged: f16 pairs hold fewer registers across the products
    auto fetch = [&](int chunk) {
        const int eighth = chunk / chunks;
        const int k0 = eighth * per + (chunk % chunks) * kTileK;
        const int end = min(k, (eighth + 1) * per);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int i = k0 + x_k + j;
            x_next[j] = x_live && i < end ? x_src[i] : 0.f;
            const int wi = k0 + w_k;
            const int col = column0 + w_col + j;
            w_next[j] = wi < end && col < n ? __ldg(weights + static_cast<size_t>(wi) * n + col) : W(0.f);
        }
    };
    auto stage = [&](int buffer) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            xs[buffer][x_k + j][x_row] = x_next[j];
            ws[buffer][w_k][w_col + j] = widen(w_next[j]);
        }
    };
    float sum[4][4], acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sum[i][j] = 0.f, acc[i][j] = 0.f;
    const int total = kProductWarps * chunks;
    fetch(0);
    stage(0);
    __syncthreads();
#pragma unroll 1
    for (int chunk = 0; chunk < total; ++chunk) {
        const int buffer = chunk & 1;
        if (chunk + 1 < total) fetch(chunk + 1);
        const int eighth = chunk / chunks;
        const int k0 = eighth * per + (chunk % chunks) * kTileK;
        const int steps = min(kTileK, min(k, (eighth + 1) * per) - k0);  // <= 0: an empty eighth's chunk
#pragma unroll
        for (int kk = 0; kk < kTileK; ++kk) {
            if (kk >= steps) break;
            const float4 a = *reinterpret_cast<const float4*>(&xs[buffer][kk][ty * 4]);
            const float4 b = *reinterpret_cast<const float4*>(&ws[buffer][kk][tx * 4]);
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (chunk % chunks == chunks - 1) {  // the eighth is done: into the total, in eighth order
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) sum[i][j] = __fadd_rn(sum[i][j], acc[i][j]), acc[i][j] = 0.f;
        }
        if (chunk + 1 < total) {
            stage(buffer ^ 1);
            __syncthreads();
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = row0 + ty * 4 + i;
        if (row >= rows) continue;
        float* target = out + (static_cast<size_t>(row) * heads + h) * n;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (column0 + tx * 4 + j < n) target[column0 + tx * 4 + j] = sum[i][j];
    }
}

// Grid (heads, n / 64, rows / 64), block kTileThreads: q_lat = q_nope·W_UK and out = lat·W_UV
// (x at x_stride floats a (row, head), k its length, n the outputs), a prompt chunk's rows. The
// _half entries read the weights as f16 (weight_at).
extern "C" __global__ void __launch_bounds__(kTileThreads) tf_mla_head_rows(const float* __restrict__ x, const float* __restrict__ w,
                                                                           float* __restrict__ out, int rows, int heads, int x_stride,
                                                                           int k, int n) {
    tf_wait_prior_grid();
    head_product_rows(x, w, out, rows, heads, x_stride, k, n);
}

extern "C" __global__ void __launch_bounds__(kTileThreads) tf_mla_head_rows_half(const float* __restrict__ x, const __half* __restrict__ w,
                                                                                float* __restrict__ out, int rows, int heads, int x_stride,
                                                                                int k, int n) {
    tf_wait_prior_grid();
    head_product_rows(x, w, out, rows, heads, x_stride, k, n);
}

extern "C" __global__ void __launch_bounds__(32 * kProductWarps) tf_mla_absorb(const float* __restrict__ q, const float* __restrict__ wuk,
                                                                              float* __restrict__ q_lat, int rows, int heads, int qk_dim, int nope_dim) {
    tf_wait_prior_grid();
    head_product<float, kProductAhead, false>(q, wuk, q_lat, rows, heads, qk_dim, nope_dim, kMlaLatent);
}

extern "C" __global__ void __launch_bounds__(32 * kProductWarps) tf_mla_absorb_half(const float* __restrict__ q, const __half* __restrict__ wuk,
                                                                                   float* __restrict__ q_lat, int rows, int heads, int qk_dim,
                                                                                   int nope_dim) {
    tf_wait_prior_grid();
    head_product<__half, kProductAhead, false>(q, wuk, q_lat, rows, heads, qk_dim, nope_dim, kMlaLatent);
}

#define TF_MLA_ATTENTION_ARGS                                                                                                      \
    const float *__restrict__ q, const float *__restrict__ q_lat, const void *__restrict__ cache, const int8_t *__restrict__ exps, \
        const uint32_t *__restrict__ positions, const uint32_t *__restrict__ tables, const uint32_t *__restrict__ table_offsets, \
        const uint32_t *__restrict__ selected, const uint32_t *__restrict__ counts, int topk, float *__restrict__ out,             \
        float *__restrict__ part_acc, float *__restrict__ part_ml, int rows, int heads, int qk_dim, int nope_dim, float scale,    \
        int layers, int layer, int page_tokens, int pack
#define TF_MLA_ATTENTION_PASS \
    q, q_lat, cache, exps, positions, tables, table_offsets, selected, counts, topk, out, part_acc, part_ml, rows, heads, qk_dim, nope_dim, scale, layers, layer, page_tokens, pack

// One block per SM: each entry takes the registers of a single block (ptxas otherwise caps them
// at 128, and the whole-block entries spill). The split entries' second form ("split2") asks for
// two blocks per SM where shared memory holds two (sm_90's 227 KB; elsewhere it is the first form):
// they fit 128 registers without spilling, and with more blocks than SMs one block's warps issue
// while the other's wait on their tile's chain (GLM-4.7-Flash, 4 rows at 32k: 1.34x), where one
// block per SM runs alone 2-5% faster on its 146 registers (the host picks by the grid).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#define TF_MLA_PAIR_BLOCKS 2
#else
#define TF_MLA_PAIR_BLOCKS 1
#endif

#define TF_MLA_ENTRY(name, spread, dtype, blocks)                                                \
    extern "C" __global__ void __launch_bounds__(kMlaThreads, blocks) name(TF_MLA_ATTENTION_ARGS) { \
        tf_wait_prior_grid();                                                                     \
        mla_attention<spread, dtype>(TF_MLA_ATTENTION_PASS);                                      \
    }

// Grid (rows, heads / 16 rounded up, 1 or kMlaSplits); block kMlaThreads; dynamic shared memory
// MlaStages<dtype>::kSharedBytes. Named by the cache's dtype (none: f32; fp8 takes its rows'
// exponents in `exps`). Every split in the block, folded there: prompt rows (and steps with many
// rows); with pack > 1 (heads % 16 == 16 / pack, the positions of every row, no DSA selection)
// the grid's last head group packs `pack` rows x 16 / pack heads a block where the rows share
// their tiles (a group's first row's block; the others return), else a row's own heads.
TF_MLA_ENTRY(tf_mla_attention, false, tf::kKvF32, 1)
TF_MLA_ENTRY(tf_mla_attention_f16, false, tf::kKvF16, 1)
TF_MLA_ENTRY(tf_mla_attention_fp8, false, tf::kKvFp8, 1)
// A block per split (gridDim.z == kMlaSplits), partials for tf_mla_combine: a decode step's rows
// (pack 1). The same operations in both forms, so the same bits.
TF_MLA_ENTRY(tf_mla_attention_split, true, tf::kKvF32, 1)
TF_MLA_ENTRY(tf_mla_attention_split_f16, true, tf::kKvF16, 1)
TF_MLA_ENTRY(tf_mla_attention_split_fp8, true, tf::kKvFp8, 1)
TF_MLA_ENTRY(tf_mla_attention_split2, true, tf::kKvF32, TF_MLA_PAIR_BLOCKS)
TF_MLA_ENTRY(tf_mla_attention_split2_f16, true, tf::kKvF16, TF_MLA_PAIR_BLOCKS)
TF_MLA_ENTRY(tf_mla_attention_split2_fp8, true, tf::kKvFp8, TF_MLA_PAIR_BLOCKS)

// The fold of tf_mla_attention's split partials: a block per (row, head, 128 dims), a thread per
// dim, its loads issued together, folded as split_fold.cuh does (the attention block's own fold
// in its order, so the same bits).
constexpr int kCombineThreads = 128;
static_assert(kMlaLatent % kCombineThreads == 0, "whole blocks of dims");

extern "C" __global__ void __launch_bounds__(kCombineThreads) tf_mla_combine(
    const float* __restrict__ part_acc, const float* __restrict__ part_ml, const uint32_t* __restrict__ positions,
    const uint32_t* __restrict__ counts, float* __restrict__ out, int rows, int heads) {
    tf_wait_prior_grid();
    __shared__ float factors[3][kMlaSplits];  // per split: the old fold's factor, the split's, its sum
    const int task = blockIdx.x;
    if (task >= rows * heads) return;
    const int row = task / heads;
    const int d = blockIdx.y * kCombineThreads + threadIdx.x;
    const int count = counts ? static_cast<int>(counts[row]) : static_cast<int>(positions[row]) + 1;
    float* target = out + static_cast<size_t>(task) * kMlaLatent + d;
    if (count == 0) {  // an empty selection: zeros, as tf_mla_attention writes
        *target = 0.f;
        return;
    }
    const int live = live_splits<kMlaTile, kMlaSplits>(count);
    const size_t first = static_cast<size_t>(task) * kMlaSplits;
    float a[kMlaSplits];
#pragma unroll
    for (int split = 0; split < kMlaSplits; ++split) a[split] = split < live ? part_acc[(first + split) * kMlaLatent + d] : 0.f;
    if (threadIdx.x < kWarp) split_fold_factors(factors, part_ml, first, live, threadIdx.x);
    __syncthreads();
    *target = split_fold(factors, a, live);
}

extern "C" __global__ void __launch_bounds__(32 * kProductWarps) tf_mla_v_up(const float* __restrict__ lat, const float* __restrict__ wuv_t,
                                                                             float* __restrict__ out, int rows, int heads, int v_dim) {
    tf_wait_prior_grid();
    head_product<float, kProductAhead, false>(lat, wuv_t, out, rows, heads, kMlaLatent, kMlaLatent, v_dim);
}

extern "C" __global__ void __launch_bounds__(32 * kProductWarps) tf_mla_v_up_half(const float* __restrict__ lat, const __half* __restrict__ wuv_t,
                                                                                  float* __restrict__ out, int rows, int heads, int v_dim) {
    tf_wait_prior_grid();
    head_product<__half, kProductAheadUv, true>(lat, wuv_t, out, rows, heads, kMlaLatent, kMlaLatent, v_dim);
}
