// One lane's eight weights of a 16x16 trellis tile at an integer rate K, the codebook CB fixed at
// compile time: the decode shared by the GEMV (exl3_gemv.cuh) and the prompt matmul
// (exl3_prompt.cuh), so both read the same weights.
//
// Lane t decodes trellis positions 8t..8t+7, which sit in the mma.m16n8k16 B-fragment places
// (EXL3.md §4): rows 2(t%4)+{0,1,8,9}, columns t/4 and t/4+8. The eight states lie in one window of
// 16 + 7K stream bits starting at (8t+1)K − 16 (mod the ring): the lane takes the ring words of its
// window from the lanes that loaded them, aligns the window once (funnel shifts by a run-time
// offset), and cuts every state at a compile-time bit position.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include "exl3_codebook.cuh"

namespace tf {

// Ring word `index` (< ring_words) of the tile whose words lanes hold in (word_a, word_b).
__device__ __forceinline__ uint32_t ring_word(uint32_t word_a, uint32_t word_b, int index) {
    const uint32_t from_a = __shfl_sync(0xFFFFFFFFu, word_a, index % 32);
    const uint32_t from_b = __shfl_sync(0xFFFFFFFFu, word_b, index % 32);
    return index < 32 ? from_a : from_b;
}

// The same where lane i holds words 2i and 2i + 1 (one 64-bit load a tile) in (word_a, word_b).
__device__ __forceinline__ uint32_t ring_word_paired(uint32_t word_a, uint32_t word_b, int index) {
    const uint32_t even = __shfl_sync(0xFFFFFFFFu, word_a, index / 2);
    const uint32_t odd = __shfl_sync(0xFFFFFFFFu, word_b, index / 2);
    return index % 2 == 0 ? even : odd;
}

// Where a lane's window starts: computed once per kernel, outside the tile loops.
template <int K>
struct LaneWindow {
    int first_word;
    uint32_t offset;
    __device__ __forceinline__ explicit LaneWindow(int lane) {
        const uint32_t begin = static_cast<uint32_t>((8 * lane + 1) * K - 16 + 32 * 8 * K);
        first_word = static_cast<int>((begin >> 5) % (8 * K));
        offset = begin & 31u;
    }
};

// Ring words 0..8K−1 of the tile: lane i holds word i in word_a and word i + 32 in word_b, or with
// kPairs (K >= 5) words 2i and 2i + 1.
template <int K, int CB, bool kPairs = false>
__device__ __forceinline__ void decode_lane(uint32_t word_a, uint32_t word_b, LaneWindow<K> window, half (&w)[8]) {
    constexpr int kRingWords = 8 * K;  // 256·K bits
    constexpr int kTwoLoads = kRingWords > 32;
    constexpr int kWindowBits = 16 + 7 * K;
    constexpr int kAligned = (kWindowBits + 31) / 32;     // aligned words the cuts read
    constexpr int kWords = (31 + kWindowBits + 31) / 32;  // ring words a window can touch
    uint32_t words[kWords + 1];
#pragma unroll
    for (int j = 0; j < kWords; ++j) {
        int index = window.first_word + j;
        if (index >= kRingWords) index -= kRingWords;
        words[j] = kPairs      ? ring_word_paired(word_a, word_b, index)
                   : kTwoLoads ? ring_word(word_a, word_b, index)
                               : __shfl_sync(0xFFFFFFFFu, word_a, index);
    }
    words[kWords] = 0u;
    uint32_t aligned[kAligned + 1];
#pragma unroll
    for (int j = 0; j < kAligned; ++j) aligned[j] = __funnelshift_l(words[j + 1], words[j], window.offset);
    aligned[kAligned] = 0u;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int start = e * K;  // compile-time after unrolling
        const int word = start / 32;
        const int bit = start % 32;
        const uint32_t state = bit <= 16 ? (aligned[word] >> (16 - bit)) & 0xFFFFu
                                         : __funnelshift_l(aligned[word + 1], aligned[word], bit) >> 16;
        w[e] = decode_state(state, CB);
    }
}

}  // namespace tf
