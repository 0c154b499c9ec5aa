// The slim prompt kernels' loop (groups of up to 32 rows, two tile columns a warp) on Hopper's
// warpgroup products, wgmma (sm_90a): the decoded weights are the A operand from registers (a
// lane's eight weights of a tile are, reordered, its A fragment of the tile's transpose), the
// rotated inputs the B operand read by the tensor cores straight from the shared stages, and the
// products run beside the next tiles' decode instead of in the warp's own issue slots (mma.sync:
// 16 HMMA and 8 ldmatrix a slab step of the slim gu kernel). The one-column forms (narrow, deep)
// on this loop were slower (deep3 100.4 -> 104.4 us a launch in an Air-12l chunk on an H100), and
// two columns of 64 rows spill at two blocks an SM: both stay on prompt_matmul
// (docs/measurements.md, 2026-12-07, the twenty-fourth session).
//
// Each output is the same chain as prompt_matmul's: per 16-channel step, hi·w then lo·w into its f32
// accumulator, k ascending. A wgmma step rounds as an mma.sync step does (the session's probe: 2048
// of 2048 outputs of a 4096-deep chain equal on an H100), so the slim and full forms keep the
// same bits.
//
// Warpgroup g (warps 4g..4g+3) multiplies the four tile columns of its warps: D is 64 output
// columns x N rows (N = 16 or 32, the group's rows rounded up), warp w's D rows its own tile
// column. The accumulators keep prompt_matmul's array, PromptAccOf<2, 2>, with n8 tile j of column
// c's D in acc[j / 2][c][j % 2]; stage_accumulators_wgmma writes them out for the epilogue. The
// double-buffered A fragments take the kernels to 124 registers, two blocks an SM (three
// serialized the products for want of registers).
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "exl3_prompt.cuh"

namespace tf {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool kPromptWgmma = true;
#else
constexpr bool kPromptWgmma = false;
#endif

// A stage's plane: 32 rows x kPromptSlab channels as 8x8 core matrices (16-byte rows),
// channel-adjacent ones 128 bytes apart, row-adjacent ones 512.
constexpr int kWgPlaneBytes = 32 * kPromptSlab * 2;
constexpr int kWgCoreK = 128;
constexpr int kWgCoreN = 512;

// The shared-memory matrix descriptor of a no-swizzle K-major operand at `address`.
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t address) {
    return static_cast<uint64_t>((address >> 4) & 0x3FFF) | static_cast<uint64_t>(kWgCoreK >> 4) << 16 |
           static_cast<uint64_t>(kWgCoreN >> 4) << 32;
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Keeps the compiler from moving the accumulators' reads and writes across the fences and waits.
__device__ __forceinline__ void fence_accumulators(PromptAccOf<2, 2>& acc) {
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(acc[m][c][n][i])::"memory");
}

