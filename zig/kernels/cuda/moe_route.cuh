// The MoE router and the experts' combine, part of glm_forward.cu's module. Included once, by
// glm_forward.cu, after the helpers it uses.
#pragma once
#include "grid_dependency.cuh"
#include "last_block.cuh"
#include "moe_combine.cuh"

// ---- MoE ----

// The router in one launch (GLM.md §3.8), f32. Logits: a warp per (row, expert), 8 per block
// across many blocks, so the router's weights (experts × hidden f32, 2 MB for GLM-4.5-Air) are read
// by the whole GPU, not by one block per row: probability = sigmoid(x · gate_e), choice =
// probability + correction, to `scratch`. The last of a row's blocks to finish (a counter per row,
// which it resets) then picks the row's experts from its scratch: on the choice scores
// (group-limited when groups > 1), weights from the unbiased sigmoid, normalised, scaled. It writes
// the row's experts in ascending index and their weights, `slots` per row: top_k, or top_k + 1 with
// the merged shared expert last. (Two launches before, the logits and the choice, cost a launch's
// gap per MoE layer: 7.2-10.4 us on the step timeline.)
//
// For the gate/up launch of the experts, which runs 2·rows·top_k items, it also writes the items'
// layers (gate table entries 0..experts-1, then up entries experts..2·experts-1) and source rows.
// With `prompt_layers`, rows flagged in `row_prompt` take the prompt path: their experts go to
// prompt_layers and the GEMV's layers (experts_out, pair_layers) say -1, and the other way round.
constexpr int kRouteExpertsMax = 512;  // the host refuses more (glm_kernels.zig route)

namespace {
// Expert e's scores in a row's scratch from its logit: the sigmoid (its weight) and the sigmoid
// plus the correction bias (what tf_route picks by). One definition for the three launches that
// compute logits (tf_route's own, route_logits.cuh's two), so they write the same bits.
__device__ __forceinline__ void store_route_scores(float* row_scratch, int experts, int e, float logit, const float* __restrict__ correction) {
    const float p = 1.0f / (1.0f + expf(-logit));
    row_scratch[e] = p;
    row_scratch[experts + e] = p + correction[e];
}
}  // namespace

// Two blocks per SM as bounds: ptxas otherwise caps it at 32 registers on sm_90 (64 on sm_80-89)
// and spills the logits' eight float4 loads in flight.
extern "C" __global__ void __launch_bounds__(256, 2) tf_route(const float* __restrict__ x, const float* __restrict__ gate,
                                                           const float* __restrict__ correction, float* __restrict__ scratch,
                                                           unsigned int* __restrict__ counters, int* __restrict__ experts_out,
                                                           float* __restrict__ weights_out, int* __restrict__ pair_layers,
                                                           int* __restrict__ pair_rows, const int* __restrict__ row_prompt,
                                                           int* __restrict__ prompt_layers, int rows, int hidden, int experts, int top_k,
                                                           int slots, int groups, int groups_per_token, int normalize, float scaling) {
    tf_wait_prior_grid();
    __shared__ float probability[kRouteExpertsMax];
    __shared__ float choice[kRouteExpertsMax];
    __shared__ int picked[kRouteExpertsMax];  // by rank
    __shared__ int sorted[kRouteExpertsMax + 1];  // by expert index, then the merged shared expert
    __shared__ float route_total;
    __shared__ bool last_block;
    const int row = blockIdx.y;
    const int warp = threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (row >= rows) return;
    float* row_scratch = scratch + static_cast<size_t>(row) * 2 * experts;
    const int e = blockIdx.x * (blockDim.x / kWarp) + warp;
    // No gate: tf_route_logits has written the row's scratch; the launch is one block a row.
    if (gate != nullptr && e < experts) {
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
        if (lane == 0) store_route_scores(row_scratch, experts, e, dot, correction);
    }
    if (!tf_last_block(counters + row, gridDim.x, &last_block)) return;
    for (int i = threadIdx.x; i < experts; i += blockDim.x) {
        probability[i] = __ldcg(row_scratch + i);
        const float c = __ldcg(row_scratch + experts + i);
        choice[i] = c != c ? -INFINITY : c;
    }
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
    // Top-k by rank, every expert at once: an expert's rank is the number of experts before it in
    // the total order (higher score first, the lower index on a tie: the CPU router's rule), and
    // the top_k of rank < top_k are the chosen. A warp's experts compare with the warps' before
    // and after theirs by one predicate each; only their own 32 need the index too. (Warp 0 alone
    // picking one slot at a time took eight rounds of shuffles, and thread 0 sorted the picks in
    // global memory, a chain of round trips at the end of every MoE layer.) A NaN score counts as
    // -inf, so the order stays total.
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        const float c = choice[e];
        const int base = e - lane;  // this warp's first expert
        int rank = 0;
        for (int j = 0; j < base; ++j) rank += choice[j] >= c;
        for (int j = base; j < base + kWarp && j < experts; ++j) {
            const float o = choice[j];
            rank += o > c || (o == c && j < e);
        }
        for (int j = base + kWarp; j < experts; ++j) rank += choice[j] > c;
        if (rank < top_k) picked[rank] = e;
    }
    __syncthreads();
    if (warp != 0) return;
    // The picks in ascending expert index (the CPU's summation order): each slot's place is the
    // number of picks below it.
    for (int s = lane; s < top_k; s += kWarp) {
        const int e = picked[s];
        int place = 0;
        for (int t = 0; t < top_k; ++t) place += picked[t] < e;
        sorted[place] = e;
    }
    // A merged shared expert (slots = top_k + 1) is table entry `experts`, last, with weight 1.
    if (lane == 0 && slots > top_k) sorted[top_k] = experts;
    __syncwarp();
    if (lane == 0) {
        float total = 0.f;
        for (int slot = 0; slot < top_k; ++slot) total += probability[sorted[slot]];
        route_total = total;
    }
    __syncwarp();
    const int entries = experts + (slots > top_k);  // table entries per projection
    const size_t items = static_cast<size_t>(rows) * slots;
    // A prompt row's items go to the prompt kernels, a generated row's to the GEMV: each path sees
    // layer -1 for the other's items.
    const bool prompt = prompt_layers && row_prompt[row] != 0;
    for (int slot = lane; slot < slots; slot += kWarp) {
        const size_t i = static_cast<size_t>(row) * slots + slot;
        const int e = sorted[slot];
        float w = 1.0f;
        if (slot < top_k) {
            w = probability[e];
            if (normalize) w /= route_total + 1e-20f;
            w *= scaling;
        }
        weights_out[i] = w;
        experts_out[i] = prompt ? -1 : e;
        pair_layers[i] = prompt ? -1 : e;
        pair_layers[items + i] = prompt ? -1 : entries + e;
        pair_rows[i] = row;
        pair_rows[items + i] = row;
        if (prompt_layers) prompt_layers[i] = prompt ? e : -1;
    }
}

// out[row] = the experts' combine (moe_combine.cuh).
extern "C" __global__ void tf_moe_combine(const float* __restrict__ expert_out, const float* __restrict__ weights,
                                          const float* __restrict__ shared, float* __restrict__ out,
                                          int rows, int top_k, int hidden) {
    tf_wait_prior_grid();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * hidden) return;
    out[i] = moe_combined(expert_out, weights, shared, i / hidden, i % hidden, top_k, hidden);
}
