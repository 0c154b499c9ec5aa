// The GLM class-A forward on the GPU, f32 throughout like the CPU reference
// (zig/src/families/glm/forward_cpu.zig). The host half is zig/src/cuda/glm_kernels.zig.
//
// Every output element is computed by one thread (or one warp with a fixed reduction tree) from its
// own row's inputs, summing in a fixed order: a row's bits do not depend on the other rows of its
// batch, and the tile and block sizes depend on the shape only, never on the number of rows.
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention_prompt.cuh"
#include "exl3_codebook.cuh"
#include "exl3_gemv.cuh"
#include "exl3_hadamard.cuh"
#include "exl3_trellis.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kHadamard = 128;
using tf::hadamard128;

__device__ __forceinline__ float warp_sum(float v) {
    // A fixed butterfly: the same order every call.
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}

__device__ __forceinline__ float half_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

}  // namespace

// ---- element-wise and row-wise ----

// One block per (row, 256 columns): a decode step's single row is still spread over many blocks.
extern "C" __global__ void tf_embed(const uint32_t* __restrict__ tokens, const float* __restrict__ table,
                                    float* __restrict__ out, int rows, int hidden) {
    const int row = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (row >= rows || i >= hidden) return;
    out[static_cast<size_t>(row) * hidden + i] = table[static_cast<size_t>(tokens[row]) * hidden + i];
}

// w ⊙ x / sqrt(mean(x²) + eps), one block of 256 threads per row; out may alias x (each thread
// writes only what it read). With `delta`, first x += delta (the residual add, written back; out
// must not alias x then): one launch instead of an add and a norm. Rows of up to 8192 values, a multiple of 4, are read once as float4
// into registers, all loads issued before any is used: at one row per step the kernel is a single
// block, and a loop of dependent loads made it ~14 us on the H200.
constexpr int kNormCache = 8;

extern "C" __global__ void __launch_bounds__(256) tf_rmsnorm(float* x, const float* __restrict__ delta, const float* __restrict__ weight,
                                                             float* out, int rows, int width, float eps) {
    __shared__ float partial[8];
    const int row = blockIdx.x;
    if (row >= rows) return;
    float* in = x + static_cast<size_t>(row) * width;
    const float* add = delta ? delta + static_cast<size_t>(row) * width : nullptr;
    float* target = out + static_cast<size_t>(row) * width;
    const bool cached = width % 4 == 0 && width <= 4 * 256 * kNormCache;
    const int n4 = width / 4;
    float4 v[kNormCache];
    float sum = 0.f;
    if (cached) {
        float4* in4 = reinterpret_cast<float4*>(in);
#pragma unroll
        for (int j = 0; j < kNormCache; ++j) {
            const int i = threadIdx.x + j * 256;
            v[j] = i < n4 ? in4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        if (add) {
            const float4* add4 = reinterpret_cast<const float4*>(add);
#pragma unroll
            for (int j = 0; j < kNormCache; ++j) {
                const int i = threadIdx.x + j * 256;
                if (i >= n4) continue;
                const float4 d = add4[i];
                v[j] = make_float4(v[j].x + d.x, v[j].y + d.y, v[j].z + d.z, v[j].w + d.w);
                in4[i] = v[j];
            }
        }
#pragma unroll
        for (int j = 0; j < kNormCache; ++j) sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    } else {
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            if (add) in[i] += add[i];
            sum += in[i] * in[i];
        }
    }
    sum = warp_sum(sum);
    if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = sum;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < 8; ++w) total += partial[w];
    const float inverse = 1.0f / sqrtf(total / width + eps);
    if (cached) {
        const float4* weight4 = reinterpret_cast<const float4*>(weight);
        float4* target4 = reinterpret_cast<float4*>(target);
#pragma unroll
        for (int j = 0; j < kNormCache; ++j) {
            const int i = threadIdx.x + j * 256;
            if (i >= n4) continue;
            const float4 w = weight4[i];
            target4[i] = make_float4(w.x * (v[j].x * inverse), w.y * (v[j].y * inverse), w.z * (v[j].z * inverse), w.w * (v[j].w * inverse));
        }
    } else {
        __syncthreads();
        for (int i = threadIdx.x; i < width; i += blockDim.x) target[i] = weight[i] * (in[i] * inverse);
    }
}

// out[i] = x[rows[i]]: the rows whose logits are wanted, before a dense lm_head.
extern "C" __global__ void tf_gather_rows(const float* __restrict__ x, const uint32_t* __restrict__ rows_wanted,
                                          float* __restrict__ out, int count, int width) {
    const int i = blockIdx.x;
    if (i >= count) return;
    for (int d = threadIdx.x; d < width; d += blockDim.x)
        out[static_cast<size_t>(i) * width + d] = x[static_cast<size_t>(rows_wanted[i]) * width + d];
}

