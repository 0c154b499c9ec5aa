// The prompt matmul of EXL3 linears over many rows, on tensor cores (mma.sync.m16n8k16, sm_80 and
// later): the body of the fused prefill kernels in exl3_experts.cu.
//
// A block of 8 warps takes one group of up to 64 items of one layer (an expert's rows, sorted
// together by tf_exl3_group_items) and 16 tile columns; each warp decodes two tile columns over the
// whole input, or over a k range fixed by the shape (a deep launch, exl3_experts.cu): one chain per
// output in ascending k, and every decoded tile serves all the group's rows. A lane's decoded
// weights are the mma B fragment as they come (exl3_tile_decode.cuh); the rotated inputs arrive as
// fp16 high and low parts (x = hi + lo to ~22 bits) through a two-stage cp.async pipeline into
// shared memory and are read by ldmatrix, and each product is accumulated in fp32 as hi·w, then lo·w. The weights are exact in fp16, so the
// only rounding beyond the GEMV's is the tensor core's fp32 accumulation.
//
// The tile settings (32 input channels per stage, one or two tile columns per warp) are constants;
// a group holds up to 64 rows (kM = 4 row tiles) or, in the experts' slim kernels, up to 32 (kM = 2:
// half the accumulators, so more warps per SM). Every output is the same chain whatever the group's
// size, so a row's outputs depend on the shape alone, never on which rows share its group.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "exl3_tile_decode.cuh"
#include "mma.cuh"

namespace tf {

constexpr int kPromptRows = 64;   // items per group: kGroupRows of the prompt path
constexpr int kPromptM = kPromptRows / 16;
constexpr int kPromptWarps = 8;
constexpr int kPromptSlab = 32;            // input channels per pipeline stage (two tile rows)
constexpr int kSlabPitch = kPromptSlab + 8;  // halves per shared row: 80 bytes, so the 8 rows of an
                                             // ldmatrix phase land in distinct banks
constexpr int kEpiloguePitch = 128 + 4;      // floats per row of the epilogue's staging

// Rows staged per epilogue pass for groups of up to 16·kM rows: half a group (a row tile at
// least), so that the staging fits in the pipeline's stages (the slim kernels' 20 KB let three
// blocks share a GB10's SM).
__host__ __device__ constexpr int epilogue_rows(int m_tiles) { return m_tiles >= 2 ? 8 * m_tiles : 16; }

// Shared bytes of a prompt kernel with `ops` input operands and groups of up to `rows`: the
// pipeline's two stages, reused by the epilogue's staging of two 128-column halves of rows / 2.
__host__ __device__ constexpr int prompt_shared_bytes(int ops, int rows = kPromptRows) {
    const int stages = 2 * ops * 2 * rows * kSlabPitch * 2;
    const int epilogue = 2 * epilogue_rows(rows / 16) * kEpiloguePitch * 4;
    return stages > epilogue ? stages : epilogue;
}

// fp16 planes of rotated inputs: plane (op, part) holds `slots` rows of k_p halves; part 0 = high.
struct RotatedPlanes {
    half* base;
    int slots;
    int k_p;
    __device__ __forceinline__ half* plane(int op, int part) const {
        return base + static_cast<size_t>(op * 2 + part) * slots * k_p;
    }
};

// acc[m][c][n][i]: row 16m + lane/4 (+8 for i >= 2), column 16·(tile column c) + 8n + 2(lane%4) + i%2.
template <int kCols, int kM = kPromptM>
using PromptAccOf = float[kM][kCols][2][4];

template <int kCols, int kM>
__device__ __forceinline__ void zero_accumulators(PromptAccOf<kCols, kM>& acc) {
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[m][c][n][i] = 0.f;
}

// One warp's share of a group, the loop both forms had first: each tile decoded after the barrier
// that waits on the slab's inputs, beside the previous tile's products; ring words two slabs
// ahead. Column c is read against input operand c when there are two (gate and up), or both
// against the one; a null ring[1] (the block's second half past the layer's columns) is skipped.
//
// It stays the loop of one tile column a warp (the narrow and deep forms): there prompt_matmul_lean's
// shape, or both tiles decoded first, or a slab's tiles decoded a pass ahead beside the products,
// were each 5-30% slower where one block holds an SM (tf-bench --prompt-linears,
// docs/measurements.md 2026-12-06), though each cut the loop's instructions by a fifth. And of two
// columns on sm_8x, where prompt_matmul_lean spills the slim down kernels at their 80 registers.
template <int K, int CB, int kOps, int kCols, int kM>
__device__ __forceinline__ void prompt_matmul_interleaved(const uint32_t* const (&ring)[kCols], size_t row_stride, const RotatedPlanes& in,
                                                          int first, int rows, int slab_begin, int slab_end, half* stage, PromptAccOf<kCols, kM>& acc) {
    constexpr int kStageRows = 16 * kM;
    constexpr int kRingWords = 8 * K;
    const int lane = threadIdx.x % 32;
    const int slabs = slab_end;  // the block's slabs of kPromptSlab channels: slab_begin .. slab_end - 1
    const LaneWindow<K> window(lane);
    const bool second = kCols == 2 && ring[kCols - 1] != nullptr;
    const auto stage_at = [&](int s, int op, int part, int row, int k) {
        return stage + (((s * kOps + op) * 2 + part) * kStageRows + row) * kSlabPitch + k;
    };
    const auto issue = [&](int slab) {
        const int row = threadIdx.x / 4;  // 256 threads: 64 rows x 4 chunks of 8 halves
        const int chunk = threadIdx.x % 4;
        const bool valid = row < rows;
        if (kStageRows == kPromptRows || row < kStageRows)
#pragma unroll
        for (int op = 0; op < kOps; ++op)
#pragma unroll
            for (int part = 0; part < 2; ++part) {
                const half* source = in.plane(op, part) + static_cast<size_t>(first + (valid ? row : 0)) * in.k_p + slab * kPromptSlab + chunk * 8;
                copy16_async(stage_at(slab & 1, op, part, row, chunk * 8), source, valid);
            }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    // Ring pointers stepped a slab at a time (a 64-bit row · stride product per load cost ~8
    // instructions).
    const uint32_t* next_ring[kCols];
    const size_t skip = static_cast<size_t>(slab_begin) * 2 * row_stride;
    next_ring[0] = ring[0] + skip + lane;
    if constexpr (kCols == 2) next_ring[1] = (second ? ring[1] : ring[0]) + skip + lane;
    const bool has_word = lane < kRingWords;
    const auto load_words = [&](int slab, uint32_t (&words)[2][kCols]) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int c = 0; c < kCols; ++c) {
                const bool live = slab < slabs && has_word && (c == 0 || second);
                words[t][c] = live ? __ldg(next_ring[c] + t * row_stride) : 0u;
            }
#pragma unroll
        for (int c = 0; c < kCols; ++c) next_ring[c] += 2 * row_stride;
    };

