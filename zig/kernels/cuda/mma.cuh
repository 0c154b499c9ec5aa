// The tensor-core primitives of the prompt kernels (exl3_prompt.cuh) and the prompt attention
// (attention_prompt.cuh): mma.sync m16n8k16 with f16 inputs and f32 accumulation, ldmatrix,
// cp.async, and the split of an f32 into f16 high and low parts (x = hi + lo to ~22 bits), which
// is how f32 operands ride on f16 tensor cores. sm_80 and later.
#pragma once
#include <cuda_fp16.h>
#include <math.h>
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

// Two n8 tiles of C fragments (positions 0..7 and 8..15 of a k step) as the A fragment of the
// next product, split into f16 high and low parts: how the attentions feed P into O += P·V.
__device__ __forceinline__ void split_fragment(const float (&c0)[4], const float (&c1)[4], uint32_t (&hi)[4], uint32_t (&lo)[4]) {
    split_pair(c0[0], c0[1], hi[0], lo[0]);
    split_pair(c0[2], c0[3], hi[1], lo[1]);
    split_pair(c1[0], c1[1], hi[2], lo[2]);
    split_pair(c1[2], c1[3], hi[3], lo[3]);
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to a shared address already converted; `bytes` 16, or 0 for zeros (src-size
// 0 fills the 16 bytes with zeros: rows past the group read as zero).
__device__ __forceinline__ void copy16_async_to(uint32_t shared, const void* global, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global), "r"(bytes));
}

__device__ __forceinline__ void copy16_async(void* shared, const void* global, bool valid) {
    copy16_async_to(shared_address(shared), global, valid ? 16 : 0);
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

// d += (ah + al)·b: an f32 A operand split in two, an exact f16 B operand (an f16 or fp8 cache).
__device__ __forceinline__ void mma_exact_b(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], const uint32_t (&b)[2]) {
    mma_16816(d, ah, b);
    mma_16816(d, al, b);
}

// Over any 16-bit-paired bytes: f16 rows, or fp8 codes taken two at a time (attention_heads.cuh).
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&a)[4], uint32_t shared) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(shared));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], const void* p) { ldmatrix_x4_at(a, shared_address(p)); }

// Two matrices: lanes 0-7 give matrix 0's rows, lanes 8-15 matrix 1's (the others' addresses unused).
__device__ __forceinline__ void ldmatrix_x2_at(uint32_t (&a)[2], uint32_t shared) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(a[0]), "=r"(a[1]) : "r"(shared));
}

// The transposed load: lane (g, t) of matrix i gets elements (2t, g) and (2t + 1, g).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&a)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(shared_address(p)));
}

// O's two n8 tiles of 16 dims from `dim0` += P·V, V an f16 plane of 16 positions whose rows are
// `pitch` bytes apart: ldmatrix.trans gives lane (g, t) positions 2t, 2t + 1 (+8) of dim g (+8),
// the B fragments of both tiles; P in f16 high and low parts.
__device__ __forceinline__ void mma_pv_f16(float (&o0)[4], float (&o1)[4], const uint32_t (&ph)[4], const uint32_t (&pl)[4],
                                           const unsigned char* plane, int pitch, int dim0, int lane) {
    const int position = lane % 8 + 8 * ((lane / 8) % 2);
    const int dim = dim0 + 8 * (lane / 16);
    uint32_t vf[4];
    ldmatrix_x4_trans(vf, plane + position * pitch + 2 * dim);
    const uint32_t b0[2] = {vf[0], vf[1]};
    const uint32_t b1[2] = {vf[2], vf[3]};
    mma_exact_b(o0, ph, pl, b0);
    mma_exact_b(o1, ph, pl, b1);
}

__device__ __forceinline__ uint32_t pack_halves(half low, half high) {
    return static_cast<uint32_t>(__half_as_ushort(low)) | (static_cast<uint32_t>(__half_as_ushort(high)) << 16);
}

// A row's max and sum over the quad of lanes (lane / 4 the same) that holds its C fragment entries.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    return v + __shfl_xor_sync(0xFFFFFFFFu, v, 2);
}

// The online softmax of a tile of scores held as C fragments, N tiles of 8 columns: entries (n,
// 0..1) are row a's, (n, 2..3) row b's, and a quad of lanes holds a row. Masked entries are -inf;
// a row's first tile has a finite one. Advances the rows' running max and this lane's part of their
// sums (the quad's parts are added at the end), turns the scores into exp(s - max), and rescales
// the accumulators `o` (M tiles of the same rows) to the new max. The warp's 32 lanes all call it.
// Used by the prompt attention and the MLA attention alike, so both fold a tile with the same
// operations.
template <int N, int M, bool kSkipSettled = false>
__device__ __forceinline__ void online_softmax(float (&s)[N][4], float (&o)[M][4], float& max_a, float& max_b, float& sum_a, float& sum_b) {
    float tile_a = -INFINITY, tile_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            tile_a = fmaxf(tile_a, s[n][e]);
            tile_b = fmaxf(tile_b, s[n][2 + e]);
        }
    const float next_a = fmaxf(max_a, quad_max(tile_a));
    const float next_b = fmaxf(max_b, quad_max(tile_b));
    const float rescale_a = expf(max_a - next_a);  // 0 on the first tile, 1 where nothing is new
    const float rescale_b = expf(max_b - next_b);
    max_a = next_a;
    max_b = next_b;
    float part_a = 0.f, part_b = 0.f;
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            s[n][e] = expf(s[n][e] - next_a);
            s[n][2 + e] = expf(s[n][2 + e] - next_b);
            part_a += s[n][e];
            part_b += s[n][2 + e];
        }
    sum_a = sum_a * rescale_a + part_a;
    sum_b = sum_b * rescale_b + part_b;
    // kSkipSettled: once the rows' max settles the rescale is 1 for every lane, and skipping it
    // leaves the same bits (the decode attention's long rows; a vote the others need not pay).
    if (kSkipSettled && !__any_sync(0xFFFFFFFFu, rescale_a != 1.f || rescale_b != 1.f)) return;
#pragma unroll
    for (int n = 0; n < M; ++n) {
        o[n][0] *= rescale_a;
        o[n][1] *= rescale_a;
        o[n][2] *= rescale_b;
        o[n][3] *= rescale_b;
    }
}

}  // namespace tf