extern "C" __global__ void tf_add(float* __restrict__ target, const float* __restrict__ source, int count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) target[i] += source[i];
}

extern "C" __global__ void tf_swiglu(float* __restrict__ gate, const float* __restrict__ up, int count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

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
// of them. The block first rotates its split's 512 input channels of each of its items into shared
// memory as fp16 high/low planes (128-chunks, a warp each), then each warp runs the trellis GEMV of
// one 16-column tile column over the split's 32 tile rows on tensor cores (exl3_gemv.cuh) and
// writes each item's partial sums. The last block of a (key, 128 columns) to finish, told by a
// counter, sums the splits' partials in ascending split order (so the result does not depend on
// which block came last), applies the output Hadamard, svh and bias, and resets the counter for the
// next launch.
//
// Every item's arithmetic is the same on both paths and for any grouping: a row's bits depend on
// the shape alone, never on its batch.
constexpr int kLinearWarps = 8;
constexpr int kSplitChannels = 512;  // 32 tile rows: tiles_per_split in glm_kernels.zig
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
};

// The rotated inputs of a block's split, as fp16 high/low planes for the GEMV's ldmatrix (rows
// 1040 bytes apart, 16 past a multiple of 128: the 8 rows of an ldmatrix phase fall in distinct
// banks).
constexpr int kPlanePitch = kSplitChannels + 8;
template <int R>
struct LinearInputs {
    __align__(16) half hi[R][kPlanePitch];
    __align__(16) half lo[R][kPlanePitch];
    __align__(16) half zero[8];
};