    zero_accumulators<kCols, kM>(acc);

    // Ring words two stages ahead (registers), inputs one stage ahead (cp.async).
    uint32_t now[2][kCols], next[2][kCols], later[2][kCols];
    load_words(slab_begin, now);
    load_words(slab_begin + 1, next);
    issue(slab_begin);
    const int a_row = (lane % 8) + 8 * ((lane / 8) % 2);
    const int a_k = 8 * (lane / 16);
    for (int slab = slab_begin; slab < slabs; ++slab) {
        load_words(slab + 2, later);
        if (slab + 1 < slabs) issue(slab + 1);
        else asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 1;\n" ::);
        __syncthreads();
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            uint32_t b[kCols][2][2];
#pragma unroll
            for (int c = 0; c < kCols; ++c) {
                half w[8];
                if (c == 0 || second) decode_lane<K, CB>(now[t][c], 0u, window, w);
                else
#pragma unroll
                    for (int e = 0; e < 8; ++e) w[e] = __ushort_as_half(0);
                b[c][0][0] = pack_halves(w[0], w[1]);
                b[c][0][1] = pack_halves(w[2], w[3]);
                b[c][1][0] = pack_halves(w[4], w[5]);
                b[c][1][1] = pack_halves(w[6], w[7]);
            }
#pragma unroll
            for (int m = 0; m < kM; ++m) {
                if (16 * m >= rows) break;
                uint32_t a[kOps][2][4];
#pragma unroll
                for (int op = 0; op < kOps; ++op)
#pragma unroll
                    for (int part = 0; part < 2; ++part) ldmatrix_x4(a[op][part], stage_at(slab & 1, op, part, 16 * m + a_row, 16 * t + a_k));
#pragma unroll
                for (int c = 0; c < kCols; ++c) {
                    const int op = kOps == 2 ? c : 0;
#pragma unroll
                    for (int n = 0; n < 2; ++n) {
                        mma_16816(acc[m][c][n], a[op][0], b[c][n]);
                        mma_16816(acc[m][c][n], a[op][1], b[c][n]);
                    }
                }
            }
        }
        __syncthreads();  // the stage is refilled next
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int c = 0; c < kCols; ++c) {
                now[t][c] = next[t][c];
                next[t][c] = later[t][c];
            }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
}

