// The trellis GEMV body of tf_exl3_item_linear and tf_exl3_group_linear (glm_forward.cu): one warp
// walks one 16-column tile column over a k split's tile rows for up to R rows that share the
// decoded tiles. A lane's eight decoded weights (exl3_tile_decode.cuh) are, as they come, its
// fragment of the tile's transpose as the A operand of mma.m16n8k16 (EXL3.md §4); the rows' rotated
// inputs are the B operand as fp16 high and low parts (x = hi + lo to ~22 bits) read by ldmatrix
// from the block's shared planes: an n8 block holds four rows, row r's high part in column 2r and
// its low part in column 2r + 1. Each tile is one mma per n8 block into fp32 accumulators, so the
// dot products leave the ALU: what a weight costs is its decode (cuobjdump, docs/measurements.md),
// and four rows cost what one does.
//
// Summation order, for every rate and path: per output, the high parts' products over the tile
// rows ascending, the low parts' likewise, then their sum. An output's bits depend only on its own
// row's inputs (the tensor core computes each D element from its own row and column), never on how
// many rows share the tiles. Half-integer rates decode through a general path into the same
// accumulation.
//
// The tile loop issues the ring loads of kGemvUnroll tiles before decoding any of them, so a warp
// has several DRAM reads in flight instead of one dependent read per tile.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_codebook.cuh"
#include "exl3_tile_decode.cuh"
#include "exl3_trellis.cuh"
#include "mma.cuh"

namespace tf {

constexpr int kGemvUnroll = 8;

// The rotated inputs of a k split in shared memory: `rows` rows of fp16 high parts at hi, low parts
// at lo, `pitch` halves apart (x[0] is input channel 16·first).
struct GemvPlanes {
    const half* hi;
    const half* lo;
    int pitch;
    int rows;
};

// The accumulators of one warp: d[j] is the n8 block of rows 4j..4j+3; lane (g, q) = (lane/4,
// lane%4) holds columns g and g + 8 of the tile column for row 4j + q, high part then low part:
// d[j] = {(g, high), (g, low), (g + 8, high), (g + 8, low)}, and output(j, c) adds the pair.
// Two rows a block, each its high and low parts as two mma into one accumulator, cost a second
// mma a tile at one to four rows: GLM-4.5-Air-12l's decode was 5-7% slower on an H100
// (docs/measurements.md, 2026-12-06, fourteenth session), its one-row linears 8%.
//
// An n8 block's rows past `rows` read the last live row: their products land in accumulators no one
// stores (each D element comes from its own column), and every lane's ldmatrix address then steps by
// the same 32 bytes a tile, offsets the unrolled tile loop folds into its loads (a zero row with a
// step of 0 cost a select and an add a tile, cuobjdump).
template <int R>
struct GemvMma {
    static constexpr int kRowsPerBlock = 4;
    static constexpr int kBlocks = (R + kRowsPerBlock - 1) / kRowsPerBlock;
    float d[kBlocks][4];
    uint32_t source[(kBlocks + 1) / 2];  // this lane's ldmatrix row at tile 0 (a shared address), a pair of blocks each
    int rows;

    __device__ __forceinline__ GemvMma(const GemvPlanes& x, int lane) : rows(x.rows) {
        // ldmatrix.x4 over blocks 2i and 2i + 1: lanes 8m..8m+7 give the rows of matrix m = (block 2i
        // k0-7, block 2i k8-15, block 2i+1 k0-7, block 2i+1 k8-15); matrix row n is column n of the
        // block, the high (n even) or low (n odd) part of its row n/2. x2 takes lanes 0-15's.
#pragma unroll
        for (int i = 0; i < (kBlocks + 1) / 2; ++i) {
            const int block = 2 * i + lane / 16;
            const int row = min(kRowsPerBlock * block + (lane % 8) / 2, x.rows - 1);
            const half* plane = lane % 2 == 0 ? x.hi : x.lo;
            source[i] = shared_address(plane + row * x.pitch + 8 * ((lane / 8) % 2));
        }
#pragma unroll
        for (int j = 0; j < kBlocks; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) d[j][i] = 0.f;
    }