// One block's work for `rows` items (item_sh[0..rows)) of `layer`; `key` names its counter.
template <int R>
__device__ __forceinline__ void linear_block(const LinearArgs& a, const Exl3Layer& layer, const int* item_sh, int rows,
                                             unsigned int* __restrict__ counter, LinearInputs<R>& xs) {
    __shared__ int last_block;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int chunk = blockIdx.x;
    const int split = blockIdx.y;
    const int splits = gridDim.y;
    const int first = split * (kSplitChannels / 16);
    const int last = min(a.k_p / 16, first + kSplitChannels / 16);
    const int chunks = (last - first) * 16 / kHadamard;

    if (threadIdx.x < 8) xs.zero[threadIdx.x] = __ushort_as_half(0);
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
                if (a.up) x = x / (1.0f + expf(-x)) * a.up[at + k];
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
    tf::GemvMma<R> acc(tf::GemvPlanes{&xs.hi[0][0], &xs.lo[0][0], kPlanePitch, rows, xs.zero}, lane);
    tf::gemv_tiles<R>(ring, row_stride, first, last, a.bits2, a.codebook, lane, acc);
#pragma unroll
    for (int j = 0; j < tf::GemvMma<R>::kBlocks; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = 8 * j + 2 * (lane % 4) + h;
            if (r >= rows) continue;
            float* out = a.partial + (static_cast<size_t>(split) * a.items + item_sh[r]) * a.n_p + tile_column * 16 + lane / 4;
            out[0] = acc.d[j][h];
            out[8] = acc.d[j][2 + h];
        }

    __threadfence();  // the partials are visible GPU-wide before the counter says so
    __syncthreads();
    if (threadIdx.x == 0) {
        last_block = atomicAdd(counter, 1u) == static_cast<unsigned int>(splits - 1);
        if (last_block) *counter = 0u;
    }
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    for (int r = warp; r < rows; r += kLinearWarps) {
        const int item = item_sh[r];
        float v[4];
        for (int i = 0; i < 4; ++i) {
            const int n = chunk * kHadamard + 4 * lane + i;
            float sum = 0.f;
            for (int s = 0; s < splits; ++s) sum += __ldcg(a.partial + (static_cast<size_t>(s) * a.items + item) * a.n_p + n);
            v[i] = sum;
        }
        hadamard128(v);
        for (int i = 0; i < 4; ++i) {
            const int n = chunk * kHadamard + 4 * lane + i;
            if (n >= a.out_features) continue;
            float value = v[i] * half_to_float(layer.svh[n]);
            if (layer.bias) value += layer.bias[n];
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
extern "C" __global__ void TF_ITEM_LINEAR_BOUNDS tf_exl3_item_linear(
    const float* __restrict__ x, const float* __restrict__ up, const int* __restrict__ source_rows,
    const int* __restrict__ layer_of_item, const Exl3Layer* __restrict__ layers, float* __restrict__ partial,
    unsigned int* __restrict__ counters, float* __restrict__ y, int items, int group_items, int in_features,
    int out_features, int k_p, int n_p, int bits2, int codebook) {
    __shared__ LinearInputs<1> xs;
    __shared__ int item_sh[1];
    const int item = blockIdx.z;
    if (item >= items) return;
    if (threadIdx.x == 0) item_sh[0] = item;
    __syncthreads();
    const LinearArgs a{x, up, source_rows, group_items, partial, y, items, in_features, out_features, k_p, n_p, bits2, codebook};
    const int entry = layer_of_item ? layer_of_item[item] : item / group_items;
    if (entry < 0) return;  // the item is on the prompt path
    const Exl3Layer layer = layers[entry];
    linear_block<1>(a, layer, item_sh, 1, counters + static_cast<size_t>(item) * gridDim.x + blockIdx.x, xs);
}

// The grouped path: block z takes group z of tf_exl3_group_items (blocks past the group count
// return at once).
extern "C" __global__ void __launch_bounds__(256, 2) tf_exl3_group_linear(
    const float* __restrict__ x, const float* __restrict__ up, const int* __restrict__ source_rows,
    const Exl3Layer* __restrict__ layers, const int* __restrict__ sorted_items, const int* __restrict__ group_first,
    const int* __restrict__ group_count, const int* __restrict__ group_layer, const int* __restrict__ group_total,
    float* __restrict__ partial, unsigned int* __restrict__ counters, float* __restrict__ y, int items, int group_items,
    int in_features, int out_features, int k_p, int n_p, int bits2, int codebook) {
    __shared__ LinearInputs<kGroupRows> xs;
    __shared__ int item_sh[kGroupRows];
    const int group = blockIdx.z;
    if (group >= *group_total) return;
    const int rows = group_count[group];
    if (threadIdx.x < rows) item_sh[threadIdx.x] = sorted_items[group_first[group] + threadIdx.x];
    __syncthreads();
    const LinearArgs a{x, up, source_rows, group_items, partial, y, items, in_features, out_features, k_p, n_p, bits2, codebook};
    const Exl3Layer layer = layers[group_layer[group]];
    linear_block<kGroupRows>(a, layer, item_sh, rows, counters + static_cast<size_t>(group) * gridDim.x + blockIdx.x, xs);
}

// Items sorted by layer (ties by item index: a stable counting sort), cut into groups of at most
// `group_size` items of one layer (16 for the GEMV's groups, 64 for the prompt kernels), in layer
// order. Items of layer -1 belong to the other path and are left out. One warp: ranks within each 32-item chunk come from
// __match_any_sync, so the order does not depend on timing. `layers` <= 1024; ranks: items ints.
extern "C" __global__ void __launch_bounds__(32) tf_exl3_group_items(const int* __restrict__ layer_of_item, int items, int group_items,
                                                                     int layers, int group_size, int* __restrict__ ranks, int* __restrict__ sorted_items,
                                                                     int* __restrict__ group_first, int* __restrict__ group_count,
                                                                     int* __restrict__ group_layer, int* __restrict__ group_total) {
    __shared__ int counts[1024];
    __shared__ int starts[1024];
    const int lane = threadIdx.x;
    for (int l = lane; l < layers; l += kWarp) counts[l] = 0;
    __syncwarp();
    const unsigned int below = (1u << lane) - 1u;
    for (int base = 0; base < items; base += kWarp) {
        const int i = base + lane;
        const int layer = i < items ? (layer_of_item ? layer_of_item[i] : i / group_items) : -1;
        const bool valid = layer >= 0;  // layer -1: the item is on the other path
        const unsigned int same = __match_any_sync(0xFFFFFFFFu, layer);
        const int before = valid ? counts[layer] : 0;
        __syncwarp();
        if (valid) {
            ranks[i] = before + __popc(same & below);
            if (lane == 31 - __clz(same)) counts[layer] = before + __popc(same);
        }
        __syncwarp();
    }
    if (lane == 0) {
        int at = 0, groups = 0;
        for (int l = 0; l < layers; ++l) {
            starts[l] = at;
            for (int offset = 0; offset < counts[l]; offset += group_size) {
                group_first[groups] = at + offset;
                group_count[groups] = min(group_size, counts[l] - offset);
                group_layer[groups] = l;
                ++groups;
            }
            at += counts[l];
        }
        *group_total = groups;
    }
    __syncwarp();
    for (int i = lane; i < items; i += kWarp) {
        const int layer = layer_of_item ? layer_of_item[i] : i / group_items;
        if (layer >= 0) sorted_items[starts[layer] + ranks[i]] = i;
    }
}

// y = x · Wᵀ + b for an unquantized (out, in) f32 weight: one warp per (row, output), lanes stride
// the input and reduce with the fixed butterfly.
extern "C" __global__ void tf_dense_matmul(const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
                                           float* __restrict__ y, int rows, int in_features, int out_features) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
    const int lane = threadIdx.x % kWarp;
    const int row = warp / out_features;
    const int out = warp % out_features;
    if (row >= rows) return;
    const float* a = x + static_cast<size_t>(row) * in_features;
    const float* w = weight + static_cast<size_t>(out) * in_features;
    float sum = 0.f;
    for (int i = lane; i < in_features; i += kWarp) sum = fmaf(a[i], w[i], sum);
    sum = warp_sum(sum);
    if (lane == 0) y[static_cast<size_t>(row) * out_features + out] = sum + (bias ? bias[out] : 0.f);
}

// ---- attention ----

// Per-head RMSNorm (optional), partial rotate-half RoPE on the first rotary_dim dims (GLM.md §3.4),
// then keys and values into the paged cache. A warp per (row, head), 8 per block.
extern "C" __global__ void tf_qk_rope_store(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                                            const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                            const float* __restrict__ cos_sin, const uint32_t* __restrict__ positions,
                                            const uint32_t* __restrict__ tables, const uint32_t* __restrict__ table_offsets,
                                            float* __restrict__ cache_k, float* __restrict__ cache_v,
                                            int rows, int heads, int kv_heads, int head_dim, int rotary_dim, float eps,
                                            int layers, int layer, int page_tokens) {
    const int row = blockIdx.x;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (row >= rows) return;
    const float* cs = cos_sin + static_cast<size_t>(row) * rotary_dim;
    const int half = rotary_dim / 2;
    const int warps = blockDim.x / kWarp;
    for (int h = blockIdx.y * warps + warp; h < heads + kv_heads; h += gridDim.y * warps) {
        const bool is_q = h < heads;
        float* head = is_q ? q + (static_cast<size_t>(row) * heads + h) * head_dim
                           : k + (static_cast<size_t>(row) * kv_heads + (h - heads)) * head_dim;
        const float* norm = is_q ? q_norm : k_norm;
        if (norm) {
            float sum = 0.f;
            for (int i = lane; i < head_dim; i += kWarp) sum += head[i] * head[i];
            const float inverse = 1.0f / sqrtf(warp_sum(sum) / head_dim + eps);
            for (int i = lane; i < head_dim; i += kWarp) head[i] = norm[i] * (head[i] * inverse);
            __syncwarp();
        }
        for (int j = lane; j < half; j += kWarp) {
            const float a = head[j], b = head[j + half], c = cs[j], s = cs[half + j];
            head[j] = a * c - b * s;
            head[j + half] = b * c + a * s;
        }
        __syncwarp();
        if (!is_q) {
            const int kv = h - heads;
            const uint32_t position = positions[row];
            const uint32_t page = tables[table_offsets[row] + position / page_tokens];
            const size_t at = (((static_cast<size_t>(page) * layers + layer) * kv_heads + kv) * page_tokens + position % page_tokens) * head_dim;
            const float* value = v + (static_cast<size_t>(row) * kv_heads + kv) * head_dim;
            for (int i = lane; i < head_dim; i += kWarp) {
                cache_k[at + i] = head[i];
                cache_v[at + i] = value[i];
            }
        }
    }
}

// softmax(q·kᵀ/sqrt(d))·v over positions 0..pos of the row's own sequence, for every query head of
// one KV head: a warp per query head (in rounds of up to 12 warps), K and V staged through shared
// memory 32 positions at a time (cp.async, two stages) so that the query heads of a group read
// them once.
//
// A row's positions fall into kAttentionSplits splits of whole tiles, fixed by its length alone
// (attention_split). Within a split, an online softmax in position order: per tile, lane j scores
// position j over the whole head, the tile's max and sum (fixed butterflies) rescale the running sum
// and accumulator, and each lane accumulates its 4 dims over the tile's positions in order. The
// splits' (max, sum, accumulator) are then folded left to right (fold_split). Either one block per
// (row, KV head) runs every split and folds them itself (gridDim.y == 1), or a block per split writes
// its partial to `part_*` and tf_attention_combine folds them: the same operations in the same order,
// so a row's bits are the same either way, and the host may spread a decode step's few long rows
// over the whole GPU (flash-decoding) without changing a bit. head_dim <= 128, a multiple of 4.
constexpr int kAttentionTile = 32;
constexpr int kAttentionPitch = 128 + 4;  // float4 rows of 8 lanes land in distinct banks
constexpr int kAttentionWarps = 12;
constexpr int kAttentionSplits = 32;
// Dynamic shared memory of tf_attention: K and V tiles in two stages (cp.async brings the next 32
// positions while the block scores the current ones), then the warps' queries.
constexpr int kAttentionStage = 2 * kAttentionTile * kAttentionPitch;  // floats: K tile, V tile
constexpr int kAttentionSharedBytes = (2 * kAttentionStage + kAttentionWarps * kAttentionPitch) * 4;
static_assert(kAttentionSharedBytes == 73920, "the launch's size: attention_shared_bytes in glm_kernels.zig");

struct SplitRange {
    int begin;
    int end;
};

__device__ __forceinline__ SplitRange attention_split(int length, int split) {
    const int tiles = (length + kAttentionTile - 1) / kAttentionTile;
    const int per = (tiles + kAttentionSplits - 1) / kAttentionSplits;
    return {min(split * per * kAttentionTile, length), min((split + 1) * per * kAttentionTile, length)};
}

// (max, sum, acc) ⊕= a split's (m, l, a). Rounded operations only (no contraction), so that the
// attention kernel and the combine kernel compute the same bits.
__device__ __forceinline__ void fold_split(float& max, float& sum, float (&acc)[4], float m, float l, const float (&a)[4]) {
    const float next = fmaxf(max, m);
    const float x = expf(max - next);  // 0 on the first split
    const float y = expf(m - next);
    sum = __fadd_rn(__fmul_rn(sum, x), __fmul_rn(l, y));
    for (int i = 0; i < 4; ++i) acc[i] = __fadd_rn(__fmul_rn(acc[i], x), __fmul_rn(a[i], y));
    max = next;
}

__device__ __forceinline__ float4 fold_result(const float (&acc)[4], float sum) {
    return make_float4(__fdiv_rn(acc[0], sum), __fdiv_rn(acc[1], sum), __fdiv_rn(acc[2], sum), __fdiv_rn(acc[3], sum));
}

// Rows with skip[row] != 0 (skip may be null) are tf_attention_prompt's. Partials of split s of
// (row, query head h): part_acc[((row·heads + h)·S + s)·head_dim + d] and
// part_ml[((row·heads + h)·S + s)·2 + {0: max, 1: sum}].
// sm_12x's ptxas caps the registers for several blocks per SM and spills; its 100 KB of shared
// memory holds one block of this kernel anyway.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define TF_ATTENTION_BOUNDS __launch_bounds__(32 * kAttentionWarps, 1)
#else
#define TF_ATTENTION_BOUNDS __launch_bounds__(32 * kAttentionWarps)
#endif
extern "C" __global__ void TF_ATTENTION_BOUNDS tf_attention(const float* __restrict__ q, const float* __restrict__ cache_k,
                                                               const float* __restrict__ cache_v, const uint32_t* __restrict__ positions,
                                                               const uint32_t* __restrict__ tables, const uint32_t* __restrict__ table_offsets,
                                                               const int* __restrict__ skip, float* __restrict__ out, float* __restrict__ part_acc,
                                                               float* __restrict__ part_ml, int rows, int heads, int kv_heads, int head_dim, int layers, int layer,
                                                               int page_tokens) {
    extern __shared__ __align__(16) float attention_shared[];
    float(*qs)[kAttentionPitch] = reinterpret_cast<float(*)[kAttentionPitch]>(attention_shared + 2 * kAttentionStage);
    const int row = blockIdx.x / kv_heads;
    const int kv = blockIdx.x % kv_heads;
    if (row >= rows || (skip && skip[row])) return;
    const bool spread = gridDim.y > 1;
    const int length = static_cast<int>(positions[row]) + 1;
    const int split_first = spread ? blockIdx.y : 0;
    const int split_end = spread ? blockIdx.y + 1 : kAttentionSplits;
    if (attention_split(length, split_first).begin >= length) return;  // an empty split: the combine skips it
    const int group = heads / kv_heads;
    const int warps = blockDim.x / kWarp;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const bool mine = 4 * lane < head_dim;
    const float scale = rsqrtf(static_cast<float>(head_dim));
    const uint32_t* table = tables + table_offsets[row];
    const int quads = head_dim / 4;
    for (int round = 0; round < group; round += warps) {
        const bool live = round + warp < group;
        const int h = kv * group + round + warp;
        if (live)  // the query arrives scaled by 1/sqrt(d): a register fewer in the loop below
            for (int i = lane; i < head_dim; i += kWarp) qs[warp][i] = q[(static_cast<size_t>(row) * heads + h) * head_dim + i] * scale;
        float folded_max = -INFINITY, folded_sum = 0.f;
        float folded[4] = {0.f, 0.f, 0.f, 0.f};
        for (int split = split_first; split < split_end; ++split) {
            const SplitRange range = attention_split(length, split);
            if (range.begin >= range.end) break;  // the splits after an empty one are empty too
            float running_max = -INFINITY, running_sum = 0.f;
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            // Positions t0 .. t0 + 31 into stage (t0 - range.begin) / 32 % 2, one 16-byte copy per task.
            const auto issue = [&](int t0) {
                float* stage = attention_shared + ((t0 - range.begin) / kAttentionTile % 2) * kAttentionStage;
                const int count = min(kAttentionTile, range.end - t0);
#pragma unroll 1
                for (int task = threadIdx.x; task < count * quads; task += blockDim.x) {
                    const int j = task / quads;
                    const int d = 4 * (task % quads);
                    const int t = t0 + j;
                    const size_t at = (((static_cast<size_t>(table[t / page_tokens]) * layers + layer) * kv_heads + kv) * page_tokens + t % page_tokens) * head_dim + d;
                    tf::copy16_async(stage + j * kAttentionPitch + d, cache_k + at, true);
                    tf::copy16_async(stage + (kAttentionTile + j) * kAttentionPitch + d, cache_v + at, true);
                }
                asm volatile("cp.async.commit_group;\n" ::);
            };
            __syncthreads();  // the stages are free (and qs written, the first time)
            issue(range.begin);
            for (int t0 = range.begin; t0 < range.end; t0 += kAttentionTile) {
                const int count = min(kAttentionTile, range.end - t0);
                __syncthreads();  // the stage the next copies go to is consumed
                if (t0 + kAttentionTile < range.end) issue(t0 + kAttentionTile);
                else asm volatile("cp.async.commit_group;\n" ::);
                asm volatile("cp.async.wait_group 1;\n" ::);
                __syncthreads();  // this tile's copies, every thread's, have landed
                const float(*ks)[kAttentionPitch] = reinterpret_cast<const float(*)[kAttentionPitch]>(attention_shared + ((t0 - range.begin) / kAttentionTile % 2) * kAttentionStage);
                const float(*vs)[kAttentionPitch] = ks + kAttentionTile;
                if (!live) continue;
                float score = -INFINITY;
                if (lane < count) {
                    score = 0.f;
#pragma unroll 4
                    for (int d = 0; d < head_dim; d += 4) {
                        const float4 a = *reinterpret_cast<const float4*>(&qs[warp][d]);
                        const float4 b = *reinterpret_cast<const float4*>(&ks[lane][d]);
                        score = fmaf(a.x, b.x, score); score = fmaf(a.y, b.y, score); score = fmaf(a.z, b.z, score); score = fmaf(a.w, b.w, score);
                    }
                }
                const float next_max = fmaxf(running_max, warp_max(score));
                const float p = lane < count ? expf(score - next_max) : 0.f;
                const float rescale = expf(running_max - next_max);  // 0 on the first tile
                running_sum = running_sum * rescale + warp_sum(p);
                running_max = next_max;
                for (int i = 0; i < 4; ++i) acc[i] *= rescale;
                for (int j = 0; j < count; ++j) {
                    const float pj = __shfl_sync(0xFFFFFFFFu, p, j);
                    if (!mine) continue;
                    const float4 v = *reinterpret_cast<const float4*>(&vs[j][4 * lane]);
                    acc[0] = fmaf(pj, v.x, acc[0]); acc[1] = fmaf(pj, v.y, acc[1]); acc[2] = fmaf(pj, v.z, acc[2]); acc[3] = fmaf(pj, v.w, acc[3]);
                }
            }
            asm volatile("cp.async.wait_group 0;\n" ::);
            if (!live) continue;
            if (spread) {
                const size_t at = (static_cast<size_t>(row) * heads + h) * kAttentionSplits + split;
                if (mine) *reinterpret_cast<float4*>(part_acc + at * head_dim + 4 * lane) = make_float4(acc[0], acc[1], acc[2], acc[3]);
                if (lane == 0) *reinterpret_cast<float2*>(part_ml + 2 * at) = make_float2(running_max, running_sum);
            } else {
                fold_split(folded_max, folded_sum, folded, running_max, running_sum, acc);
            }
        }
        if (!spread && live && mine)
            *reinterpret_cast<float4*>(out + (static_cast<size_t>(row) * heads + h) * head_dim + 4 * lane) = fold_result(folded, folded_sum);
        __syncthreads();  // qs is rewritten by the next round
    }
}

// The fold of tf_attention's split partials: a thread per (row, query head, 4 dims).
extern "C" __global__ void tf_attention_combine(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                                const uint32_t* __restrict__ positions, const int* __restrict__ skip,
                                                float* __restrict__ out, int rows, int heads, int head_dim) {
    const int quads = head_dim / 4;
    const int task = blockIdx.x * blockDim.x + threadIdx.x;
    if (task >= rows * heads * quads) return;
    const int row = task / (heads * quads);
    const int h = (task / quads) % heads;
    const int d = 4 * (task % quads);
    if (skip && skip[row]) return;
    const int length = static_cast<int>(positions[row]) + 1;
    float folded_max = -INFINITY, folded_sum = 0.f;
    float folded[4] = {0.f, 0.f, 0.f, 0.f};
    for (int split = 0; split < kAttentionSplits; ++split) {
        const SplitRange range = attention_split(length, split);
        if (range.begin >= range.end) break;
        const size_t at = (static_cast<size_t>(row) * heads + h) * kAttentionSplits + split;
        const float4 a4 = *reinterpret_cast<const float4*>(part_acc + at * head_dim + d);
        const float2 ml = *reinterpret_cast<const float2*>(part_ml + 2 * at);
        const float a[4] = {a4.x, a4.y, a4.z, a4.w};
        fold_split(folded_max, folded_sum, folded, ml.x, ml.y, a);
    }
    *reinterpret_cast<float4*>(out + (static_cast<size_t>(row) * heads + h) * head_dim + d) = fold_result(folded, folded_sum);
}

// ---- MoE ----

// Router logits (GLM.md §3.8), f32: probability = sigmoid(x · gate_e), choice = probability +
// correction. A warp per (row, expert), 8 per block across many blocks: the router's weights
// (experts × hidden f32, 2 MB for GLM-4.5-Air) are read by the whole GPU, not by one block per row.
extern "C" __global__ void __launch_bounds__(256) tf_route_logits(const float* __restrict__ x, const float* __restrict__ gate,
                                                                  const float* __restrict__ correction, float* __restrict__ scratch,
                                                                  int rows, int hidden, int experts) {
    const int row = blockIdx.y;
    const int e = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (row >= rows || e >= experts) return;
    const float* in = x + static_cast<size_t>(row) * hidden;
    const float* w = gate + static_cast<size_t>(e) * hidden;
    float dot = 0.f;
    if (hidden % 4 == 0) {
        // float4 loads, eight in flight per lane: the router matrix is read once per step.
        const float4* in4 = reinterpret_cast<const float4*>(in);
        const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll 8
        for (int i = lane; i < hidden / 4; i += kWarp) {
            const float4 a = in4[i], b = w4[i];
            dot = fmaf(a.x, b.x, dot); dot = fmaf(a.y, b.y, dot); dot = fmaf(a.z, b.z, dot); dot = fmaf(a.w, b.w, dot);
        }
    } else {
        for (int i = lane; i < hidden; i += kWarp) dot = fmaf(in[i], w[i], dot);
    }
    dot = warp_sum(dot);
    if (lane == 0) {
        float* probability = scratch + static_cast<size_t>(row) * 2 * experts;
        probability[e] = 1.0f / (1.0f + expf(-dot));
        probability[experts + e] = probability[e] + correction[e];
    }
}

// Expert selection of one row from tf_route_logits' scratch: on the choice scores (group-limited
// when groups > 1), weights from the unbiased sigmoid, normalised, scaled. Writes each row's
// experts in ascending index and their weights, `slots` per row: top_k, or top_k + 1 with the
// merged shared expert last. One 256-thread block per row.
//
// For the gate/up launch of the experts, which runs 2·rows·top_k items, it also writes the items'
// layers (gate table entries 0..experts-1, then up entries experts..2·experts-1) and source rows.
// With `prompt_layers`, rows flagged in `row_prompt` take the prompt path: their experts go to
// prompt_layers and the GEMV's layers (experts_out, pair_layers) say -1, and the other way round.
extern "C" __global__ void __launch_bounds__(256) tf_route(int* __restrict__ experts_out, float* __restrict__ weights_out,
                                                           int* __restrict__ pair_layers, int* __restrict__ pair_rows,
                                                           const int* __restrict__ row_prompt, int* __restrict__ prompt_layers,
                                                           float* __restrict__ scratch, int rows, int experts, int top_k, int slots,
                                                           int groups, int groups_per_token, int normalize, float scaling) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    float* probability = scratch + static_cast<size_t>(row) * 2 * experts;
    float* choice = probability + experts;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    __syncthreads();
    if (groups > 1 && threadIdx.x == 0) {
        const int per_group = experts / groups;
        unsigned long long keep = 0;  // groups <= 64 here
        for (int pick = 0; pick < groups_per_token; ++pick) {
            int best = -1;
            float best_score = 0.f;
            for (int g = 0; g < groups; ++g) {
                if (keep & (1ull << g)) continue;
                float first = -INFINITY, second = -INFINITY;
                for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
                    if (choice[e] > first) { second = first; first = choice[e]; } else if (choice[e] > second) second = choice[e];
                }
                if (best < 0 || first + second > best_score) { best = g; best_score = first + second; }
            }
            keep |= 1ull << best;
        }
        for (int g = 0; g < groups; ++g)
            if (!(keep & (1ull << g)))
                for (int e = g * per_group; e < (g + 1) * per_group; ++e) choice[e] = -INFINITY;  // transformers' mask
    }
    __syncthreads();
    // Top-k, one slot at a time: every thread scans its experts, then the block keeps the highest
    // score, the lowest index on a tie (the CPU router's rule). Taken experts are marked in `choice`
    // by -inf after their slot.
    __shared__ float best_score_sh[8];
    __shared__ int best_index_sh[8];
    int* chosen = experts_out + static_cast<size_t>(row) * slots;
    for (int slot = 0; slot < top_k; ++slot) {
        float best_score = -INFINITY;
        int best = experts;
        for (int e = threadIdx.x; e < experts; e += blockDim.x) {
            const float c = choice[e];
            if (c > best_score || (c == best_score && e < best)) { best_score = c; best = e; }
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            const float other_score = __shfl_xor_sync(0xFFFFFFFFu, best_score, offset);
            const int other = __shfl_xor_sync(0xFFFFFFFFu, best, offset);
            if (other_score > best_score || (other_score == best_score && other < best)) { best_score = other_score; best = other; }
        }
        if (lane == 0) { best_score_sh[warp] = best_score; best_index_sh[warp] = best; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < 8; ++w) {
                if (best_score_sh[w] > best_score_sh[0] || (best_score_sh[w] == best_score_sh[0] && best_index_sh[w] < best_index_sh[0])) {
                    best_score_sh[0] = best_score_sh[w];
                    best_index_sh[0] = best_index_sh[w];
                }
            }
            chosen[slot] = best_index_sh[0];
            choice[best_index_sh[0]] = -INFINITY;
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    for (int i = 1; i < top_k; ++i)  // ascending expert index: the CPU's summation order
        for (int j = i; j > 0 && chosen[j - 1] > chosen[j]; --j) { const int t = chosen[j]; chosen[j] = chosen[j - 1]; chosen[j - 1] = t; }
    // A merged shared expert (slots = top_k + 1) is table entry `experts`, last, with weight 1.
    if (slots > top_k) chosen[top_k] = experts;
    const int entries = experts + (slots > top_k);  // table entries per projection
    const size_t items = static_cast<size_t>(rows) * slots;
    for (int slot = 0; slot < slots; ++slot) {
        const size_t i = static_cast<size_t>(row) * slots + slot;
        pair_layers[i] = chosen[slot];
        pair_layers[items + i] = entries + chosen[slot];
        pair_rows[i] = row;
        pair_rows[items + i] = row;
    }
    float total = 0.f;
    for (int slot = 0; slot < top_k; ++slot) total += probability[chosen[slot]];
    for (int slot = 0; slot < top_k; ++slot) {
        float w = probability[chosen[slot]];
        if (normalize) w /= total + 1e-20f;
        weights_out[static_cast<size_t>(row) * slots + slot] = w * scaling;
    }
    if (slots > top_k) weights_out[static_cast<size_t>(row) * slots + top_k] = 1.0f;
    if (!prompt_layers) return;
    // A prompt row's items go to the prompt kernels, a generated row's to the GEMV: each path sees
    // layer -1 for the other's items.
    const bool prompt = row_prompt[row] != 0;
    for (int slot = 0; slot < slots; ++slot) {
        const size_t i = static_cast<size_t>(row) * slots + slot;
        prompt_layers[i] = prompt ? chosen[slot] : -1;
        if (!prompt) continue;
        chosen[slot] = -1;
        pair_layers[i] = -1;
        pair_layers[items + i] = -1;
    }
}

// out[row] = Σ_slot weight · expert_out[row·top_k + slot] in slot (= ascending expert) order, then
// + shared[row] when given.
extern "C" __global__ void tf_moe_combine(const float* __restrict__ expert_out, const float* __restrict__ weights,
                                          const float* __restrict__ shared, float* __restrict__ out,
                                          int rows, int top_k, int hidden) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * hidden) return;
    const int row = i / hidden;
    const int d = i % hidden;
    float sum = 0.f;
    for (int slot = 0; slot < top_k; ++slot)
        sum += expert_out[(static_cast<size_t>(row) * top_k + slot) * hidden + d] * weights[row * top_k + slot];
    if (shared) sum += shared[i];
    out[i] = sum;
}

