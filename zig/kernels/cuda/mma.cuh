// The tensor-core primitives of the prompt kernels (exl3_prompt.cuh) and the prompt attention
// (attention_prompt.cuh): mma.sync m16n8k16 with f16 inputs and f32 accumulation, ldmatrix,
// cp.async, and the split of an f32 into f16 high and low parts (x = hi + lo to ~22 bits), which
// is how f32 operands ride on f16 tensor cores. sm_80 and later.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

namespace tf {

__device__ __forceinline__ void split_half(float v, half& hi, half& lo) {
    hi = __float2half_rn(v);
    lo = __float2half_rn(v - __half2float(hi));
}

// Two f32 values as packed f16 pairs: high parts in `hi`, low parts in `lo` (split_half's bits,
// with the paired conversions).
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
    const __half2 high = __floats2half2_rn(x, y);
    const float2 back = __half22float2(high);
    const __half2 low = __floats2half2_rn(x - back.x, y - back.y);
    hi = *reinterpret_cast<const uint32_t*>(&high);
    lo = *reinterpret_cast<const uint32_t*>(&low);
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void copy16_async(void* shared, const void* global, bool valid) {
    // src-size 0 fills the 16 bytes with zeros: rows past the group read as zero.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a·b for f32 operands split into f16 high and low parts: ah·bh + ah·bl + al·bh (al·bl is
// below f32's rounding). `b` holds two n8 tiles' fragments as ldmatrix.x4 gives them; tile `n`.
__device__ __forceinline__ void mma_split(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], const uint32_t (&bh)[4],
                                          const uint32_t (&bl)[4], int n) {
    const uint32_t high[2] = {bh[2 * n], bh[2 * n + 1]};
    const uint32_t low[2] = {bl[2 * n], bl[2 * n + 1]};
    mma_16816(d, ah, high);
    mma_16816(d, ah, low);
    mma_16816(d, al, high);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], const half* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(shared_address(p)));
}

// The transposed load: lane (g, t) of matrix i gets elements (2t, g) and (2t + 1, g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&a)[4], const half* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(shared_address(p)));
}

__device__ __forceinline__ uint32_t pack_halves(half low, half high) {
    return static_cast<uint32_t>(__half_as_ushort(low)) | (static_cast<uint32_t>(__half_as_ushort(high)) << 16);
}

}  // namespace tf
