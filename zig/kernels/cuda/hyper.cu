// Manifold-constrained hyper-connections (GLM-5.3-Flash's residual) on the GPU, as
// zig/src/families/glm/parts/hyper.zig computes them on the CPU: a row carries m residual streams
// (rows, m, D); a site's maps come from the unweighted RMS norm of the flattened streams through
// the (2m + m², m·D) mixing matrix. The host half is zig/src/cuda/hyper_kernels.zig.
#include <stdint.h>
#include "grid_dependency.cuh"
#include "moe_combine.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMultMax = 5;  // config.zig hyper_mult_max: comb's m² entries fit a warp

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

}  // namespace

// The mixing logits, raw: a block per (row, logit) takes one dot product of the row's flattened
// streams with a row of the mixing matrix (a decode step's row spreads over 2m + m² blocks, where
// one block per row read the whole 1.5 MB matrix alone: 165 us a site at GLM-5.3-Flash's size);
// block (row, mixes) takes the streams' sum of squares. Fixed orders: a row's bits are its own.
// raw[row]: the 2m + m² dots, then the sum of squares. Where m·hidden is a multiple of 16,
// glm_forward.cu's tf_dense_f32 computes both on the tensor cores instead (hyper_cuda.zig).
extern "C" __global__ void __launch_bounds__(kThreads) tf_hc_mix(const float* __restrict__ streams, const float* __restrict__ mix,
                                                                float* __restrict__ raw, int rows, int m, int hidden) {
    tf_wait_prior_grid();
    __shared__ float partial[kWarps];
    const int row = blockIdx.x, j = blockIdx.y;
    const int mixes = (2 + m) * m;
    if (row >= rows || j > mixes) return;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int width = m * hidden;
    const float* x = streams + static_cast<size_t>(row) * width;
    const float* w = j < mixes ? mix + static_cast<size_t>(j) * width : x;
    float sum = 0.f;
    for (int i = threadIdx.x; i < width; i += kThreads) sum = fmaf(w[i], x[i], sum);
    sum = warp_sum(sum);
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.f;
        for (int v = 0; v < kWarps; ++v) total += partial[v];
        raw[static_cast<size_t>(row) * (mixes + 1) + j] = total;
    }
}

// A warp per row: the logits scaled by the norm's inverse (the flattened streams' unweighted RMS
// norm, applied after the dot products), then the maps. The logits and the sum of squares come as
// `splits` partial sums each, sums[(row·(mixes + 1) + j)·splits + s] (glm_forward.cu's
// tf_dense_f32 leaves them so; tf_hc_mix's raw is the case splits = 1), added here in split
// order: the launch that added them on its own cost ~3 us a site. Lane (a, b) < m² owns comb's entry: each
// softmax and Sinkhorn pass gathers its row or column by shuffles and sums it in the CPU's order
// (one thread doing all 40 passes took 56 us, a block with barriers 20). m is a template argument
// so that a pass's m shuffles issue together instead of one loop trip each (8.5 us a site at m 4
// with a runtime m). maps[row]: pre (m), post (m), comb (m²). `pre_ready` runs once pre and post
// are in `out`, before the Sinkhorn passes: tf_hc_enter's collapse needs only pre.
template <int M, typename Ready>
__device__ __forceinline__ void hc_maps(const float* __restrict__ sums, int splits, const float* __restrict__ base,
                                        const float* __restrict__ scale, float* __restrict__ out, int hidden, float norm_eps,
                                        float hc_eps, int iters, Ready pre_ready) {
    constexpr int kMixes = (2 + M) * M;
    const int t = threadIdx.x;
    // Lane t adds up value t and t + 32 (m = 5 has 36 values).
    const auto total = [&](int j) {
        if (j > kMixes) return 0.f;
        const float* part = sums + static_cast<size_t>(j) * splits;
        float sum = 0.f;
        for (int s0 = 0; s0 < splits; s0 += 8) {
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = s0 + i < splits ? part[s0 + i] : 0.f;
#pragma unroll
            for (int i = 0; i < 8; ++i) sum += v[i];
        }
        return sum;
    };
    const float low = total(t), high = total(t + kWarp);
    const auto logit = [&](int j) {
        const float lo = __shfl_sync(0xFFFFFFFFu, low, j % kWarp), hi = __shfl_sync(0xFFFFFFFFu, high, j % kWarp);
        return j < kWarp ? lo : hi;
    };
    const float inverse = 1.0f / sqrtf(logit(kMixes) / (M * hidden) + norm_eps);
    const float pre = logit(t % M), post = logit(M + t % M);
    if (t < M) {
        out[t] = sigmoid(pre * inverse * scale[0] + base[t]) + hc_eps;
        out[M + t] = 2.0f * sigmoid(post * inverse * scale[1] + base[M + t]);
    }
    pre_ready();
    const bool owner = t < M * M;
    const int a = owner ? t / M : 0, b = owner ? t % M : 0;
    const float comb = logit(2 * M + (owner ? t : 0));
    float v = owner ? comb * inverse * scale[2] + base[2 * M + t] : 0.f;
    const auto gather = [&](float x, int first, int step, float (&line)[M]) {
#pragma unroll
        for (int j = 0; j < M; ++j) line[j] = __shfl_sync(0xFFFFFFFFu, x, first + j * step);
    };
    const auto sum = [](const float (&line)[M]) {
        float total = 0.f;
#pragma unroll
        for (int j = 0; j < M; ++j) total += line[j];
        return total;
    };
    float line[M];
    gather(v, a * M, 1, line);
    float peak = -INFINITY;
#pragma unroll
    for (int j = 0; j < M; ++j) peak = fmaxf(peak, line[j]);
    v = expf(v - peak);
    gather(v, a * M, 1, line);
    v = v / sum(line) + hc_eps;
    for (int pass = 0; pass < 2 * iters - 1; ++pass) {
        // Columns first, then rows and columns in turn.
        if (pass % 2 == 0)
            gather(v, b, M, line);
        else
            gather(v, a * M, 1, line);
        v /= sum(line) + hc_eps;
    }
    if (owner) out[2 * M + t] = v;
}

