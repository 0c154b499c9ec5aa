// The device half of zig/src/exl3/trellis.zig: where a trellis position's 16-bit state sits in a
// tile's ring of 128·bits2 bits, and which tile element it decodes to (EXL3.md §4, §5, §7).
#pragma once
#include <stdint.h>

namespace tf {

constexpr int kTileSize = 16;
constexpr int kTileWeights = kTileSize * kTileSize;

// bits2 = 2·K: 2..16 for integer K, 3/5/7 for K = 1.5/2.5/3.5. A tile holds 8·bits2 int16 words.
__device__ __forceinline__ uint32_t end_bit(int bits2, uint32_t position) {
    if ((bits2 & 1) == 0) return (position + 1) * static_cast<uint32_t>(bits2 / 2);
    // Half-integer rates: odd positions carry one extra bit (the 0xAAAA pattern).
    const uint32_t low = static_cast<uint32_t>(bits2 / 2);
    const uint32_t group = position / 16;
    const uint32_t within = position % 16 + 1;
    return group * (16 * low + 8) + within * low + within / 2;
}

// ring: the tile's 4·bits2 uint32 words, element pair (2w, 2w+1) as one little-endian word whose
// MSB is the earliest stream bit. The state ends at end_bit and is read cyclically.
__device__ __forceinline__ uint32_t state_at(const uint32_t* ring, int bits2, uint32_t position) {
    const uint32_t ring_words = 4u * static_cast<uint32_t>(bits2);
    const uint32_t end = end_bit(bits2, position) + 32u * ring_words;
    const uint32_t begin = end - 16;
    const uint32_t high = ring[(begin >> 5) % ring_words];
    const uint32_t low = ring[((end - 1) >> 5) % ring_words];
    const uint32_t shift = 32u * (((end - 1) >> 5) + 1) - end;
    const uint64_t window = (static_cast<uint64_t>(high) << 32) | low;
    return static_cast<uint32_t>(window >> shift) & 0xFFFFu;
}

// PERM[i] = 16·r + c for trellis position i = 8t + e: the mma.m16n8k16 B-fragment order.
__device__ __forceinline__ int tile_element(int position) {
    const int t = position / 8;
    const int e = position % 8;
    const int r = 2 * (t % 4) + (e & 1) + ((e & 2) ? 8 : 0);
    const int c = t / 4 + ((e & 4) ? 8 : 0);
    return 16 * r + c;
}

}  // namespace tf
