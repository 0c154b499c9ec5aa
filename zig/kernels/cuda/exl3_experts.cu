// The fused prompt (prefill) path of EXL3 linears over many rows, on tensor cores. Three launches
// run an MLP (the routed experts of a layer, or one dense/shared MLP) over a chunk's prompt rows,
// after tf_exl3_group_items (glm_forward.cu) has sorted the items by layer into groups of up to 64
// (or 32, the slim entries below):
//
//   tf_exl3_prompt_rotate   x (or silu(x)·up) ⊙ suh, 128-point Hadamard, as fp16 high/low planes,
//                           one per input operand (gate and up each have their own suh)
//   tf_exl3_prompt_gu{,3,2} gate and up of a group over 128 intermediate columns in one block;
//                           the epilogue rotates both outputs back (Hadamard, svh), applies SwiGLU,
//                           and rotates the product into down's input (suh, Hadamard) as planes
//   tf_exl3_prompt_down{,3,2} a group over 256 output columns: Hadamard, svh and bias out, into the
//                           item's row of y (the routing weights and the sum over experts stay in
//                           tf_moe_combine, in slot order)
//
// A plain linear is the rotate launch and the down launch, or tf_exl3_prompt_narrow{,3,2} (one
// tile column a warp: twice the blocks, the same bits) where down's blocks would not fill the GPU;
// a weight of few columns, tf_exl3_prompt_deep{,3,2}{,w} over k ranges and their sum. The number
// is the trellis rate K (none: 4 bits); the codebook is a run-time switch around the whole body.
// Host side: zig/src/cuda/exl3_prompt.zig.
#include <cuda_fp16.h>
#include "grid_dependency.cuh"
#include <stdint.h>

#include "exl3_codebook.cuh"
#include "exl3_hadamard.cuh"
#include "exl3_prompt.cuh"
#include "exl3_prompt_wgmma.cuh"
#include "swiglu.cuh"