// One row's maps from its sums (sums[j·splits + s]) into out, by the 32 lanes of one warp.
template <typename Ready>
__device__ __forceinline__ void hc_maps_row(const float* __restrict__ sums, int splits, const float* __restrict__ base,
                                            const float* __restrict__ scale, float* __restrict__ out, int m, int hidden, float norm_eps,
                                            float hc_eps, int iters, Ready pre_ready) {
    static_assert(kMultMax == 5 && (2 + kMultMax) * kMultMax + 1 <= 2 * kWarp, "an instance per m; two values per lane");
    switch (m) {
        case 1: return hc_maps<1>(sums, splits, base, scale, out, hidden, norm_eps, hc_eps, iters, pre_ready);
        case 2: return hc_maps<2>(sums, splits, base, scale, out, hidden, norm_eps, hc_eps, iters, pre_ready);
        case 3: return hc_maps<3>(sums, splits, base, scale, out, hidden, norm_eps, hc_eps, iters, pre_ready);
        case 4: return hc_maps<4>(sums, splits, base, scale, out, hidden, norm_eps, hc_eps, iters, pre_ready);
        default: return hc_maps<5>(sums, splits, base, scale, out, hidden, norm_eps, hc_eps, iters, pre_ready);
    }
}

extern "C" __global__ void __launch_bounds__(kWarp) tf_hc_maps(const float* __restrict__ sums, int splits, const float* __restrict__ base,
                                                              const float* __restrict__ scale, float* __restrict__ maps, int rows, int m,
                                                              int hidden, float norm_eps, float hc_eps, int iters) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    if (row >= rows) return;
    const int mixes = (2 + m) * m;
    hc_maps_row(sums + static_cast<size_t>(row) * (mixes + 1) * splits, splits, base, scale, maps + static_cast<size_t>(row) * mixes, m, hidden,
                norm_eps, hc_eps, iters, [] {});
}

// The sublayer's input Σ_s pre_s·stream_s, a thread per (row, dim).
extern "C" __global__ void __launch_bounds__(kThreads) tf_hc_collapse(const float* __restrict__ streams, const float* __restrict__ maps,
                                                                     float* __restrict__ collapsed, int rows, int m, int hidden) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    const int d = blockIdx.y * kThreads + threadIdx.x;
    if (row >= rows || d >= hidden) return;
    const float* pre = maps + static_cast<size_t>(row) * (2 + m) * m;
    const float* x = streams + static_cast<size_t>(row) * m * hidden + d;
    float out = 0.f;
    for (int s = 0; s < m; ++s) out += pre[s] * x[static_cast<size_t>(s) * hidden];
    collapsed[static_cast<size_t>(row) * hidden + d] = out;
}