// Column c's D (n8 tiles 0..kN/8 - 1) += A·B, A from registers, B by descriptor.
template <int kN>
__device__ __forceinline__ void wgmma_step(PromptAccOf<2, 2>& acc, int c, const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (kN == 32) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
            : "+f"(acc[0][c][0][0]), "+f"(acc[0][c][0][1]), "+f"(acc[0][c][0][2]), "+f"(acc[0][c][0][3]), "+f"(acc[0][c][1][0]),
              "+f"(acc[0][c][1][1]), "+f"(acc[0][c][1][2]), "+f"(acc[0][c][1][3]), "+f"(acc[1][c][0][0]), "+f"(acc[1][c][0][1]),
              "+f"(acc[1][c][0][2]), "+f"(acc[1][c][0][3]), "+f"(acc[1][c][1][0]), "+f"(acc[1][c][1][1]), "+f"(acc[1][c][1][2]),
              "+f"(acc[1][c][1][3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    } else {
        static_assert(kN == 16, "n16 or n32");
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
            "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
            : "+f"(acc[0][c][0][0]), "+f"(acc[0][c][0][1]), "+f"(acc[0][c][0][2]), "+f"(acc[0][c][0][3]), "+f"(acc[0][c][1][0]),
              "+f"(acc[0][c][1][1]), "+f"(acc[0][c][1][2]), "+f"(acc[0][c][1][3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
    }
#endif
}
// The loop for groups of up to kN rows: prompt_matmul_lean's shares (two tile columns a warp,
// column c against input operand c when kOps == 2), ring words two slabs ahead, inputs one.
template <int K, int CB, int kOps, int kN>
__device__ __forceinline__ void prompt_matmul_wgmma_n(const uint32_t* const (&ring)[2], size_t row_stride, const RotatedPlanes& in, int first,
                                                      int rows, int slab_begin, int slab_end, half* stage, PromptAccOf<2, 2>& acc) {
    constexpr int kCols = 2;
    constexpr int kRingWords = 8 * K;
    constexpr int kStageBytes = kOps * 2 * kWgPlaneBytes;
    const int lane = threadIdx.x % 32;
    const LaneWindow<K> window(lane);
    const uint32_t stage_base = shared_address(stage);

    // The copies: thread (row, chunk) < (kN, 4) moves 16 bytes of each (op, part) plane a slab into
    // its core matrix; rows past the group are zeros.
    const int copy_row = threadIdx.x / 4;
    const int copy_chunk = threadIdx.x % 4;
    const bool copies = copy_row < kN;
    const int copy_bytes = copy_row < rows ? 16 : 0;
    const size_t plane_halves = static_cast<size_t>(in.slots) * in.k_p;
    const half* copy_from = in.base + static_cast<size_t>(first + (copy_row < rows ? copy_row : 0)) * in.k_p +
                            static_cast<size_t>(slab_begin) * kPromptSlab + copy_chunk * 8;
    const uint32_t copy_to = stage_base + (copy_row / 8) * kWgCoreN + copy_chunk * kWgCoreK + (copy_row % 8) * 16;
    const auto issue = [&](int s) {
        if (copies)
#pragma unroll
            for (int plane = 0; plane < 2 * kOps; ++plane)
                copy16_async_to(copy_to + s * kStageBytes + plane * kWgPlaneBytes, copy_from + plane * plane_halves, copy_bytes);
        asm volatile("cp.async.commit_group;\n" ::);
        copy_from += kPromptSlab;
    };

    // Ring words: a null second column reads the first's (its outputs are dropped by the caller).
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

    zero_accumulators<kCols, 2>(acc);

    // A tile's eight weights in B-fragment order (w0 w1 | w2 w3 at k + 8 | w4 w5 at column + 8 |
    // w6 w7 both) as the A fragment of its transpose: rows (columns) then k.
    using Tiles = uint32_t[kCols][4];
    const auto decode = [&](const uint32_t (&words)[2][kCols], int t, Tiles& a) {
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
            half w[8];
            decode_lane<K, CB>(words[t][c], 0u, window, w);
            a[c][0] = pack_halves(w[0], w[1]);
            a[c][1] = pack_halves(w[4], w[5]);
            a[c][2] = pack_halves(w[2], w[3]);
            a[c][3] = pack_halves(w[6], w[7]);
        }
    };
    const auto products = [&](int s, int t, const Tiles& a) {
        fence_accumulators(acc);
        wgmma_fence();
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
            const int op = kOps == 2 ? c : 0;
#pragma unroll
            for (int part = 0; part < 2; ++part)
                wgmma_step<kN>(acc, c, a[c], wgmma_descriptor(stage_base + s * kStageBytes + (op * 2 + part) * kWgPlaneBytes + t * 2 * kWgCoreK));
        }
        wgmma_commit();
        fence_accumulators(acc);
    };

    uint32_t even[2][kCols], odd[2][kCols];
    load_words(slab_begin, even);
    load_words(slab_begin + 1, odd);
    issue(0);
    // One slab from stage s: its first tiles decoded while the last slab's products finish; then,
    // with every warpgroup past them and this slab's inputs landed (one barrier), the next slab's
    // copies into the other stage, and the products beside the second tiles' decode.
    const auto slab_pass = [&](auto stage_tag, int slab, uint32_t (&words)[2][kCols]) {
        constexpr int s = decltype(stage_tag)::value;
        Tiles a0, a1;
        decode(words, 0, a0);
        wgmma_wait<0>();
        fence_accumulators(acc);
        asm volatile("cp.async.wait_group 0;\n" ::);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (slab + 1 < slab_end) issue(1 - s);
        products(s, 0, a0);
        decode(words, 1, a1);
        load_words(slab + 2, words);
        products(s, 1, a1);
    };
    for (int slab = slab_begin; slab < slab_end; slab += 2) {
        slab_pass(std::integral_constant<int, 0>{}, slab, even);
        if (slab + 1 >= slab_end) break;
        slab_pass(std::integral_constant<int, 1>{}, slab + 1, odd);
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
    __syncthreads();  // the stages become the epilogue's staging
}

// The group's rows rounded up to 16 pick the products' n, so a group of up to 16 rows pays for 16.
template <int K, int CB, int kOps>
__device__ __forceinline__ void prompt_matmul_wgmma(const uint32_t* const (&ring)[2], size_t row_stride, const RotatedPlanes& in, int first,
                                                    int rows, int slab_begin, int slab_end, half* stage, PromptAccOf<2, 2>& acc) {
    if (rows <= 16) prompt_matmul_wgmma_n<K, CB, kOps, 16>(ring, row_stride, in, first, rows, slab_begin, slab_end, stage, acc);
    else prompt_matmul_wgmma_n<K, CB, kOps, 32>(ring, row_stride, in, first, rows, slab_begin, slab_end, stage, acc);
}

// stage_accumulators for the wgmma loop's D: rows 16·pass .. 16·pass + 15 (n8 tiles 2·pass and
// 2·pass + 1) as out[c][row][column]; acc[m][c][n][i] is row 16m + 8n + 2(lane%4) + i%2 of column
// 16·warp + lane/4 + 8(i/2).
__device__ __forceinline__ void stage_accumulators_wgmma(const PromptAccOf<2, 2>& acc, int pass, float* out) {
    constexpr int kRows = epilogue_rows(2);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        if (m != pass) continue;
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int n = 0; n < 2; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = 8 * n + 2 * (lane % 4) + i % 2;
                    const int column = 16 * warp + lane / 4 + 8 * (i / 2);
                    out[(c * kRows + row) * kEpiloguePitch + column] = acc[m][c][n][i];
                }
    }
}

}  // namespace tf
