// Kimi delta attention on the GPU (GLM-5.3-Flash's linear attention layers), as
// zig/src/families/glm/parts/kda.zig: the causal depthwise convolution over [q | k | v] with each
// sequence's tail, then per (run, head) the gated delta rule row by row in the recurrent form, the
// state S (head_dim x head_dim, row-major by key dim) in registers for the run. The host half is
// zig/src/cuda/kda_kernels.zig.
//
// A run is a batch's consecutive rows of one sequence (one slot, ascending consecutive positions);
// a run whose first position is 0 starts from zero state and tail, which are then never read. Every
// sum has one order fixed by the head and the row alone, so a row's bits do not depend on its batch.
#include <stdint.h>
#include "grid_dependency.cuh"

namespace {

constexpr int kWarp = 32;
constexpr int kKdaDim = 128;  // linear_head_dim of GLM-5.3-Flash; the host refuses others
constexpr int kKdaSplit = 4;  // threads per value column, each holding a quarter of the key dims
constexpr int kKdaKeys = kKdaDim / kKdaSplit;
constexpr int kKdaThreads = kKdaDim * kKdaSplit;
// Staged key-indexed vectors put 4 floats between quarters: a warp's float4 read of all four
// quarters then falls in distinct banks, not 4-way conflicts.
constexpr int kKdaPitch = kKdaKeys + 4;
constexpr int kKdaStaged = kKdaSplit * kKdaPitch;
constexpr int kKdaWarps = kKdaThreads / kWarp;
// Rows staged at once, a warp's q, k and output norm each: the block's barriers are per chunk,
// and within one the rows' products run back to back.
constexpr int kKdaChunk = kKdaWarps;
constexpr int kKdaPerThread = kKdaChunk * kKdaDim / kKdaThreads;  // decays and values staged per thread
constexpr float kQScale = 0.08838834764831845f;  // kKdaDim^-0.5
constexpr float kL2Eps = 1e-6f;
constexpr int kConvThreads = 256;
constexpr int kTapsMax = 8;
static_assert(kKdaDim == 4 * kWarp && kKdaKeys % 4 == 0, "staging takes 4 dims per lane; float4 reads");
static_assert(kKdaThreads % kKdaDim == 0, "a thread stages the same channel in every row");

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// How many rows just before `row` belong to its run (at most `most`): the same slot, one
// position earlier each.
__device__ __forceinline__ int run_rows_before(const uint32_t* slots, const uint32_t* positions, int row, int most) {
    const uint32_t slot = slots[row], position = positions[row];
    int d = 0;
    while (d < most && row - d - 1 >= 0 && slots[row - d - 1] == slot && positions[row - d - 1] + d + 1 == position) ++d;
    return d;
}

// The convolution's input `back` positions before `row` in channel `ch`: a batch row of the run,
// else the sequence's tail (`tail` at its channel; entry taps-2 the newest), else 0 before position 0.
__device__ __forceinline__ float conv_input(const float* mixed, const float* tail, size_t channels, int row, int ch,
                                            int taps, int position, int before, int back) {
    if (position < back) return 0.f;
    if (back <= before) return mixed[static_cast<size_t>(row - back) * channels + ch];
    return tail[static_cast<size_t>(taps - 1 - (back - before)) * channels];
}

// A chunk's staged inputs; key-indexed vectors at staged_index.
struct alignas(16) Chunk {
    float q[kKdaChunk][kKdaStaged];      // normalized and scaled
    float k[kKdaChunk][kKdaStaged];      // normalized
    float decay[kKdaChunk][kKdaStaged];  // e^g
    float v[kKdaChunk][kKdaDim];
    float o[kKdaChunk][kKdaDim];  // the rule's output before the norm
    float beta[kKdaChunk];
};
static_assert(sizeof(Chunk) <= 48 * 1024, "static shared memory");

__device__ __forceinline__ int staged_index(int key) { return key + (key / kKdaKeys) * (kKdaPitch - kKdaKeys); }

}  // namespace

// conv_out[r][ch] = SiLU(Σ_j conv_w[ch][j] · in(pos - (taps-1) + j)): a thread per (row, channel).
// The products and sums unfused and in the CPU's order (the newest tap first), so only expf
// separates the bits from the CPU's.
extern "C" __global__ void __launch_bounds__(kConvThreads) tf_kda_conv(
    const float* __restrict__ mixed, const float* __restrict__ conv_w, const float* __restrict__ tails,
    const uint32_t* __restrict__ slots, const uint32_t* __restrict__ positions, float* __restrict__ conv_out,
    int rows, int channels, int taps, int layers, int layer) {
    tf_wait_prior_grid();
    const int row = blockIdx.x, ch = blockIdx.y * kConvThreads + threadIdx.x;
    if (row >= rows || ch >= channels) return;
    const size_t width = channels;
    const int position = static_cast<int>(positions[row]);
    const int before = run_rows_before(slots, positions, row, taps - 1);
    const float* tail = tails + (static_cast<size_t>(slots[row]) * layers + layer) * (taps - 1) * width + ch;
    const float* w = conv_w + static_cast<size_t>(ch) * taps;
    float sum = __fmul_rn(w[taps - 1], mixed[row * width + ch]);
    for (int j = 0; j < taps - 1; ++j)
        sum = __fadd_rn(sum, __fmul_rn(w[j], conv_input(mixed, tail, width, row, ch, taps, position, before, taps - 1 - j)));
    conv_out[row * width + ch] = sum / (1.0f + expf(-sum));
}