// The sublayer's input Σ_s pre_s·stream_s and its RMSNorm (weight, eps) in one block per row, the
// collapse kept in registers: tf_hc_collapse then glm_forward.cu's tf_rmsnorm, in one launch and
// the same operations in the same order (hidden % 4 == 0, hidden <= 4·kThreads·kNormCache).
constexpr int kNormCache = 8;

__device__ __forceinline__ void collapse_norm_row(const float* __restrict__ streams, const float* __restrict__ pre,
                                                  const float* __restrict__ weight, float* __restrict__ normed, int row, int m, int hidden,
                                                  float eps) {
    __shared__ float partial[kWarps];
    const float4* x = reinterpret_cast<const float4*>(streams + static_cast<size_t>(row) * m * hidden);
    const int n4 = hidden / 4;
    float4 v[kNormCache];
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kNormCache; ++j) {
        const int i = threadIdx.x + j * kThreads;
        v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i >= n4) continue;
        for (int s = 0; s < m; ++s) {
            const float4 in = x[static_cast<size_t>(s) * n4 + i];
            v[j].x += pre[s] * in.x;
            v[j].y += pre[s] * in.y;
            v[j].z += pre[s] * in.z;
            v[j].w += pre[s] * in.w;
        }
    }
#pragma unroll
    for (int j = 0; j < kNormCache; ++j) sum += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    sum = warp_sum(sum);
    if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = sum;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < kWarps; ++w) total += partial[w];
    const float inverse = 1.0f / sqrtf(total / hidden + eps);
    const float4* weight4 = reinterpret_cast<const float4*>(weight);
    float4* target = reinterpret_cast<float4*>(normed + static_cast<size_t>(row) * hidden);
#pragma unroll
    for (int j = 0; j < kNormCache; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i >= n4) continue;
        const float4 w = weight4[i];
        target[i] = make_float4(w.x * (v[j].x * inverse), w.y * (v[j].y * inverse), w.z * (v[j].z * inverse), w.w * (v[j].w * inverse));
    }
}

extern "C" __global__ void __launch_bounds__(kThreads) tf_hc_collapse_norm(const float* __restrict__ streams, const float* __restrict__ maps,
                                                                          const float* __restrict__ weight, float* __restrict__ normed,
                                                                          int rows, int m, int hidden, float eps) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    if (row >= rows) return;
    collapse_norm_row(streams, maps + static_cast<size_t>(row) * (2 + m) * m, weight, normed, row, m, hidden, eps);
}

// A site's entry in one block per row: the row's split sums staged in shared memory by the whole
// block (tf_hc_maps' one warp took 64 splits x 25 sums 8 loads at a time), its maps by warp 0 as
// tf_hc_maps computes them (the same sums in the same order), kept in shared memory and stored to
// `maps` for tf_hc_leave, and tf_hc_collapse_norm's collapse and norm: the same bits as those two
// launches, one launch a site fewer. The collapse needs only pre, so warps 1.. start it at a named
// barrier that warp 0 passes before its Sinkhorn passes, and their stream loads overlap those.
// splits <= kEnterSplits (glm_kernels.zig denseSplits' cap).
constexpr int kEnterSplits = 128;
constexpr int kPreBarrier = 1;  // barrier 0 is __syncthreads'

extern "C" __global__ void __launch_bounds__(kThreads) tf_hc_enter(const float* __restrict__ sums, int splits, const float* __restrict__ base,
                                                                  const float* __restrict__ scale, float* __restrict__ maps,
                                                                  const float* __restrict__ streams, const float* __restrict__ weight,
                                                                  float* __restrict__ normed, int rows, int m, int hidden, float norm_eps,
                                                                  float hc_eps, int iters, float eps) {
    tf_wait_prior_grid();
    __shared__ float staged[((2 + kMultMax) * kMultMax + 1) * kEnterSplits];
    __shared__ float row_maps[(2 + kMultMax) * kMultMax];
    const int row = blockIdx.x;
    if (row >= rows || splits > kEnterSplits) return;
    const int mixes = (2 + m) * m;
    const int count = (mixes + 1) * splits;
    const float* mine = sums + static_cast<size_t>(row) * count;
    for (int i = threadIdx.x; i < count; i += kThreads) staged[i] = mine[i];
    __syncthreads();
    if (threadIdx.x < kWarp) {
        // bar.arrive orders warp 0's stores of pre before the other warps' loads past bar.sync.
        hc_maps_row(staged, splits, base, scale, row_maps, m, hidden, norm_eps, hc_eps, iters, [] {
            __syncwarp();
            asm volatile("bar.arrive %0, %1;" ::"n"(kPreBarrier), "n"(kThreads) : "memory");
        });
        __syncwarp();
        for (int i = threadIdx.x; i < mixes; i += kWarp) maps[static_cast<size_t>(row) * mixes + i] = row_maps[i];
    } else {
        asm volatile("bar.sync %0, %1;" ::"n"(kPreBarrier), "n"(kThreads) : "memory");
    }
    collapse_norm_row(streams, row_maps, weight, normed, row, m, hidden, eps);
}

