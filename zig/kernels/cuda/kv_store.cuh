// The KV cache's stored dtypes on the GPU (zig/src/core/kv_store.zig is the host's twin and the
// reference for these bytes): f32 as computed; f16 rounded to nearest, saturating at ±65504; fp8
// e4m3 codes with one power-of-two scale 2^e per (page, layer, head, position), e an int8 beside
// the codes, chosen from the position's largest value (fp8.zig's scaleExponent). With e in
// [-15, 7] a code times its scale is an exact f16, so the attention kernels widen fp8 into f16
// tensor-core operands without rounding.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "mma.cuh"

namespace tf {

enum KvDtype : int { kKvF32 = 1, kKvF16 = 2, kKvFp8 = 3 };

// A cached position's page and its offset in pages of `tokens` positions. A power of two (the
// engine's sizes) is found by a shift: the division was a third of the decode attentions' copy
// instructions.
struct PageIndex {
    int tokens;
    int shift;  // log2(tokens), or -1
    __device__ __forceinline__ explicit PageIndex(int page_tokens)
        : tokens(page_tokens), shift((page_tokens & (page_tokens - 1)) == 0 ? __ffs(page_tokens) - 1 : -1) {}
    __device__ __forceinline__ int page(int p) const { return shift >= 0 ? p >> shift : p / tokens; }
    // p's offset, given its page (p >= 0).
    __device__ __forceinline__ int offset(int p, int page_of_p) const { return shift >= 0 ? p & (tokens - 1) : p - page_of_p * tokens; }
    __device__ __forceinline__ int offset(int p) const { return shift >= 0 ? p & (tokens - 1) : p % tokens; }
};

constexpr int kFp8ExponentMin = -15;
constexpr int kFp8ExponentMax = 7;

__device__ __forceinline__ half kv_half(float x) { return __float2half_rn(fminf(fmaxf(x, -65504.f), 65504.f)); }

// The smallest e in [kFp8ExponentMin, kFp8ExponentMax] with amax <= 448 · 2^e, from amax's bits.
__device__ __forceinline__ int fp8_exponent(float amax) {
    const uint32_t magnitude = __float_as_uint(amax) & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) return kFp8ExponentMax;
    const int biased = static_cast<int>(magnitude >> 23);
    if (biased == 0) return kFp8ExponentMin;
    const int e = biased - 127 - 8 + ((magnitude & 0x7fffffu) > 0x600000u ? 1 : 0);
    return min(max(e, kFp8ExponentMin), kFp8ExponentMax);
}

// 2^e as an f32 (exact for the exponents above).
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(static_cast<uint32_t>(127 + e) << 23); }

// x / 2^e as an e4m3 code: nearest, ties to even, saturating at ±448.
__device__ __forceinline__ uint8_t fp8_encode(float x, int e) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x * pow2f(-e), __NV_SATFINITE, __NV_E4M3));
}

// Two codes (low byte first) times 2^e as two exact f16.
__device__ __forceinline__ uint32_t fp8_pair_to_halves(uint16_t codes, __half2 scale) {
    const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
    const __half2 value = __hmul2(*reinterpret_cast<const __half2*>(&raw), scale);
    return *reinterpret_cast<const uint32_t*>(&value);
}

// Two codes (low byte first) as two f16, unscaled (exact: e4m3 is a subset of f16).
__device__ __forceinline__ uint32_t fp8_pair_to_halves(uint16_t codes) {
    const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
    return *reinterpret_cast<const uint32_t*>(&raw);
}

// Eight codes (low byte first) times 2^e as eight exact f16: how the prompt and MLA attentions
// widen a staged row's codes into their f16 planes.
__device__ __forceinline__ uint4 fp8_widen8(uint2 codes, __half2 scale) {
    uint4 wide;
    wide.x = fp8_pair_to_halves(static_cast<uint16_t>(codes.x), scale);
    wide.y = fp8_pair_to_halves(static_cast<uint16_t>(codes.x >> 16), scale);
    wide.z = fp8_pair_to_halves(static_cast<uint16_t>(codes.y), scale);
    wide.w = fp8_pair_to_halves(static_cast<uint16_t>(codes.y >> 16), scale);
    return wide;
}

__device__ __forceinline__ __half2 fp8_scale_pair(int8_t e) {
    const half s = __float2half_rn(pow2f(e));
    return __halves2half2(s, s);
}

// (2^e_low, 2^e_high) as f16 (exact for the exponents above).
__device__ __forceinline__ __half2 fp8_scales(int e_low, int e_high) {
    return __floats2half2_rn(pow2f(e_low), pow2f(e_high));
}

// O += P·V over one 16-position k step of fp8 values: `low_codes` and `high_codes` as ldmatrix.trans
// over code pairs gives them (lane (g, t): positions 2t, 2t + 1, resp. 2t + 8, 2t + 9, at the dim pair
// 2g, 2g + 1), a byte permute pairs the positions per dim, each pair times its positions' scales
// (exact f16); tile `even` takes the pair's first dim, `odd` its second. The decode attentions' V.
__device__ __forceinline__ void mma_fp8_values(float (&even)[4], float (&odd)[4], const uint32_t (&ph)[4], const uint32_t (&pl)[4], uint32_t low_codes,
                                               uint32_t high_codes, __half2 low_scales, __half2 high_scales) {
    const uint32_t low = __byte_perm(low_codes, 0, 0x3120);
    const uint32_t high = __byte_perm(high_codes, 0, 0x3120);
    const uint32_t first[2] = {fp8_pair_to_halves(static_cast<uint16_t>(low), low_scales), fp8_pair_to_halves(static_cast<uint16_t>(high), high_scales)};
    const uint32_t second[2] = {fp8_pair_to_halves(static_cast<uint16_t>(low >> 16), low_scales), fp8_pair_to_halves(static_cast<uint16_t>(high >> 16), high_scales)};
    mma_exact_b(even, ph, pl, first);
    mma_exact_b(odd, ph, pl, second);
}

// Stores one head's `dims` values (a warp, lane-strided) at element `at` of a cache of `dtype`;
// fp8: its exponent at exponents[at / dims].
__device__ __forceinline__ void kv_store_warp(void* cache, int8_t* exponents, int dtype, size_t at, const float* values, int dims, int lane) {
    if (dtype == kKvF32) {
        float* out = static_cast<float*>(cache) + at;
        for (int i = lane; i < dims; i += 32) out[i] = values[i];
    } else if (dtype == kKvF16) {
        half* out = static_cast<half*>(cache) + at;
        for (int i = lane; i < dims; i += 32) out[i] = kv_half(values[i]);
    } else {
        float amax = 0.f;
        for (int i = lane; i < dims; i += 32) amax = fmaxf(amax, fabsf(values[i]));
        for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
        const int e = fp8_exponent(amax);
        uint8_t* out = static_cast<uint8_t*>(cache) + at;
        for (int i = lane; i < dims; i += 32) out[i] = fp8_encode(values[i], e);
        if (lane == 0) exponents[at / dims] = static_cast<int8_t>(e);
    }
}

}  // namespace tf