// After tf_kda_conv (which reads the old tails): each run's last row writes its slot's tail, the
// last taps-1 inputs up to itself. A thread per (row, channel) reads all its entries before writing
// any, so the shift needs no ordering.
extern "C" __global__ void __launch_bounds__(kConvThreads) tf_kda_tail(
    const float* __restrict__ mixed, float* __restrict__ tails, const uint32_t* __restrict__ slots,
    const uint32_t* __restrict__ positions, int rows, int channels, int taps, int layers, int layer) {
    tf_wait_prior_grid();
    const int row = blockIdx.x, ch = blockIdx.y * kConvThreads + threadIdx.x;
    if (row >= rows || ch >= channels) return;
    if (row + 1 < rows && slots[row + 1] == slots[row] && positions[row + 1] == positions[row] + 1) return;
    const size_t width = channels;
    const int keep = taps - 1;
    const int position = static_cast<int>(positions[row]);
    const int before = run_rows_before(slots, positions, row, keep - 1);
    float* tail = tails + (static_cast<size_t>(slots[row]) * layers + layer) * keep * width + ch;
    float next[kTapsMax - 1];
#pragma unroll
    for (int i = 0; i < kTapsMax - 1; ++i)
        if (i < keep) next[i] = conv_input(mixed, tail, width, row, ch, taps, position, before, keep - 1 - i);
#pragma unroll
    for (int i = 0; i < kTapsMax - 1; ++i)
        if (i < keep) tail[static_cast<size_t>(i) * width] = next[i];
}

// The gated delta rule: a block per (run, head), blocks past *run_count return. Thread t holds
// S[k][v] for v = t%8 + 8·(t/32) and k in the quarter (t/8)%4 (32 registers): then each 8-thread
// phase of a warp's float4 shared read reads one address (v = t/4 took twice the wavefronts). Sums
// over k are the quarter's (4 interleaved partials), then a butterfly over the 4 quarters, whose
// results are bitwise equal.
//
// beta_in's rows are beta_stride floats apart (heads, or the stacked gate projections' width).
//
// Per chunk of kKdaChunk rows: warp w stages row w's q and k and writes the previous chunk's row w
// output (normed, gated); barrier; the chunk's rows through the rule; barrier.
extern "C" __global__ void __launch_bounds__(kKdaThreads) tf_kda_recurrent(
    const float* __restrict__ conv_out, const float* __restrict__ decay_in, const float* __restrict__ dt_bias,
    const float* __restrict__ a_log, const float* __restrict__ beta_in, const float* __restrict__ gate_in,
    const float* __restrict__ o_norm, float* __restrict__ states, const uint32_t* __restrict__ slots,
    const uint32_t* __restrict__ positions, const int* __restrict__ run_starts, const int* __restrict__ run_count,
    float* __restrict__ out, int heads, int beta_stride, int layers, int layer, int has_bound, float bound, float eps) {
    tf_wait_prior_grid();
    __shared__ Chunk chunk;
    const int run = blockIdx.x, h = blockIdx.y;
    if (run >= *run_count) return;
    const int first = run_starts[run], end = run_starts[run + 1];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int column = lane % 8 + 8 * warp, quarter = lane / 8;
    const size_t width = static_cast<size_t>(heads) * kKdaDim;
    const size_t head = static_cast<size_t>(h) * kKdaDim;
    const float rate = expf(a_log[h]);
    const int channel = threadIdx.x % kKdaDim;  // of the decays and values this thread stages
    const float bias = dt_bias[head + channel];
    float weight[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) weight[i] = o_norm[lane + i * kWarp];

    const uint32_t slot = slots[first];
    float* state = states + ((static_cast<size_t>(slot) * layers + layer) * heads + h) * kKdaDim * kKdaDim;
    const bool fresh = positions[first] == 0;
    float s[kKdaKeys];
#pragma unroll
    for (int i = 0; i < kKdaKeys; ++i) s[i] = fresh ? 0.f : state[(quarter * kKdaKeys + i) * kKdaDim + column];

    int done = first;  // the first row whose output is still to write
    for (int c0 = first;; c0 += kKdaChunk) {
        const int rows = max(0, min(kKdaChunk, end - c0)), written = min(c0, end) - done;
        // Every load first, so that their latencies overlap.
        float q[4] = {}, k[4] = {}, o[4] = {}, gate[4] = {}, decay[kKdaPerThread] = {}, v[kKdaPerThread] = {}, beta = 0.f;
        if (warp < rows) {
            const float* qk = conv_out + static_cast<size_t>(c0 + warp) * 3 * width + head;
#pragma unroll
            for (int i = 0; i < 4; ++i) q[i] = qk[lane + i * kWarp], k[i] = qk[width + lane + i * kWarp];
        }
        if (warp < written) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                gate[i] = gate_in[(done + warp) * width + head + lane + i * kWarp];
                o[i] = chunk.o[warp][lane + i * kWarp];
            }
        }