// The same share over two tile columns, `ring[0]` and `ring[1]` (null: the block's second half is
// past the layer's columns), the same chains in the same order as prompt_matmul_interleaved's.
//
// This loop is bound by issuing the decode (docs/measurements.md, 2026-12-06), so what is not the
// decode or the products is kept out of it: a null second column decodes the first again (its
// outputs are dropped by the caller) rather than branching around a shuffle; the copies' addresses
// step by a constant; two slabs a trip, so the ring words' registers and the stages alternate at
// compile time; and a slab's first two tiles are decoded before the barrier that waits on its
// inputs, the other two beside the first two's products.
template <int K, int CB, int kOps, int kM>
__device__ __forceinline__ void prompt_matmul_lean(const uint32_t* const (&ring)[2], size_t row_stride, const RotatedPlanes& in, int first,
                                                   int rows, int slab_begin, int slab_end, half* stage, PromptAccOf<2, kM>& acc) {
    constexpr int kCols = 2;
    constexpr int kStageRows = 16 * kM;
    constexpr int kRingWords = 8 * K;
    constexpr int kPlaneBytes = kStageRows * kSlabPitch * 2;  // one (op, part) plane of a stage
    constexpr int kStageBytes = kOps * 2 * kPlaneBytes;
    const int lane = threadIdx.x % 32;
    const LaneWindow<K> window(lane);
    const uint32_t stage_base = shared_address(stage);

    // The copies: thread (row, chunk) moves 16 bytes of each (op, part) plane a slab (256 threads:
    // 64 rows x 4 chunks of 8 halves); rows past the group read as zeros from the group's first.
    const int copy_row = threadIdx.x / 4;
    const int copy_chunk = threadIdx.x % 4;
    const bool copies = kStageRows == kPromptRows || copy_row < kStageRows;
    const int copy_bytes = copy_row < rows ? 16 : 0;
    const size_t plane_halves = static_cast<size_t>(in.slots) * in.k_p;
    const half* copy_from = in.base + static_cast<size_t>(first + (copy_row < rows ? copy_row : 0)) * in.k_p +
                            static_cast<size_t>(slab_begin) * kPromptSlab + copy_chunk * 8;
    const uint32_t copy_to = stage_base + (copy_row * kSlabPitch + copy_chunk * 8) * 2;
    // Stage s of slab_begin + j is j % 2: a buffer's choice only, the same products either way.
    const auto issue = [&](int s) {
        if (copies)
#pragma unroll
            for (int plane = 0; plane < 2 * kOps; ++plane)
                copy16_async_to(copy_to + s * kStageBytes + plane * kPlaneBytes, copy_from + plane * plane_halves, copy_bytes);
        asm volatile("cp.async.commit_group;\n" ::);
        copy_from += kPromptSlab;
    };

    // Ring words: column 1 reads column 0's when null. Pointers stepped a slab at a time (a 64-bit
    // row · stride product per load cost ~8 instructions).
    const uint32_t* next_ring[kCols];
    const size_t skip = static_cast<size_t>(slab_begin) * 2 * row_stride;
    next_ring[0] = ring[0] + skip + lane;
    next_ring[1] = (ring[1] != nullptr ? ring[1] : ring[0]) + skip + lane;
    const bool has_word = lane < kRingWords;
    const auto load_words = [&](int slab, uint32_t (&words)[2][kCols]) {
        const bool live = slab < slab_end && has_word;
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int c = 0; c < kCols; ++c) words[t][c] = live ? __ldg(next_ring[c] + t * row_stride) : 0u;
#pragma unroll
        for (int c = 0; c < kCols; ++c) next_ring[c] += 2 * row_stride;
    };

    zero_accumulators<kCols, kM>(acc);

    const int a_row = (lane % 8) + 8 * ((lane / 8) % 2);
    const int a_k = 8 * (lane / 16);
    const uint32_t a_base = stage_base + (a_row * kSlabPitch + a_k) * 2;

    using Tiles = uint32_t[kCols][2][2];  // a tile row's B fragments, one per tile column
    const auto decode = [&](const uint32_t (&words)[2][kCols], int t, Tiles& b) {
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
            half w[8];
            decode_lane<K, CB>(words[t][c], 0u, window, w);
            b[c][0][0] = pack_halves(w[0], w[1]);
            b[c][0][1] = pack_halves(w[2], w[3]);
            b[c][1][0] = pack_halves(w[4], w[5]);
            b[c][1][1] = pack_halves(w[6], w[7]);
        }
    };
    const auto products = [&](auto stage_tag, int t, const Tiles& b) {
        constexpr int kStage = decltype(stage_tag)::value;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
            if (16 * m >= rows) break;
            uint32_t a[kOps][2][4];
#pragma unroll
            for (int op = 0; op < kOps; ++op)
#pragma unroll
                for (int part = 0; part < 2; ++part)
                    ldmatrix_x4_at(a[op][part], a_base + kStage * kStageBytes + (op * 2 + part) * kPlaneBytes + (16 * m * kSlabPitch + 16 * t) * 2);
#pragma unroll
            for (int c = 0; c < kCols; ++c) {
                const int op = kOps == 2 ? c : 0;
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    mma_16816(acc[m][c][n], a[op][0], b[c][n]);
                    mma_16816(acc[m][c][n], a[op][1], b[c][n]);
                }
            }
        }
    };
    const auto next_inputs = [&](int slab, int s) {
        if (slab + 1 < slab_end) issue(s);
        else asm volatile("cp.async.commit_group;\n" ::);
    };
    const auto await_inputs = [&]() {
        asm volatile("cp.async.wait_group 1;\n" ::);
        __syncthreads();
    };

    // One slab from stage kStage with its ring words in `words`, which then take slab + 2's.
    // t = 0's two tiles are decoded before the wait (the decode needs no shared memory); t =
    // 1's beside t = 0's products (all four first spilled the slim kernels at 80 registers).
    const auto slab_pass = [&](auto stage_tag, int slab, uint32_t (&words)[2][kCols]) {
        next_inputs(slab, 1 - decltype(stage_tag)::value);
        Tiles b;
        decode(words, 0, b);
        await_inputs();
        products(stage_tag, 0, b);
        decode(words, 1, b);
        load_words(slab + 2, words);
        products(stage_tag, 1, b);
        __syncthreads();  // the stage is refilled next
    };
    // Two arrays, not one of two (that spilled the slim down kernels at their 80 registers).
    uint32_t even[2][kCols], odd[2][kCols];
    load_words(slab_begin, even);
    load_words(slab_begin + 1, odd);
    issue(0);
    for (int slab = slab_begin; slab < slab_end; slab += 2) {
        slab_pass(std::integral_constant<int, 0>{}, slab, even);
        if (slab + 1 >= slab_end) break;
        slab_pass(std::integral_constant<int, 1>{}, slab + 1, odd);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
}