// ---- sampling support ----

// Device twin of core/logits_summary.zig's LogitsSummary.
struct LogitsSummary {
    double log_total;
    float max;
    uint32_t argmax;
};

// Per logits row: the highest logit, its token (the lowest id on a tie) and log Σ exp(l − max),
// summed in f64 (as the host does) over a fixed tree. One 1024-thread block per row.
extern "C" __global__ void __launch_bounds__(1024) tf_logits_summary(const float* __restrict__ logits, LogitsSummary* __restrict__ out,
                                                                     int rows, int vocab) {
    __shared__ float best_sh[32];
    __shared__ int index_sh[32];
    __shared__ double sum_sh[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* in = logits + static_cast<size_t>(row) * vocab;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    float best = -INFINITY;
    int index = vocab;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = in[i];
        if (v > best || index == vocab) { best = v; index = i; }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, best, offset);
        const int other_index = __shfl_xor_sync(0xFFFFFFFFu, index, offset);
        if (other > best || (other == best && other_index < index)) { best = other; index = other_index; }
    }
    if (lane == 0) { best_sh[warp] = best; index_sh[warp] = index; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w) {
            if (best_sh[w] > best_sh[0] || (best_sh[w] == best_sh[0] && index_sh[w] < index_sh[0])) {
                best_sh[0] = best_sh[w];
                index_sh[0] = index_sh[w];
            }
        }
    }
    __syncthreads();
    const float max = best_sh[0];
    double sum = 0.0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) sum += exp(static_cast<double>(in[i] - max));
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
    if (lane == 0) sum_sh[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) total += sum_sh[w];
        out[row] = {static_cast<double>(max) + log(total), max, static_cast<uint32_t>(index_sh[0])};
    }
}
