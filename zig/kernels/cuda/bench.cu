// Ceiling kernels for tf-bench (zig/tools/tf_bench.zig): the mma.sync rate of this GPU, so that a
// benchmark table can say how far a kernel is from the tensor cores, not only from DRAM.
#include <stdint.h>
#include "grid_dependency.cuh"

namespace {

constexpr int kChains = 8;  // independent accumulators per warp: enough to hide the mma latency

template <bool kBf16>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    if constexpr (kBf16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

template <bool kBf16>
__device__ void mma_loop(float* out, int iterations) {
    // Operands from the thread index: not constants, so the compiler cannot fold the work away.
    const uint32_t seed = 0x3C003C00u ^ (threadIdx.x * 0x00010001u & 0x00FF00FFu);
    const uint32_t a[4] = {seed, seed ^ 1u, seed ^ 2u, seed ^ 3u};
    const uint32_t b[2] = {seed ^ 4u, seed ^ 5u};
    float c[kChains][4] = {};
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int j = 0; j < kChains; ++j) mma<kBf16>(c[j], a, b);
    }
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kChains; ++j) sum += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

}  // namespace

// Each warp runs iterations × 8 mma.m16n8k16 (4096 flops each). out: one float per thread.
extern "C" __global__ void __launch_bounds__(256) tf_bench_mma_f16(float* out, int iterations) {
    tf_wait_prior_grid(); mma_loop<false>(out, iterations); }
extern "C" __global__ void __launch_bounds__(256) tf_bench_mma_bf16(float* out, int iterations) {
    tf_wait_prior_grid(); mma_loop<true>(out, iterations); }