namespace {

using tf::hadamard128;
using tf::kEpiloguePitch;
using tf::kPromptRows;
using tf::kPromptWarps;

struct Exl3Layer {  // the same layout as glm_forward.cu's
    const uint16_t* words;
    const uint16_t* suh;
    const uint16_t* svh;
    const float* bias;
};

struct Groups {
    const int* sorted_items;  // slot -> item
    const int* first;
    const int* count;
    const int* layer;
    const int* total;
};

__device__ __forceinline__ float half_bits(const uint16_t* p, int i) { return __half2float(__ushort_as_half(p[i])); }

// Slots in use: the groups are contiguous and in order.
__device__ __forceinline__ int used_slots(const Groups& g) {
    const int total = *g.total;
    return total == 0 ? 0 : g.first[total - 1] + g.count[total - 1];
}

__device__ __forceinline__ void store_planes(const tf::RotatedPlanes& out, int op, int slot, int k, const float (&v)[4]) {
    half hi[4], lo[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) tf::split_half(v[i], hi[i], lo[i]);
    const size_t at = static_cast<size_t>(slot) * out.k_p + k;
    *reinterpret_cast<uint2*>(out.plane(op, 0) + at) = *reinterpret_cast<const uint2*>(hi);
    *reinterpret_cast<uint2*>(out.plane(op, 1) + at) = *reinterpret_cast<const uint2*>(lo);
}

// A block's group: the groups in reverse, so that a merged shared expert (the last table entry,
// every row's item: whole groups) runs first and the launch ends on the routed experts' shorter
// ones. Past the group count, -1 (the grid is sized for the most groups a call can make).
__device__ __forceinline__ int block_group(const Groups& g) { return *g.total - 1 - static_cast<int>(blockIdx.y); }

// The slim kernels take the warpgroup products where the arch has them (sm_90a):
// exl3_prompt_wgmma.cuh.
template <int kCols, int kM>
__device__ __forceinline__ constexpr bool wgmma_form() { return tf::kPromptWgmma && kCols == 2 && kM == 2; }

template <int kCols, int kM>
__device__ __forceinline__ void stage(const tf::PromptAccOf<kCols, kM>& acc, int pass, float* staged) {
    if constexpr (wgmma_form<kCols, kM>()) tf::stage_accumulators_wgmma(acc, pass, staged);
    else tf::stage_accumulators<kCols, kM>(acc, pass, staged);
}

// The ring of tile column `column` of `layer` at tile row 0, and the words between tile rows.
__device__ __forceinline__ const uint32_t* tile_column(const Exl3Layer& layer, int column, int bits2) {
    return reinterpret_cast<const uint32_t*>(layer.words) + static_cast<size_t>(column) * 4 * bits2;
}

template <int K, int CB, int kM>
__device__ __forceinline__ void gu_body(const Exl3Layer* __restrict__ table, int up_offset, const Exl3Layer* __restrict__ down_table,
                                        const Groups& g, tf::RotatedPlanes in, tf::RotatedPlanes out, int n_p, int width,
                                        unsigned char* shared) {
    const int group = block_group(g);
    if (group < 0) return;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int chunk = blockIdx.x;
    const int first = g.first[group];
    const int rows = g.count[group];
    const int layer = g.layer[group];
    const int column = chunk * kPromptWarps + warp;
    const uint32_t* const ring[2] = {tile_column(table[layer], column, 2 * K), tile_column(table[layer + up_offset], column, 2 * K)};
    tf::PromptAccOf<2, kM> acc;
    if constexpr (wgmma_form<2, kM>())
        tf::prompt_matmul_wgmma<K, CB, 2>(ring, static_cast<size_t>(n_p / 16) * 8 * K, in, first, rows, 0, in.k_p / tf::kPromptSlab,
                                          reinterpret_cast<half*>(shared), acc);
    else
        tf::prompt_matmul<K, CB, 2, 2, kM>(ring, static_cast<size_t>(n_p / 16) * 8 * K, in, first, rows, 0, in.k_p / tf::kPromptSlab,
                                           reinterpret_cast<half*>(shared), acc);

    // The epilogue's scales are read after the products: no registers held across them.
    const uint16_t* gate_svh = table[layer].svh;
    const uint16_t* up_svh = table[layer + up_offset].svh;
    const uint16_t* down_suh = down_table[layer].suh;
    constexpr int kPass = tf::epilogue_rows(kM);
    float* staged = reinterpret_cast<float*>(shared);
    for (int pass = 0; pass * kPass < rows; ++pass) {
        stage<2, kM>(acc, pass, staged);
        __syncthreads();
        for (int r = warp; r < kPass && pass * kPass + r < rows; r += kPromptWarps) {
            float gv[4], uv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                gv[i] = staged[r * kEpiloguePitch + 4 * lane + i];
                uv[i] = staged[(kPass + r) * kEpiloguePitch + 4 * lane + i];
            }
            hadamard128(gv);
            hadamard128(uv);
            float h[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int n = chunk * 128 + 4 * lane + i;
                const float gate_value = gv[i] * half_bits(gate_svh, n);
                const float up_value = uv[i] * half_bits(up_svh, n);
                // Columns past gate's out_features are padding: down reads zeros there.
                h[i] = n < width ? tf::swiglu(gate_value, up_value) * half_bits(down_suh, n) : 0.f;
            }
            hadamard128(h);
            store_planes(out, 0, first + pass * kPass + r, chunk * 128 + 4 * lane, h);
        }
        __syncthreads();
    }
}

