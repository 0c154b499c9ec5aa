// Trellis words to fp16 weights: Wq[16·tile_row + r][16·tile_column + c], before the Hadamards.
// The host half is zig/src/cuda/exl3_decode.zig. One 256-thread block per tile, one thread per
// trellis position; the tile's words (at most 256 bytes) are staged once in shared memory, so
// each thread's two window reads hit shared memory, not DRAM.
#include "exl3_codebook.cuh"
#include "grid_dependency.cuh"
#include "exl3_trellis.cuh"

static_assert(tf::kTileWeights == 256, "one thread per trellis position");

extern "C" __global__ void __launch_bounds__(256) tf_exl3_decode(
    const uint16_t* __restrict__ words_gl,  // (tile_rows, tile_columns, 8·bits2) int16
    uint16_t* __restrict__ out_gl,          // (16·tile_rows, 16·tile_columns) fp16 bits
    int tile_rows,
    int tile_columns,
    int bits2,                              // 2·K, see exl3_trellis.cuh
    int codebook) {
    tf_wait_prior_grid();                         // tf::Codebook
    __shared__ uint32_t ring_sh[64];       // 4·bits2 <= 64 words for K <= 8
    const int tile_column = blockIdx.x;
    const int tile_row = blockIdx.y;
    const int position = threadIdx.x;
    if (tile_row >= tile_rows || tile_column >= tile_columns) return;

    const int ring_words = 4 * bits2;
    const uint16_t* tile_gl = words_gl + (static_cast<size_t>(tile_row) * tile_columns + tile_column) * (8 * bits2);
    if (position < ring_words) {
        ring_sh[position] = static_cast<uint32_t>(tile_gl[2 * position]) |
                            (static_cast<uint32_t>(tile_gl[2 * position + 1]) << 16);
    }
    __syncthreads();

    const uint32_t state = tf::state_at(ring_sh, bits2, static_cast<uint32_t>(position));
    const half weight = tf::decode_state(state, codebook);
    const int element = tf::tile_element(position);
    const size_t row = static_cast<size_t>(tile_row) * tf::kTileSize + element / 16;
    const size_t column = static_cast<size_t>(tile_column) * tf::kTileSize + element % 16;
    out_gl[row * (static_cast<size_t>(tile_columns) * tf::kTileSize) + column] = __half_as_ushort(weight);
}