    // w: the lane's decoded weights of the tile `tile` rows past the split's first, into the first
    // kLive blocks (the caller's count of blocks with live rows, fixed for its loop: a choice per
    // tile cost the grouped loop both forms' ldmatrix and products, predicated, cuobjdump).
    template <int kLive>
    __device__ __forceinline__ void add(const half (&w)[8], int tile) {
        const uint32_t a[4] = {pack_halves(w[0], w[1]), pack_halves(w[4], w[5]), pack_halves(w[2], w[3]), pack_halves(w[6], w[7])};
#pragma unroll
        for (int i = 0; i < (kLive + 1) / 2; ++i) {
            if (2 * i + 1 < kLive) {
                uint32_t b[4];
                ldmatrix_x4_at(b, source[i] + 32 * tile);
                const uint32_t first[2] = {b[0], b[1]};
                const uint32_t second[2] = {b[2], b[3]};
                mma_16816(d[2 * i], a, first);
                mma_16816(d[2 * i + 1], a, second);
            } else {
                uint32_t b[2];
                ldmatrix_x2_at(b, source[i] + 32 * tile);
                mma_16816(d[2 * i], a, b);
            }
        }
    }

    // The row of block j this lane's outputs belong to, and its output at column g (c = 0) or g + 8
    // (c = 1): the high parts' sum plus the low parts'.
    __device__ __forceinline__ static int row_of(int j, int lane) { return kRowsPerBlock * j + lane % 4; }
    __device__ __forceinline__ float output(int j, int c) const { return __fadd_rn(d[j][2 * c], d[j][2 * c + 1]); }
};

// A single row streams its weights past L2 (read once per step); rows that share an expert's tiles
// keep them in L2 for the other groups of the same expert.
template <int R>
__device__ __forceinline__ uint32_t load_ring(const uint32_t* p) {
    if constexpr (R == 1) return __ldcs(p);
    else return __ldg(p);
}

// The same for a lane's two words of a tile (8-byte aligned: a tile is 4·bits2 words, an even count).
template <int R>
__device__ __forceinline__ uint2 load_ring_pair(const uint32_t* p) {
    if constexpr (R == 1) return __ldcs(reinterpret_cast<const uint2*>(p));
    else return __ldg(reinterpret_cast<const uint2*>(p));
}

// K integer 1..8, CB the codebook. `ring` points at the tile column's first tile (tile row 0);
// consecutive tile rows are `row_stride` uint32 words apart; the split covers tile rows first..last-1.
template <int K, int CB, int R, int kLive>
__device__ __forceinline__ void gemv_tiles_fixed(const uint32_t* __restrict__ ring, size_t row_stride, int first, int last, int lane,
                                                 GemvMma<R>& acc) {
    constexpr int kRingWords = 8 * K;
    constexpr int kTwoLoads = kRingWords > 32;
    const LaneWindow<K> window(lane);
    const auto decode_tile = [&](uint32_t word_a, uint32_t word_b, int tile_row) {
        half w[8];
        decode_lane<K, CB, kTwoLoads>(word_a, word_b, window, w);
        acc.template add<kLive>(w, tile_row - first);
    };

    // One pointer stepped a tile row at a time: the 64-bit row · stride product per load cost ~8
    // instructions, 1 per weight (cuobjdump). Every lane loads: a lane past the ring's words reads
    // some again within the same load (the same sectors, one request) and no shuffle takes them; a
    // predicated load and its zero cost an instruction a tile. Two words a lane (K >= 5) come as
    // one 64-bit pair, words 2i and 2i + 1 (a second load's lanes past the ring read a third of a
    // 6-bit tile again in requests of their own, and the lm_head's GEMV took 13% longer on an
    // H100; predicated at +32 instead, it spilled at sm_90's 40 registers for one row, and cost the
    // grouped loops 19-74 instructions per 8 tiles more than the pairs, cuobjdump).
    const uint32_t* tile = ring + static_cast<size_t>(first) * row_stride + (kTwoLoads ? 2 * (lane % (kRingWords / 2)) : lane % kRingWords);
    const auto load_words = [&](uint32_t& a, uint32_t& b) {
        if constexpr (kTwoLoads) {
            const uint2 pair = load_ring_pair<R>(tile);
            a = pair.x;
            b = pair.y;
        } else {
            a = load_ring<R>(tile);
            b = 0u;
        }
        tile += row_stride;
    };
    int tile_row = first;
    for (; tile_row + kGemvUnroll <= last; tile_row += kGemvUnroll) {
        uint32_t a[kGemvUnroll], b[kGemvUnroll];
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) load_words(a[u], b[u]);
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) decode_tile(a[u], b[u], tile_row + u);
    }
    for (; tile_row < last; ++tile_row) {
        uint32_t a, b;
        load_words(a, b);
        decode_tile(a, b, tile_row);
    }
}