// A block per (128·kCols output columns, group). kCols = 2: each warp takes two tile columns
// (tf_exl3_prompt_down); 1: one (tf_exl3_prompt_narrow: twice the blocks, for a narrow weight or a
// short chunk). The same chains either way, so the same bits: the host picks by the shape and the
// chunk's rows (exl3_prompt.zig, LinearForm). kDeep (tf_exl3_prompt_deep{,w}, either form):
// block z of gridDim.z takes the z-th of as many equal k ranges and writes its rotated, scaled
// partial to y[(z·slots + item)·out_features + n], which tf_exl3_prompt_deep_sum adds in z order
// with the bias: a narrow weight's few column blocks times the splits fill the GPU.
template <int K, int CB, int kCols = 2, bool kDeep = false, int kM = tf::kPromptM>
__device__ __forceinline__ void down_body(const Exl3Layer* __restrict__ table, const Groups& g, tf::RotatedPlanes in, float* __restrict__ y,
                                          int n_p, int out_features, unsigned char* shared) {
    const int group = block_group(g);
    if (group < 0) return;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int first = g.first[group];
    const int rows = g.count[group];
    const Exl3Layer layer = table[g.layer[group]];
    const int column = blockIdx.x * kCols * kPromptWarps + warp;
    const bool second = kCols == 2 && (column + kPromptWarps) * 16 < n_p;
    const uint32_t* ring[kCols];
    ring[0] = tile_column(layer, column, 2 * K);
    if constexpr (kCols == 2) ring[1] = second ? tile_column(layer, column + kPromptWarps, 2 * K) : nullptr;
    tf::PromptAccOf<kCols, kM> acc;
    const int slabs = in.k_p / tf::kPromptSlab;
    const int split = kDeep ? static_cast<int>(blockIdx.z) : 0;
    const int splits = kDeep ? static_cast<int>(gridDim.z) : 1;
    if constexpr (wgmma_form<kCols, kM>())
        tf::prompt_matmul_wgmma<K, CB, 1>(ring, static_cast<size_t>(n_p / 16) * 8 * K, in, first, rows, split * slabs / splits,
                                          (split + 1) * slabs / splits, reinterpret_cast<half*>(shared), acc);
    else
        tf::prompt_matmul<K, CB, 1, kCols, kM>(ring, static_cast<size_t>(n_p / 16) * 8 * K, in, first, rows, split * slabs / splits,
                                               (split + 1) * slabs / splits, reinterpret_cast<half*>(shared), acc);
    if constexpr (kDeep) y += static_cast<size_t>(split) * in.slots * out_features;

    constexpr int kPass = tf::epilogue_rows(kM);
    float* staged = reinterpret_cast<float*>(shared);
    const int halves = second ? 2 : 1;
    for (int pass = 0; pass * kPass < rows; ++pass) {
        stage<kCols, kM>(acc, pass, staged);
        __syncthreads();
        for (int task = warp; task < kPass * halves; task += kPromptWarps) {
            const int r = task / halves;
            const int c = task % halves;
            if (pass * kPass + r >= rows) break;
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = staged[(c * kPass + r) * kEpiloguePitch + 4 * lane + i];
            hadamard128(v);
            const int item = g.sorted_items[first + pass * kPass + r];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int n = blockIdx.x * 128 * kCols + c * 128 + 4 * lane + i;
                if (n >= out_features) continue;
                float value = v[i] * half_bits(layer.svh, n);
                if (!kDeep && layer.bias) value += layer.bias[n];
                y[static_cast<size_t>(item) * out_features + n] = value;
            }
        }
        __syncthreads();
    }
}

// tf_exl3_prompt_gu{,3,2}: gu_body over groups of up to 64 rows.
template <int K, int CB>
__device__ __forceinline__ void gu_body_64(const Exl3Layer* __restrict__ table, int up_offset, const Exl3Layer* __restrict__ down_table,
                                           const Groups& g, tf::RotatedPlanes in, tf::RotatedPlanes out, int n_p, int width,
                                           unsigned char* shared) {
    gu_body<K, CB, 4>(table, up_offset, down_table, g, in, out, n_p, width, shared);
}

