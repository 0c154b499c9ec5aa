// The Viterbi tile encoder of EXL3.md §11.5 on the GPU, the device half of zig/src/cuda/
// exl3_encode.zig and the twin of zig/src/exl3/encode.zig (which emulates these fp16 operations
// exactly): one 1024-thread block per tile, native fp16 arithmetic rounded after every operation,
// the strict-< lowest-k rule per out-edge and the rank rule for the end state.
#include <cuda_fp16.h>
#include "grid_dependency.cuh"
#include <stdint.h>

#include "exl3_codebook.cuh"

namespace {

constexpr int kThreads = 1024;
constexpr int kPositions = 256;

__device__ __forceinline__ uint32_t rank_of(uint32_t e) {
    const uint32_t v = e & 1023;
    return (__brev(v >> 5) >> 27 << 10) | (__brev(v & 31) >> 27 << 5) | (e >> 10);
}

// One forward pass over positions (i + roll) & 255. prev_sh holds the best cost per out-edge; after
// the pass it holds the last position's. back_gl[position][edge] = in-state of the chosen state.
__device__ void forward(const float* __restrict__ values, int bits, int codebook, int roll, int pre,
                        half* prev_sh, half* next_sh, uint16_t* __restrict__ back_gl) {
    const int edges = 1 << (16 - bits);
    const int branches = 1 << bits;
    for (int i = 0; i < kPositions; ++i) {
        const int position = (i + roll) & 255;
        const half w = __float2half_rn(values[position]);
        for (int o = threadIdx.x; o < edges; o += kThreads) {
            half best = __ushort_as_half(0x7C00);  // +inf
            int best_k = 0;
            for (int k = 0; k < branches; ++k) {
                const uint32_t s = (static_cast<uint32_t>(k) << (16 - bits)) | o;
                const uint32_t from = s >> bits;
                const half d = __hsub(tf::decode_state(s, codebook), w);
                half cost;
                if (i == 0) {
                    cost = __hmul(d, d);
                    if (pre >= 0 && from != static_cast<uint32_t>(pre)) cost = __ushort_as_half(0x7C00);
                } else {
                    cost = __hfma(d, d, prev_sh[from]);
                }
                // Strict <: the lowest k wins a tie; the first k is taken even at +inf.
                if (k == 0 || __hlt(cost, best)) {
                    best = cost;
                    best_k = k;
                }
            }
            next_sh[o] = best;
            back_gl[static_cast<size_t>(position) * edges + o] = static_cast<uint16_t>(((static_cast<uint32_t>(best_k) << (16 - bits)) | o) >> bits);
        }
        __syncthreads();
        for (int o = threadIdx.x; o < edges; o += kThreads) prev_sh[o] = next_sh[o];
        __syncthreads();
    }
}

}  // namespace

// values: (tiles, 256) f32 in trellis order; states: (tiles, 256); back: (tiles, 256, 2^(16-bits))
// scratch. Dynamic shared memory: 2 · 2^(16-bits) halves.
extern "C" __global__ void __launch_bounds__(1024) tf_exl3_encode(const float* __restrict__ values_gl, uint16_t* __restrict__ states_gl,
                                                                 uint16_t* __restrict__ back_gl, int tiles, int bits, int codebook) {
    tf_wait_prior_grid();
    extern __shared__ half prev_sh[];
    __shared__ uint32_t best_edge_sh;
    __shared__ float best_cost_sh[32];
    __shared__ uint32_t best_rank_sh[32];
    __shared__ uint32_t best_edge_warp_sh[32];
    const int tile = blockIdx.x;
    if (tile >= tiles) return;
    const int edges = 1 << (16 - bits);
    half* next_sh = prev_sh + edges;
    const float* values = values_gl + static_cast<size_t>(tile) * kPositions;
    uint16_t* back = back_gl + static_cast<size_t>(tile) * kPositions * edges;
    uint16_t* states = states_gl + static_cast<size_t>(tile) * kPositions;

    // Pass 1: positions 128..255, 0..127, unconstrained; the end edge by minimal cost, then rank.
    forward(values, bits, codebook, 128, -1, prev_sh, next_sh, back);
    float best_cost = INFINITY;
    uint32_t best_rank = 0xFFFFFFFFu, best_edge = 0;
    for (int o = threadIdx.x; o < edges; o += kThreads) {
        const float cost = __half2float(prev_sh[o]);
        const uint32_t r = rank_of(o);
        if (cost < best_cost || (cost == best_cost && r < best_rank)) { best_cost = cost; best_rank = r; best_edge = o; }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float c = __shfl_xor_sync(0xFFFFFFFFu, best_cost, offset);
        const uint32_t r = __shfl_xor_sync(0xFFFFFFFFu, best_rank, offset);
        const uint32_t e = __shfl_xor_sync(0xFFFFFFFFu, best_edge, offset);
        if (c < best_cost || (c == best_cost && r < best_rank)) { best_cost = c; best_rank = r; best_edge = e; }
    }
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        best_cost_sh[warp] = best_cost;
        best_rank_sh[warp] = best_rank;
        best_edge_warp_sh[warp] = best_edge;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int winner = 0;
        for (int w = 1; w < kThreads / 32; ++w)
            if (best_cost_sh[w] < best_cost_sh[winner] || (best_cost_sh[w] == best_cost_sh[winner] && best_rank_sh[w] < best_rank_sh[winner])) winner = w;
        uint32_t o = best_edge_warp_sh[winner];
        for (int position = 127; position >= 0; --position) o = back[static_cast<size_t>(position) * edges + o];
        best_edge_sh = o;  // in(state_0) of that run
    }
    __syncthreads();
    const uint32_t end = best_edge_sh;
    // Pass 2: positions 0..255 with in(state_0) forced to `end`; the traceback from out = end
    // closes the ring.
    forward(values, bits, codebook, 0, static_cast<int>(end), prev_sh, next_sh, back);
    if (threadIdx.x == 0) {
        uint32_t o = end;
        for (int position = 255; position >= 0; --position) {
            const uint32_t b = back[static_cast<size_t>(position) * edges + o];
            states[position] = static_cast<uint16_t>(((b << bits) | o) & 0xFFFFu);
            o = b;
        }
    }
}