// Stream j of each row becomes post_j·out + Σ_i comb_ij·stream_i: a thread per (row, dim) reads
// the row's m old values first, so the update is in place.
__device__ __forceinline__ void leave_at(float* __restrict__ streams, const float* __restrict__ maps, float y, int row, int d, int m,
                                         int hidden) {
    const float* post = maps + static_cast<size_t>(row) * (2 + m) * m + m;
    const float* comb = post + m;
    float* x = streams + static_cast<size_t>(row) * m * hidden + d;
    float old[kMultMax];  // unrolled with constant indices: registers, not a stack frame
#pragma unroll
    for (int i = 0; i < kMultMax; ++i) old[i] = i < m ? x[static_cast<size_t>(i) * hidden] : 0.f;
    for (int j = 0; j < m; ++j) {
        float v = post[j] * y;
#pragma unroll
        for (int i = 0; i < kMultMax; ++i)
            if (i < m) v += comb[i * m + j] * old[i];
        x[static_cast<size_t>(j) * hidden] = v;
    }
}

extern "C" __global__ void __launch_bounds__(kThreads) tf_hc_leave(float* __restrict__ streams, const float* __restrict__ maps,
                                                                  const float* __restrict__ out, int rows, int m, int hidden) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    const int d = blockIdx.y * kThreads + threadIdx.x;
    if (row >= rows || d >= hidden) return;
    leave_at(streams, maps, out[static_cast<size_t>(row) * hidden + d], row, d, m, hidden);
}

// tf_hc_leave of the MoE block's output computed in place of its load: glm_forward.cu's
// tf_moe_combine and tf_hc_leave in one launch, the same value mixed (moe_combine.cuh).
extern "C" __global__ void __launch_bounds__(kThreads) tf_hc_leave_combined(float* __restrict__ streams, const float* __restrict__ maps,
                                                                           const float* __restrict__ expert_out,
                                                                           const float* __restrict__ weights, const float* __restrict__ shared,
                                                                           int rows, int top_k, int m, int hidden) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    const int d = blockIdx.y * kThreads + threadIdx.x;
    if (row >= rows || d >= hidden) return;
    leave_at(streams, maps, moe_combined(expert_out, weights, shared, row, d, top_k, hidden), row, d, m, hidden);
}

// The embedding into every stream.
extern "C" __global__ void __launch_bounds__(kThreads) tf_hc_spread(const float* __restrict__ x, float* __restrict__ streams, int rows,
                                                                   int m, int hidden) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    const int d = blockIdx.y * kThreads + threadIdx.x;
    if (row >= rows || d >= hidden) return;
    const float v = x[static_cast<size_t>(row) * hidden + d];
    for (int s = 0; s < m; ++s) streams[(static_cast<size_t>(row) * m + s) * hidden + d] = v;
}

// The streams' mean, the final norm's input.
extern "C" __global__ void __launch_bounds__(kThreads) tf_hc_mean(const float* __restrict__ streams, float* __restrict__ out, int rows,
                                                                 int m, int hidden) {
    tf_wait_prior_grid();
    const int row = blockIdx.x;
    const int d = blockIdx.y * kThreads + threadIdx.x;
    if (row >= rows || d >= hidden) return;
    float sum = 0.f;
    for (int s = 0; s < m; ++s) sum += streams[(static_cast<size_t>(row) * m + s) * hidden + d];
    out[static_cast<size_t>(row) * hidden + d] = sum * (1.0f / static_cast<float>(m));
}