// The slim entries (tf_exl3_prompt_{gu,down}{,3,2}_32) for groups of up to 32 rows: half the
// accumulators and half the shared memory, three blocks per SM where the 64-row kernels fit two
// (on sm_80-89 and on the GB10's 100 KB SMs alike; on sm_90a they run on the warpgroup products,
// exl3_prompt_wgmma.cuh, two blocks an SM). A routed expert of a short chunk holds ~18 rows
// (GLM-4.5-Air, 256 rows x 9 slots over 129 entries), so its decoded tiles serve a quarter of the
// 64-row kernels' rows, and those kernels wait on the decode's chains with 4 warps a scheduler
// (docs/measurements.md, 2026-11-29).
template <int K, int CB>
__device__ __forceinline__ void gu_body_32(const Exl3Layer* __restrict__ table, int up_offset, const Exl3Layer* __restrict__ down_table,
                                           const Groups& g, tf::RotatedPlanes in, tf::RotatedPlanes out, int n_p, int width,
                                           unsigned char* shared) {
    gu_body<K, CB, 2>(table, up_offset, down_table, g, in, out, n_p, width, shared);
}
template <int K, int CB>
__device__ __forceinline__ void down_body_32(const Exl3Layer* __restrict__ table, const Groups& g, tf::RotatedPlanes in, float* __restrict__ y,
                                             int n_p, int out_features, unsigned char* shared) {
    down_body<K, CB, 2, false, 2>(table, g, in, y, n_p, out_features, shared);
}

// tf_exl3_prompt_narrow{,3,2}: down_body with one tile column a warp.
template <int K, int CB>
__device__ __forceinline__ void narrow_body(const Exl3Layer* __restrict__ table, const Groups& g, tf::RotatedPlanes in, float* __restrict__ y,
                                            int n_p, int out_features, unsigned char* shared) {
    down_body<K, CB, 1>(table, g, in, y, n_p, out_features, shared);
}

// tf_exl3_prompt_deep{,3,2}: narrow_body over one of gridDim.z k ranges, its partial to y's split.
template <int K, int CB>
__device__ __forceinline__ void deep_body(const Exl3Layer* __restrict__ table, const Groups& g, tf::RotatedPlanes in, float* __restrict__ y,
                                          int n_p, int out_features, unsigned char* shared) {
    down_body<K, CB, 1, true>(table, g, in, y, n_p, out_features, shared);
}

// tf_exl3_prompt_deep{,3,2}w: the same k ranges with two tile columns a warp (down's form), for a
// split weight's long chunks: the same chains, so the same bits as deep_body.
template <int K, int CB>
__device__ __forceinline__ void deep_wide_body(const Exl3Layer* __restrict__ table, const Groups& g, tf::RotatedPlanes in,
                                               float* __restrict__ y, int n_p, int out_features, unsigned char* shared) {
    down_body<K, CB, 2, true>(table, g, in, y, n_p, out_features, shared);
}
}  // namespace

// One warp per (slot, 128 input channels), 8 per block; block y = slot. Item `sorted_items[slot]`
// reads row item / items_per_row of x (SwiGLU'd with `up` when given) and writes one plane pair
// per operand: table entry layer + op·op_stride's suh.
extern "C" __global__ void __launch_bounds__(256) tf_exl3_prompt_rotate(
    const float* __restrict__ x, const float* __restrict__ up, int items_per_row, const Exl3Layer* __restrict__ table,
    int ops, int op_stride, const int* __restrict__ sorted_items, const int* __restrict__ layer_of_item,
    const int* __restrict__ group_first, const int* __restrict__ group_count, const int* __restrict__ group_layer,
    const int* __restrict__ group_total, half* __restrict__ rotated, int slots, int in_features, int k_p) {
    tf_wait_prior_grid();
    const Groups g{sorted_items, group_first, group_count, group_layer, group_total};
    const int slot = blockIdx.y;
    const int chunk = blockIdx.x * kPromptWarps + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (chunk * 128 >= k_p || slot >= used_slots(g)) return;
    const int item = sorted_items[slot];
    const int row = item / items_per_row;
    const int layer = layer_of_item ? layer_of_item[item] : 0;
    float x_in[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int k = chunk * 128 + 4 * lane + i;
        float value = 0.f;
        if (k < in_features) {
            value = x[static_cast<size_t>(row) * in_features + k];
            if (up) value = tf::swiglu(value, up[static_cast<size_t>(row) * in_features + k]);
        }
        x_in[i] = value;
    }
    const tf::RotatedPlanes out{rotated, slots, k_p};
    for (int op = 0; op < ops; ++op) {
        const uint16_t* suh = table[layer + op * op_stride].suh;
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int k = chunk * 128 + 4 * lane + i;
            v[i] = k < in_features ? x_in[i] * half_bits(suh, k) : 0.f;
        }
        hadamard128(v);
        store_planes(out, op, slot, chunk * 128 + 4 * lane, v);
    }
}

