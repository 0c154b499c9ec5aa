// The trellis GEMV body of tf_exl3_item_linear and tf_exl3_group_linear (glm_forward.cu): one warp
// walks one 16-column tile column over a k split's tile rows and accumulates lane t's two output
// columns, t/4 and t/4 + 8, for each of up to R rows that share the decoded tiles. A lane's weights
// come from exl3_tile_decode.cuh. With K and the codebook template parameters a weight costs 8.5
// SASS instructions at K = 3 with MUL1 and 10.4 with 3INST, the FMA included (cuobjdump,
// docs/measurements.md). Half-integer rates keep a general path (their positions are not evenly
// spaced).
//
// The tile loop issues the ring loads of kGemvUnroll tiles before decoding any of them, so a warp has
// several DRAM reads in flight instead of one dependent read per tile.
//
// Summation order, for every path: per lane, tile rows ascending, and within a tile
// x0·w0 + x1·w1 + x8·w2 + x9·w3 (and w4..w7 for the second column), all fmaf: the same order as the
// general path, so the outputs depend neither on the path nor on how many rows share the tiles.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_codebook.cuh"
#include "exl3_tile_decode.cuh"
#include "exl3_trellis.cuh"

namespace tf {

constexpr int kGemvUnroll = 8;

struct GemvLane {
    int lane;
    int quad;  // lane % 4: the row group 2·quad + {0, 1, 8, 9}
};

// Up to R rows share each decoded tile: rows < R of them (x rows `x_stride` floats apart) are live.
// Every row's sum is formed exactly as a single row's would be.
template <int R>
__device__ __forceinline__ void gemv_accumulate(const float* xs, int x_stride, int rows, const float (&w)[8], float (&acc0)[R], float (&acc1)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r < rows) {
            const float2 x01 = *reinterpret_cast<const float2*>(xs + r * x_stride);
            const float2 x89 = *reinterpret_cast<const float2*>(xs + r * x_stride + 8);
            acc0[r] = fmaf(x01.x, w[0], acc0[r]); acc0[r] = fmaf(x01.y, w[1], acc0[r]); acc0[r] = fmaf(x89.x, w[2], acc0[r]); acc0[r] = fmaf(x89.y, w[3], acc0[r]);
            acc1[r] = fmaf(x01.x, w[4], acc1[r]); acc1[r] = fmaf(x01.y, w[5], acc1[r]); acc1[r] = fmaf(x89.x, w[6], acc1[r]); acc1[r] = fmaf(x89.y, w[7], acc1[r]);
        }
    }
}

// A single row streams its weights past L2 (read once per step); rows that share an expert's tiles
// keep them in L2 for the other groups of the same expert.
template <int R>
__device__ __forceinline__ uint32_t load_ring(const uint32_t* p) {
    if constexpr (R == 1) return __ldcs(p);
    else return __ldg(p);
}

// K integer 1..8, CB the codebook. `ring` points at the tile column's first tile (tile row 0);
// consecutive tile rows are `row_stride` uint32 words apart; x holds the rotated input of tile rows
// first..last-1 (x[0] is input channel 16·first), `rows` (<= R) rows `x_stride` floats apart.
template <int K, int CB, int R>
__device__ __forceinline__ void gemv_tiles_fixed(const uint32_t* __restrict__ ring, size_t row_stride, const float* __restrict__ x,
                                                 int x_stride, int rows, int first, int last, GemvLane g, float (&acc0)[R],
                                                 float (&acc1)[R]) {
    constexpr int kRingWords = 8 * K;
    constexpr int kTwoLoads = kRingWords > 32;
    const LaneWindow<K> window(g.lane);
    const auto decode_tile = [&](uint32_t word_a, uint32_t word_b, int tile_row) {
        half h[8];
        decode_lane<K, CB>(word_a, word_b, window, h);
        float w[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) w[e] = __half2float(h[e]);
        gemv_accumulate<R>(x + (tile_row - first) * 16 + 2 * g.quad, x_stride, rows, w, acc0, acc1);
    };

    int tile_row = first;
    for (; tile_row + kGemvUnroll <= last; tile_row += kGemvUnroll) {
        uint32_t a[kGemvUnroll], b[kGemvUnroll];
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) {
            const uint32_t* tile = ring + static_cast<size_t>(tile_row + u) * row_stride;
            a[u] = g.lane < kRingWords ? load_ring<R>(tile + g.lane) : 0u;
            b[u] = kTwoLoads && g.lane + 32 < kRingWords ? load_ring<R>(tile + g.lane + 32) : 0u;
        }
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) decode_tile(a[u], b[u], tile_row + u);
    }
    for (; tile_row < last; ++tile_row) {
        const uint32_t* tile = ring + static_cast<size_t>(tile_row) * row_stride;
        const uint32_t a = g.lane < kRingWords ? load_ring<R>(tile + g.lane) : 0u;
        const uint32_t b = kTwoLoads && g.lane + 32 < kRingWords ? load_ring<R>(tile + g.lane + 32) : 0u;
        decode_tile(a, b, tile_row);
    }
}