// Any rate, the codebook at run time: every state's words and shift computed from end_bit.
template <int R, int kLive>
__device__ __forceinline__ void gemv_tiles_general(const uint32_t* __restrict__ ring, size_t row_stride, int first, int last, int bits2,
                                                   int codebook, int lane, GemvMma<R>& acc) {
    const int ring_words = 4 * bits2;
    const uint32_t ring_bits = 32u * ring_words;
    for (int tile_row = first; tile_row < last; ++tile_row) {
        const uint32_t* tile = ring + static_cast<size_t>(tile_row) * row_stride;
        const uint32_t word_a = lane < ring_words ? tile[lane] : 0u;
        const uint32_t word_b = lane + 32 < ring_words ? tile[lane + 32] : 0u;
        const uint32_t first_bit = end_bit(bits2, 8 * lane) + ring_bits - 16;
        const uint32_t first_word = first_bit >> 5;
        uint32_t words[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) words[j] = ring_word(word_a, word_b, static_cast<int>((first_word + j) % ring_words));
        // A run-time index would put `words` in local memory: select among the registers instead.
        const auto word_at = [&](uint32_t j) { return j == 0 ? words[0] : j == 1 ? words[1] : j == 2 ? words[2] : words[3]; };
        half w[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const uint32_t end = end_bit(bits2, 8 * lane + e) + ring_bits;
            const uint32_t high = word_at(((end - 16) >> 5) - first_word);
            const uint32_t low = word_at(((end - 1) >> 5) - first_word);
            const uint32_t shift = 32u * (((end - 1) >> 5) + 1) - end;
            const uint32_t state = static_cast<uint32_t>(((static_cast<uint64_t>(high) << 32) | low) >> shift) & 0xFFFFu;
            w[e] = decode_state(state, codebook);
        }
        acc.template add<kLive>(w, tile_row - first);
    }
}

// Picks the compiled body for (bits2, codebook); half-integer rates take the general one.
template <int R, int kLive>
__device__ __forceinline__ void gemv_tiles_live(const uint32_t* __restrict__ ring, size_t row_stride, int first, int last, int bits2, int codebook,
                                                int lane, GemvMma<R>& acc) {
#define TF_GEMV_CASE(k)                                                                                           \
    case 2 * k:                                                                                                   \
        if (codebook == kInst3) gemv_tiles_fixed<k, kInst3, R, kLive>(ring, row_stride, first, last, lane, acc);  \
        else if (codebook == kMcg) gemv_tiles_fixed<k, kMcg, R, kLive>(ring, row_stride, first, last, lane, acc); \
        else gemv_tiles_fixed<k, kMul1, R, kLive>(ring, row_stride, first, last, lane, acc);                      \
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
        default: gemv_tiles_general<R, kLive>(ring, row_stride, first, last, bits2, codebook, lane, acc);
    }
#undef TF_GEMV_CASE
}

// The body for the blocks that hold rows: one (rows <= 4, a step's usual group of an expert) or
// all of them. Blocks past the rows compute products no one stores.
template <int R>
__device__ __forceinline__ void gemv_tiles(const uint32_t* __restrict__ ring, size_t row_stride, int first, int last, int bits2, int codebook,
                                           int lane, GemvMma<R>& acc) {
    constexpr int kBlocks = GemvMma<R>::kBlocks;
    if (kBlocks == 1 || acc.rows <= GemvMma<R>::kRowsPerBlock) gemv_tiles_live<R, 1>(ring, row_stride, first, last, bits2, codebook, lane, acc);
    else gemv_tiles_live<R, kBlocks>(ring, row_stride, first, last, bits2, codebook, lane, acc);
}

}  // namespace tf