#define TF_PROMPT_SWITCH(BODY, K, ...)                                      \
    switch (codebook) {                                                     \
        case tf::kInst3: BODY<K, tf::kInst3>(__VA_ARGS__); break;          \
        case tf::kMcg: BODY<K, tf::kMcg>(__VA_ARGS__); break;              \
        default: BODY<K, tf::kMul1>(__VA_ARGS__); break;                   \
    }

// Block (128 intermediate columns, group). in: k_p = hidden; out: n_p = intermediate padded,
// width = gate's out_features.
#define TF_PROMPT_GU(NAME, K, BODY, ROWS, BLOCKS)                                                                               \
    extern "C" __global__ void __launch_bounds__(256, BLOCKS) NAME(                                                             \
        const Exl3Layer* __restrict__ table, int up_offset, const Exl3Layer* __restrict__ down_table,                           \
        const int* __restrict__ sorted_items, const int* __restrict__ group_first, const int* __restrict__ group_count,         \
        const int* __restrict__ group_layer, const int* __restrict__ group_total, half* rotated, half* down_in, int slots,      \
        int k_p, int n_p, int width, int codebook) {                                                                            \
        tf_wait_prior_grid();                                                                                                   \
        __shared__ __align__(16) unsigned char shared[tf::prompt_shared_bytes(2, ROWS)];                                        \
        const Groups g{sorted_items, group_first, group_count, group_layer, group_total};                                       \
        TF_PROMPT_SWITCH(BODY, K, table, up_offset, down_table, g, tf::RotatedPlanes{rotated, slots, k_p},                  \
                         tf::RotatedPlanes{down_in, slots, n_p}, n_p, width, shared)                                            \
    }

// Block (256 output columns, group): down_body; or (128 output columns, group): narrow_body.
#define TF_PROMPT_OUT(NAME, K, BODY, SHARED, BLOCKS)                                                                            \
    extern "C" __global__ void __launch_bounds__(256, BLOCKS) NAME(                                                             \
        const Exl3Layer* __restrict__ table, const int* __restrict__ sorted_items, const int* __restrict__ group_first,         \
        const int* __restrict__ group_count, const int* __restrict__ group_layer, const int* __restrict__ group_total,          \
        half* rotated, float* __restrict__ y, int slots, int k_p, int n_p, int out_features, int codebook) {                    \
        tf_wait_prior_grid();                                                                                                   \
        __shared__ __align__(16) unsigned char shared[SHARED];                                                                  \
        const Groups g{sorted_items, group_first, group_count, group_layer, group_total};                                       \
        TF_PROMPT_SWITCH(BODY, K, table, g, tf::RotatedPlanes{rotated, slots, k_p}, y, n_p, out_features, shared)              \
    }