// Any rate, the codebook at run time: every state's words and shift computed from end_bit.
template <int R>
__device__ __forceinline__ void gemv_tiles_general(const uint32_t* __restrict__ ring, size_t row_stride, const float* __restrict__ x,
                                                   int x_stride, int rows, int first, int last, int bits2, int codebook, GemvLane g,
                                                   float (&acc0)[R], float (&acc1)[R]) {
    const int ring_words = 4 * bits2;
    const uint32_t ring_bits = 32u * ring_words;
    for (int tile_row = first; tile_row < last; ++tile_row) {
        const uint32_t* tile = ring + static_cast<size_t>(tile_row) * row_stride;
        const uint32_t word_a = g.lane < ring_words ? tile[g.lane] : 0u;
        const uint32_t word_b = g.lane + 32 < ring_words ? tile[g.lane + 32] : 0u;
        const uint32_t first_bit = end_bit(bits2, 8 * g.lane) + ring_bits - 16;
        const uint32_t first_word = first_bit >> 5;
        uint32_t words[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) words[j] = ring_word(word_a, word_b, static_cast<int>((first_word + j) % ring_words));
        // A run-time index would put `words` in local memory: select among the registers instead.
        const auto word_at = [&](uint32_t j) { return j == 0 ? words[0] : j == 1 ? words[1] : j == 2 ? words[2] : words[3]; };
        float w[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const uint32_t end = end_bit(bits2, 8 * g.lane + e) + ring_bits;
            const uint32_t high = word_at(((end - 16) >> 5) - first_word);
            const uint32_t low = word_at(((end - 1) >> 5) - first_word);
            const uint32_t shift = 32u * (((end - 1) >> 5) + 1) - end;
            const uint32_t state = static_cast<uint32_t>(((static_cast<uint64_t>(high) << 32) | low) >> shift) & 0xFFFFu;
            w[e] = __half2float(decode_state(state, codebook));
        }
        gemv_accumulate<R>(x + (tile_row - first) * 16 + 2 * g.quad, x_stride, rows, w, acc0, acc1);
    }
}

// Picks the compiled body for (bits2, codebook); half-integer rates take the general one.
template <int R>
__device__ __forceinline__ void gemv_tiles(const uint32_t* __restrict__ ring, size_t row_stride, const float* __restrict__ x,
                                           int x_stride, int rows, int first, int last, int bits2, int codebook, GemvLane g,
                                           float (&acc0)[R], float (&acc1)[R]) {
#define TF_GEMV_ARGS ring, row_stride, x, x_stride, rows, first, last, g, acc0, acc1
#define TF_GEMV_CASE(k)                                                                      \
    case 2 * k:                                                                              \
        if (codebook == kInst3) gemv_tiles_fixed<k, kInst3, R>(TF_GEMV_ARGS);                \
        else if (codebook == kMcg) gemv_tiles_fixed<k, kMcg, R>(TF_GEMV_ARGS);               \
        else gemv_tiles_fixed<k, kMul1, R>(TF_GEMV_ARGS);                                    \
        return;
    switch (bits2) {
        TF_GEMV_CASE(1)
        TF_GEMV_CASE(2)
        TF_GEMV_CASE(3)
        TF_GEMV_CASE(4)
        TF_GEMV_CASE(5)
        TF_GEMV_CASE(6)
        TF_GEMV_CASE(7)
        TF_GEMV_CASE(8)
        default: gemv_tiles_general<R>(ring, row_stride, x, x_stride, rows, first, last, bits2, codebook, g, acc0, acc1);
    }
#undef TF_GEMV_CASE
#undef TF_GEMV_ARGS
}

}  // namespace tf