#pragma unroll
        for (int i = 0; i < kKdaPerThread; ++i) {
            const int row = (threadIdx.x + i * kKdaThreads) / kKdaDim;
            if (row < rows) {
                decay[i] = decay_in[(c0 + row) * width + head + channel];
                v[i] = conv_out[(c0 + row) * 3 * width + 2 * width + head + channel];
            }
        }
        if (threadIdx.x < rows) beta = beta_in[static_cast<size_t>(c0 + threadIdx.x) * beta_stride + h];

        if (warp < written) {
            float squares = 0.f;
#pragma unroll
            for (int i = 0; i < 4; ++i) squares += o[i] * o[i];
            const float inverse = 1.0f / sqrtf(warp_sum(squares) * (1.0f / kKdaDim) + eps);
#pragma unroll
            for (int i = 0; i < 4; ++i)
                out[(done + warp) * width + head + lane + i * kWarp] = weight[i] * (o[i] * inverse) * sigmoid(gate[i]);
        }
        if (rows == 0) break;
        if (warp < rows) {
            float qq = 0.f, kk = 0.f;
#pragma unroll
            for (int i = 0; i < 4; ++i) qq += q[i] * q[i], kk += k[i] * k[i];
            const float q_inverse = kQScale / sqrtf(warp_sum(qq) + kL2Eps), k_inverse = 1.0f / sqrtf(warp_sum(kk) + kL2Eps);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                chunk.q[warp][staged_index(lane + i * kWarp)] = q[i] * q_inverse;
                chunk.k[warp][staged_index(lane + i * kWarp)] = k[i] * k_inverse;
            }
        }
#pragma unroll
        for (int i = 0; i < kKdaPerThread; ++i) {
            const int row = (threadIdx.x + i * kKdaThreads) / kKdaDim;
            if (row < rows) {
                const float z = decay[i] + bias;
                const float softplus = z > 20.0f ? z : logf(1.0f + expf(z));
                const float g = has_bound ? bound * sigmoid(rate * z) : -rate * softplus;
                chunk.decay[row][staged_index(channel)] = expf(g);
                chunk.v[row][channel] = v[i];
            }
        }
        if (threadIdx.x < rows) chunk.beta[threadIdx.x] = sigmoid(beta);
        __syncthreads();

        for (int r = 0; r < rows; ++r) {
            const float4* decays = reinterpret_cast<const float4*>(chunk.decay[r] + quarter * kKdaPitch);
            const float4* keys = reinterpret_cast<const float4*>(chunk.k[r] + quarter * kKdaPitch);
            const float4* queries = reinterpret_cast<const float4*>(chunk.q[r] + quarter * kKdaPitch);
            float4 part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int i = 0; i < kKdaKeys / 4; ++i) {
                const float4 e = decays[i], kv = keys[i];
                s[4 * i] *= e.x, s[4 * i + 1] *= e.y, s[4 * i + 2] *= e.z, s[4 * i + 3] *= e.w;
                part.x = fmaf(s[4 * i], kv.x, part.x), part.y = fmaf(s[4 * i + 1], kv.y, part.y);
                part.z = fmaf(s[4 * i + 2], kv.z, part.z), part.w = fmaf(s[4 * i + 3], kv.w, part.w);
            }
            float remembered = (part.x + part.y) + (part.z + part.w);
            remembered += __shfl_xor_sync(0xFFFFFFFFu, remembered, 8);
            remembered += __shfl_xor_sync(0xFFFFFFFFu, remembered, 16);
            const float delta = (chunk.v[r][column] - remembered) * chunk.beta[r];

            part = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int i = 0; i < kKdaKeys / 4; ++i) {
                const float4 kv = keys[i], qv = queries[i];
                s[4 * i] = fmaf(kv.x, delta, s[4 * i]), s[4 * i + 1] = fmaf(kv.y, delta, s[4 * i + 1]);
                s[4 * i + 2] = fmaf(kv.z, delta, s[4 * i + 2]), s[4 * i + 3] = fmaf(kv.w, delta, s[4 * i + 3]);
                part.x = fmaf(s[4 * i], qv.x, part.x), part.y = fmaf(s[4 * i + 1], qv.y, part.y);
                part.z = fmaf(s[4 * i + 2], qv.z, part.z), part.w = fmaf(s[4 * i + 3], qv.w, part.w);
            }
            float result = (part.x + part.y) + (part.z + part.w);
            result += __shfl_xor_sync(0xFFFFFFFFu, result, 8);
            result += __shfl_xor_sync(0xFFFFFFFFu, result, 16);
            if (quarter == 0) chunk.o[r][column] = result;
        }
        __syncthreads();
        done = c0;
    }
#pragma unroll
    for (int i = 0; i < kKdaKeys; ++i) state[(quarter * kKdaKeys + i) * kKdaDim + column] = s[i];
}