TF_PROMPT_GU(tf_exl3_prompt_gu, 4, gu_body_64, 64, 2)
TF_PROMPT_GU(tf_exl3_prompt_gu3, 3, gu_body_64, 64, 2)
TF_PROMPT_GU(tf_exl3_prompt_gu2, 2, gu_body_64, 64, 2)
TF_PROMPT_GU(tf_exl3_prompt_gu_32, 4, gu_body_32, 32, (tf::kPromptWgmma ? 2 : 3))
TF_PROMPT_GU(tf_exl3_prompt_gu3_32, 3, gu_body_32, 32, (tf::kPromptWgmma ? 2 : 3))
TF_PROMPT_GU(tf_exl3_prompt_gu2_32, 2, gu_body_32, 32, (tf::kPromptWgmma ? 2 : 3))
TF_PROMPT_OUT(tf_exl3_prompt_down, 4, down_body, tf::prompt_shared_bytes(2), 2)
TF_PROMPT_OUT(tf_exl3_prompt_down3, 3, down_body, tf::prompt_shared_bytes(2), 2)
TF_PROMPT_OUT(tf_exl3_prompt_down2, 2, down_body, tf::prompt_shared_bytes(2), 2)
TF_PROMPT_OUT(tf_exl3_prompt_down_32, 4, down_body_32, tf::prompt_shared_bytes(2, 32), (tf::kPromptWgmma ? 2 : 3))
TF_PROMPT_OUT(tf_exl3_prompt_down3_32, 3, down_body_32, tf::prompt_shared_bytes(2, 32), (tf::kPromptWgmma ? 2 : 3))
TF_PROMPT_OUT(tf_exl3_prompt_down2_32, 2, down_body_32, tf::prompt_shared_bytes(2, 32), (tf::kPromptWgmma ? 2 : 3))
TF_PROMPT_OUT(tf_exl3_prompt_narrow, 4, narrow_body, tf::prompt_shared_bytes(1), 2)
TF_PROMPT_OUT(tf_exl3_prompt_narrow3, 3, narrow_body, tf::prompt_shared_bytes(1), 2)
TF_PROMPT_OUT(tf_exl3_prompt_narrow2, 2, narrow_body, tf::prompt_shared_bytes(1), 2)
TF_PROMPT_OUT(tf_exl3_prompt_deep, 4, deep_body, tf::prompt_shared_bytes(1), 2)
TF_PROMPT_OUT(tf_exl3_prompt_deep3, 3, deep_body, tf::prompt_shared_bytes(1), 2)
TF_PROMPT_OUT(tf_exl3_prompt_deep2, 2, deep_body, tf::prompt_shared_bytes(1), 2)
TF_PROMPT_OUT(tf_exl3_prompt_deepw, 4, deep_wide_body, tf::prompt_shared_bytes(1), 2)
TF_PROMPT_OUT(tf_exl3_prompt_deep3w, 3, deep_wide_body, tf::prompt_shared_bytes(1), 2)
TF_PROMPT_OUT(tf_exl3_prompt_deep2w, 2, deep_wide_body, tf::prompt_shared_bytes(1), 2)

// After tf_exl3_prompt_deep{,3,2}: y[item] = the splits' partials added in split order, plus the
// bias (table entry 0's: a plain linear's). A block per (256 columns, slot in use).
extern "C" __global__ void __launch_bounds__(256) tf_exl3_prompt_deep_sum(
    const Exl3Layer* __restrict__ table, const int* __restrict__ sorted_items, const int* __restrict__ group_first,
    const int* __restrict__ group_count, const int* __restrict__ group_layer, const int* __restrict__ group_total,
    const float* __restrict__ partials, float* __restrict__ y, int slots, int out_features, int splits) {
    tf_wait_prior_grid();
    const Groups g{sorted_items, group_first, group_count, group_layer, group_total};
    const int slot = blockIdx.y;
    const int n = blockIdx.x * 256 + threadIdx.x;
    if (n >= out_features || slot >= used_slots(g)) return;
    const size_t item = sorted_items[slot];
    const size_t stride = static_cast<size_t>(slots) * out_features;
    float sum = partials[item * out_features + n];
    for (int split = 1; split < splits; ++split) sum = __fadd_rn(sum, partials[split * stride + item * out_features + n]);
    const float* bias = table[0].bias;
    if (bias) sum = __fadd_rn(sum, bias[n]);
    y[item * out_features + n] = sum;
}