// One warp's share of a group: kCols (1 or 2) tile columns. Every output is the same chain in the
// same order (k ascending, hi then lo per tile) in either loop and whatever kM (rows <= 16·kM), so
// every form gives the same bits.
template <int K, int CB, int kOps, int kCols = 2, int kM = kPromptM>
__device__ __forceinline__ void prompt_matmul(const uint32_t* const (&ring)[kCols], size_t row_stride, const RotatedPlanes& in, int first,
                                              int rows, int slab_begin, int slab_end, half* stage, PromptAccOf<kCols, kM>& acc) {
    static_assert(K >= 1 && K <= 4, "one ring word per lane");
    static_assert(kCols == 1 || kCols == 2, "one or two tile columns a warp");
    static_assert(kM >= 1 && kM <= kPromptM, "up to 64 rows a group");
#if __CUDA_ARCH__ >= 900
    constexpr bool kLean = kCols == 2;
#else
    constexpr bool kLean = false;
#endif
    if constexpr (kLean) prompt_matmul_lean<K, CB, kOps, kM>(ring, row_stride, in, first, rows, slab_begin, slab_end, stage, acc);
    else prompt_matmul_interleaved<K, CB, kOps, kCols, kM>(ring, row_stride, in, first, rows, slab_begin, slab_end, stage, acc);
}

// Stages rows R·pass .. R·pass + R - 1 (R = epilogue_rows(kM)) of the accumulators as
// out[c][row][column] (column = 16·warp + 8n + ...), for the epilogue's row-wise 128-point
// rotations. The caller syncs around it.
template <int kCols, int kM>
__device__ __forceinline__ void stage_accumulators(const PromptAccOf<kCols, kM>& acc, int pass, float* out) {
    constexpr int kRows = epilogue_rows(kM);
    constexpr int kPassM = kRows / 16;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        if (m / kPassM != pass) continue;
#pragma unroll
        for (int c = 0; c < kCols; ++c)
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = (m % kPassM) * 16 + lane / 4 + 8 * (i / 2);
                    const int column = 16 * warp + 8 * n + 2 * (lane % 4) + i % 2;
                    out[(c * kRows + row) * kEpiloguePitch + column] = acc[m][c][n][i];
                }
    }
}

}  // namespace tf
